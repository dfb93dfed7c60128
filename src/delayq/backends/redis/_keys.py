"""The key layout of a queue (see the package docstring for what each key holds)."""

from __future__ import annotations

from delayq.job import JobState

__all__ = ["DEFAULT_PREFIX", "DEFAULT_QUEUE", "FINISHED_INDEX", "KEY_NAMES", "queue_keys"]

DEFAULT_PREFIX = "delayq"
DEFAULT_QUEUE = "default"

KEY_NAMES = (
    "due",
    "running",
    "dead",
    "seq",
    "token",
    "wake",
    "succeeded",
    "cancelled",
    "skipped",
)
"""The fixed keys every script receives, in KEYS order (see ``_lib.lua``)."""

FINISHED_INDEX = {
    JobState.SUCCEEDED: "succeeded",
    JobState.CANCELLED: "cancelled",
    JobState.SKIPPED: "skipped",
    JobState.DEAD: "dead",
}
"""The index key of each final state."""


def queue_keys(prefix: str, queue: str) -> dict[str, str]:
    """Every fixed key of a queue, by role, plus the job/wake/shadow key prefixes.

    All of them share the hash tag ``{queue}``.
    """
    ns = f"{prefix}:{{{queue}}}:"
    keys = {name: ns + name for name in KEY_NAMES}
    keys["job:"] = ns + "job:"
    keys["wake:"] = ns + "wake:"
    keys["shadow:"] = ns + "shadow:"
    keys["claim:"] = ns + "claim:"
    # flow control (see lua/_flow.lua): limit records and the jobs in the ready stage
    # or parked, which listings read beside the due set
    keys["limits"] = ns + "limits"
    keys["held"] = ns + "held"
    keys["keyed:"] = ns + "keyed:"  # keyed calls: one record per key (lua/keyed.lua)
    keys["workers"] = ns + "workers"  # worker heartbeats: a hash, id -> {"data", "seen"}
    keys["done"] = ns + "done"  # a pub/sub channel: ids of jobs acked with a result
    return keys

"""Keyed calls on Redis: each one script call (``lua/keyed.lua``), atomic across processes.

The script is a port of :func:`delayq.keyed.decide` with the writes the other
stores make for its decision. A key's record is a hash next to the jobs,
``P:{Q}:keyed:<key>`` (the queue's hash tag: one cluster slot), naming the
key's current job; each run's job hash names its key (field ``kkey``), so the
paths that drop a finished job drop its key's record too (see ``key_expires``
in ``lua/_lib.lua``): a record lives while its current job does, and no
longer than that once the key's throttle window has ended.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from delayq.backends._common import check_spec
from delayq.errors import JobConflict
from delayq.job import Job, JobSpec, KeyInfo
from delayq.keyed import KeyedOutcome, KeyedResult, KeyPolicy

if TYPE_CHECKING:
    from delayq.backends.redis._waiting import Wakeups

__all__ = ["RedisKeyed", "key_info"]


def key_info(job: Job, fields: dict[str, str]) -> Job:
    """``job`` with its key's mode and counters when ``get`` found it is its key's
    current run (the ``key.*`` fields of ``get.lua``)."""
    if "key.runs" not in fields or "kkey" not in fields:
        return job
    info = KeyInfo(
        fields["kkey"],
        fields["key.mode"],
        int(fields["key.runs"]),
        float(fields["key.first_at"]),
        int(fields["key.extended"]),
        int(fields["key.items"]),
        int(fields["key.calls"]),
    )
    return replace(job, keyed=info)


def _policy_args(policy: KeyPolicy) -> list[Any]:
    """ARGV[15..19] of ``keyed.lua``: mode, description, its number, flag, reject."""
    if policy.mode == "debounce":
        number, flag = policy.max_wait, ""
    elif policy.mode == "throttle":
        number, flag = policy.window, "1" if policy.trailing else ""
    elif policy.mode == "append":
        number, flag = policy.max_items, ""
    elif isinstance(policy.unique, str):
        number, flag = 0, policy.unique
    else:
        number, flag = policy.unique, "seconds"
    assert number is not None
    return [policy.mode, policy.describe(), repr(number), flag, "1" if policy.reject else ""]


class RedisKeyed:
    """Mixin for :class:`~delayq.backends.redis.RedisBackend`: ``enqueue_keyed``."""

    if TYPE_CHECKING:
        _keys: dict[str, str]
        _wakes: Wakeups

        def _write(self, name: str, args: Sequence[Any], *, keys: Sequence[str] = ()) -> Any: ...

    def enqueue_keyed(self, spec: JobSpec, policy: KeyPolicy) -> KeyedResult:
        """One keyed call (``spec.id`` is the key), decided and stored by one script."""
        spec = check_spec(spec)
        when = repr(float(spec.run_at)) if spec.delay is None else f"+{float(spec.delay)!r}"
        args = [
            spec.id,
            spec.payload,
            when,
            spec.name,
            spec.max_attempts,
            json.dumps(spec.backoff, separators=(",", ":")),
            spec.misfire,
            spec.key or "",
            str(spec.priority),
            spec.group or "",
            *_policy_args(policy),
        ]
        reply = self._write("keyed", args, keys=[self._keys["keyed:"] + spec.id])
        if reply[0] == "conflict":
            _, kind, job_id, state = reply
            if kind == "held":
                raise JobConflict(
                    f"key {spec.id!r} is held by job {job_id!r} (unique={policy.unique!r}, {state})"
                )
            raise JobConflict(f"job {job_id!r} exists ({state}) and is not a run of its key")
        self._wakes.woke(reply[3])
        return KeyedResult(str(reply[1]), KeyedOutcome(reply[0]), float(reply[2]))

"""The worker's health: what a liveness check reads, and the one rule that judges it.

:class:`WorkerHealth` is read from the worker at one instant
(:meth:`Worker.health_snapshot`); :meth:`WorkerHealth.problems` judges it with
no clock of its own (its ``now`` is in the snapshot), so the rule is tested on
hand-made snapshots. A worker is healthy while its three loops make progress
and its abandoned work is under its cap:

* the dispatcher turns its loop at least every ``idle_wait`` seconds (its
  longest sleep), and none of its claims takes longer than ``lease / 3``;
* the lease keeper renews every held claim every ``lease / 3``: a claim last
  renewed ``2 * lease / 3`` ago (one period late) means the keeper is stuck or
  the store refuses it, and the lease runs out one period later;
* the committer records a decided result within ``lease / 3``;
* fewer handlers than ``max_abandoned`` run on past their timeout (at the cap
  the worker claims nothing);
* the asyncio loop of async handlers has not been blocked for ``lease / 3``.

A store call counts as stuck past ``lease / 3``: that is the bound the worker
keeps its store calls under, so a call older than that will not return in time
to keep a lease.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerHealth"]

_CALLS = {"dispatcher": "claim", "leases": "extend_many", "committer": "complete"}


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """What a health check judges, read at one instant (monotonic seconds).

    ``beats``: the last loop turn of each part (``dispatcher``; ``leases``, which
    only turns while claims are held); ``stuck_calls``: part -> when its store
    call now under way began (``dispatcher``: claim, ``leases``: extend_many,
    ``committer``: complete), a call older than ``lease / 3`` is stuck;
    ``abandoned`` / ``abandoned_cap``: handlers running on past their timeout
    (at the cap the worker claims nothing); ``loop_blocked_since``: the asyncio
    loop of async handlers stopped answering then (None while it answers);
    ``oldest_result_waiting``: when the oldest result waiting for the committer
    was decided (a timed-out attempt's result held until its handler ends is
    abandoned work, not counted here); ``least_recently_renewed``: when the held
    claim renewed longest ago got its lease (None when none is held);
    ``idle_wait``: the dispatcher's longest sleep; ``running``: the worker's
    threads run (started, not finished); ``stopping``: a stop was requested.
    """

    now: float
    lease: float
    in_flight: int
    beats: dict[str, float]
    stuck_calls: dict[str, float]
    abandoned: int
    abandoned_cap: int
    loop_blocked_since: float | None
    oldest_result_waiting: float | None
    least_recently_renewed: float | None = None
    idle_wait: float = 10.0
    running: bool = True
    stopping: bool = False

    @property
    def healthy(self) -> bool:
        """True when :meth:`problems` finds none."""
        return not self.problems()

    def problems(self) -> tuple[str, ...]:
        """Why the worker is unhealthy, one sentence per problem; empty when healthy."""
        if not self.running:
            return ("the worker is not running",)
        found: list[str] = []
        bound = self.lease / 3
        for part, began in sorted(self.stuck_calls.items()):
            if self.now - began > bound:
                found.append(
                    f"{part}: its {_CALLS.get(part, 'store')} call has run for "
                    f"{self.now - began:.1f}s (stuck past lease / 3 = {bound:.1f}s)"
                )
        beat = self.beats.get("dispatcher")
        if (
            beat is not None
            and not self.stopping
            and "dispatcher" not in self.stuck_calls
            and self.now - beat > self.idle_wait + bound
        ):
            found.append(
                f"dispatcher: its loop has not turned for {self.now - beat:.1f}s "
                f"(it turns at least every idle_wait = {self.idle_wait:.1f}s)"
            )
        renewed = self.least_recently_renewed
        if renewed is not None and self.now - renewed > 2 * bound:
            found.append(
                f"lease keeper: a held claim was last renewed {self.now - renewed:.1f}s ago "
                f"(renewals are due every lease / 3 = {bound:.1f}s)"
            )
        waiting = self.oldest_result_waiting
        committing = "committer" in self.stuck_calls
        if waiting is not None and not committing and self.now - waiting > bound:
            found.append(
                f"committer: a finished attempt has waited {self.now - waiting:.1f}s "
                f"to be recorded (more than lease / 3 = {bound:.1f}s)"
            )
        if self.abandoned >= self.abandoned_cap:
            found.append(
                f"{self.abandoned} handler(s) run on past their timeout "
                f"(max_abandoned = {self.abandoned_cap}): claiming has stopped"
            )
        blocked = self.loop_blocked_since
        if blocked is not None and self.now - blocked > bound:
            found.append(
                f"the asyncio loop of async handlers has been blocked for "
                f"{self.now - blocked:.1f}s (a handler blocks it)"
            )
        return tuple(found)

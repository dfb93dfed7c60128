"""A batch of completions as the PostgreSQL store sends it, and the answers it reads back."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from delayq.backends._common import RELEASED_NOTE, clip_error, stale_claim
from delayq.backends.base import Completion
from delayq.errors import StaleClaim
from delayq.job import JobState

__all__ = ["CompletionBatch"]

_FINISH_KIND = {JobState.SUCCEEDED: "succeeded", JobState.SKIPPED: "skipped"}
_RESULT_STATE = {  # the state each kind of completion leaves the job in
    "succeeded": JobState.SUCCEEDED,
    "skipped": JobState.SKIPPED,
    "dead": JobState.DEAD,
    "retry": JobState.SCHEDULED,
    "release": JobState.SCHEDULED,
}

Row = tuple[Any, ...]


class CompletionBatch:
    """A batch of completions as sent: duplicates removed, one array per column."""

    def __init__(self, items: list[Completion]) -> None:
        self.items = items
        # A claim given twice is applied once: later copies are reported stale.
        self.first: dict[tuple[str, int], int] = {}
        for i, item in enumerate(items):
            self.first.setdefault((item.claim.job.id, item.claim.token), i)
        self.chosen = sorted(self.first.values())

    def keys(self) -> set[tuple[str, int]]:
        """The ``(id, token)`` of every claim in the batch."""
        return set(self.first)

    def params(self) -> dict[str, Any]:
        kinds: list[str] = []
        texts: list[str | None] = []
        for i in self.chosen:
            item = self.items[i]
            if item.released:
                kinds.append("release")
                texts.append(RELEASED_NOTE)
            elif item.state is JobState.SCHEDULED:
                kinds.append("retry")
                texts.append(clip_error(item.error))
            elif item.state is JobState.DEAD:
                kinds.append("dead")
                texts.append(clip_error(item.error))
            else:
                kinds.append(_FINISH_KIND[item.state])
                texts.append(item.outcome)
        return {
            "ids": [self.items[i].claim.job.id for i in self.chosen],
            "tokens": [self.items[i].claim.token for i in self.chosen],
            "kinds": kinds,
            "run_ats": [self.items[i].run_at for i in self.chosen],
            "texts": texts,
            "results": [self.items[i].result for i in self.chosen],
        }

    def results(
        self,
        done: list[Row],
        *,
        repeated: Collection[tuple[str, int]] = (),
        deletes_finished: bool = False,
    ) -> tuple[list[StaleClaim | None], float | None]:
        """Each entry's answer, and the earliest due time the batch scheduled.

        ``done`` has one row per entry sent (see ``Statements.complete``): nothing
        is read after the commit, so an answer never fails once it is applied.
        ``repeated``: the ``(id, token)`` of entries sent before by a call whose
        outcome is unknown (a lost reply), so one the row shows as done by this
        claim was done by that call: applied, not stale (with
        ``deletes_finished``, result_ttl 0, a finished entry's row is gone instead).
        """
        sent = {(r[0], r[1]): r for r in done}
        earliest = min((r[2] for r in done if r[4] and r[3] in ("retry", "release")), default=None)
        results: list[StaleClaim | None] = [None] * len(self.items)
        for i, item in enumerate(self.items):
            key = (item.claim.job.id, item.claim.token)
            row = sent.get(key)
            if self.first[key] == i and row is not None and row[4]:
                continue
            state = None if row is None or row[5] is None else JobState(row[5])
            if (
                self.first[key] == i
                and row is not None
                and row[6] == item.claim.token
                and state is _RESULT_STATE.get(row[3])
            ):
                if key in repeated:
                    continue  # done by this call's first attempt
                # This claim's result is what the row holds: a retry of a call whose
                # reply was lost (refused as the contract says, but not "expired").
                results[i] = StaleClaim(
                    f"claim on job {item.claim.job.id!r} (token {item.claim.token}) was "
                    f"already completed: the job is {row[5]} by this claim (a repeated "
                    f"completion, e.g. a retry after a lost reply); nothing changed"
                )
                continue
            if (
                key in repeated
                and deletes_finished
                and self.first[key] == i
                and row is not None
                and row[5] is None
                and row[3] in _FINISH_KIND.values()
            ):
                continue  # finished and deleted by this call's first attempt
            results[i] = stale_claim(item.claim, state, None if row is None else row[6])
        return results, earliest

"""Bulk actions by filter: requeue or purge dead jobs, cancel scheduled ones.

One rule for every front end (dashboard pages, ``/api/bulk``, ``delayq bulk``):
an action first *matches* (a keyset walk of ``list_jobs`` with the filter,
at most :data:`BULK_LIMIT` jobs) and says how many; it runs only when the
caller confirms that very count, so "N jobs match" is what the operator saw
and agreed to. A count that moved in between (new dead letters, a worker
finishing jobs) is refused with the new count, to be confirmed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from delayq.app import DelayQ
from delayq.errors import InvalidOption
from delayq.job import JobState

__all__ = ["ACTIONS", "BULK_LIMIT", "BulkFilter", "CountChanged", "match", "run"]

BULK_LIMIT = 10_000
"""The most jobs one bulk action touches (run it again for more)."""

ACTIONS: dict[str, JobState] = {
    "requeue": JobState.DEAD,
    "purge": JobState.DEAD,
    "cancel": JobState.SCHEDULED,
}
"""Each action and the state of the jobs it applies to."""

_PAGE = 500

log = logging.getLogger("delayq.bulk")


class CountChanged(InvalidOption):
    """The jobs matching the filter are no longer the count that was confirmed."""

    def __init__(self, confirmed: int, matched: int) -> None:
        super().__init__(
            f"{matched} job(s) match now, not the {confirmed} confirmed: confirm {matched}"
        )
        self.matched = matched


@dataclass(frozen=True, slots=True)
class BulkFilter:
    """Which jobs: a handler name (None: any), a due window, and a payload search
    (``list_jobs(payload_contains=, payload_at=)``: stores with ``payload_search``)."""

    name: str | None = None
    due_after: float | None = None
    due_before: float | None = None
    payload_contains: str | None = None
    payload_at: tuple[str, str | int | float | bool] | None = None


def _check(action: str) -> JobState:
    if action not in ACTIONS:
        raise InvalidOption(f"action must be one of {', '.join(ACTIONS)}; got {action!r}")
    return ACTIONS[action]


def match(app: DelayQ, action: str, where: BulkFilter) -> list[str]:
    """Ids of the jobs ``action`` would touch, in due order, :data:`BULK_LIMIT` at most."""
    state = _check(action)
    ids: list[str] = []
    after: tuple[float, str] | None = None
    while len(ids) < BULK_LIMIT:
        want = min(_PAGE, BULK_LIMIT - len(ids))
        page = app.list_jobs(
            state=state,
            name=where.name,
            due_after=where.due_after,
            due_before=where.due_before,
            after=after,
            limit=want,
            preview=1,  # only ids are needed: no payload read whole
            payload_contains=where.payload_contains,
            payload_at=where.payload_at,
        )
        ids += [j.id for j in page]
        if len(page) < want:
            break
        after = (page[-1].run_at, page[-1].id)
    return ids


def run(
    app: DelayQ,
    action: str,
    where: BulkFilter,
    *,
    confirm: int,
    who: str = "",
    advance: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Apply ``action`` to the jobs matching ``where`` if they are ``confirm`` many.

    Returns how many each outcome got (``requeued`` / ``not_dead``, ``cancelled``
    / ``running`` / ...,  ``purged``). Raises :class:`CountChanged` otherwise.
    """
    ids = match(app, action, where)
    if len(ids) != confirm:
        raise CountChanged(confirm, len(ids))
    outcomes: dict[str, int] = {}

    def count(word: str, n: int = 1) -> None:
        outcomes[word] = outcomes.get(word, 0) + n

    if action == "purge":
        for i in range(0, len(ids), _PAGE):
            chunk = ids[i : i + _PAGE]
            count("purged", app.purge_dead(job_ids=chunk))
            if advance is not None:
                advance(len(chunk))
    else:
        for job_id in ids:
            if action == "requeue":
                count("requeued" if app.requeue(job_id) else "not_dead")
            else:
                count(app.cancel(job_id).value)
            if advance is not None:
                advance(1)
    log.info(
        "bulk %s of %d job(s) (name=%s)%s: %s",
        action,
        len(ids),
        where.name or "any",
        f" by {who}" if who else "",
        outcomes,
    )
    return outcomes

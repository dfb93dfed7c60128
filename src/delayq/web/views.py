"""What the pages and the JSON API show, as plain data: no Starlette here.

Both front ends of the dashboard (HTML pages and ``/api``) call these, so a
page and its API twin always agree: the same filters, the same outcome words
as the CLI (``cancelled``, ``running``, ``not_found``, ``requeued``, ...).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayq._present import iso, parse_time, payload_value
from delayq._validate import check_payload_at, check_payload_contains
from delayq.app import DelayQ
from delayq.backoff import parse_duration
from delayq.errors import InvalidOption
from delayq.job import Job, JobState
from delayq.observe.logs import JOB_FIELD
from delayq.observe.metrics import SeriesPoint
from delayq.recurring import TICK_HANDLER
from delayq.web._rows import PREVIEW_CHARS, RUNNING_SCAN, attention

__all__ = [
    "PAGE_SIZE",
    "JobFilters",
    "list_page",
    "overview",
]

PAGE_SIZE = 50

log = logging.getLogger("delayq.web")


def _logged(action: str, job_id: str, outcome: str) -> str:
    """Log an action's outcome (a JSON line with ``--log-format json``); returns it."""
    log.info(
        "%s %s: %s",
        action,
        job_id,
        outcome,
        extra={JOB_FIELD: {"job_id": job_id, "action": action, "outcome": outcome}},
    )
    return outcome


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def seconds_text(seconds: float | None) -> str:
    """A duration for people: ``3ms``, ``2.5s``, ``1.2h``; ``-`` for none."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "> 1d"
    return _span(seconds)


def _bound(text: str | None, field: str) -> float | None:
    """A due-window bound from a form or query (:func:`~delayq._present.parse_time`),
    None when empty."""
    if text is None or not text.strip():
        return None
    return parse_time(text, field)


def pretty_payload(payload: Any) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)


def pretty_result(text: str | None) -> str | None:
    """A kept result (JSON text) indented like a payload; its raw text if it does not decode."""
    if text is None:
        return None
    try:
        return pretty_payload(json.loads(text))
    except ValueError:
        return text


@dataclass(frozen=True, slots=True)
class JobFilters:
    """The jobs page's filters and its keyset cursor, parsed from a query."""

    state: JobState | None = None
    name: str | None = None
    due_after: float | None = None
    due_before: float | None = None
    after: tuple[float, str] | None = None
    limit: int = PAGE_SIZE
    ticks: bool = False  # show recurring schedules' tick jobs (hidden unless named)
    retrying: bool = False  # state=retrying: scheduled jobs that failed before
    payload_contains: str | None = None  # a substring of the payload's JSON
    payload_at: tuple[str, str | int | float | bool] | None = None  # (path, value)

    def shows(self, job: Job) -> bool:
        """False for a tick job the filters hide (one per occurrence: noise), and
        for a job that never failed when only retrying ones are asked for."""
        if self.retrying and job.attempts == 0:
            return False
        return self.ticks or self.name is not None or job.name != TICK_HANDLER

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> JobFilters:
        state = query.get("state") or None
        retrying = state == "retrying"
        if retrying:
            state = JobState.SCHEDULED.value
        if state is not None:
            try:
                state_value: JobState | None = JobState(state)
            except ValueError:
                known = ", ".join([*(s.value for s in JobState), "retrying"])
                raise InvalidOption(f"state must be one of {known}; got {state!r}") from None
        else:
            state_value = None
        after = None
        if query.get("after_id"):
            run_at = _bound(query.get("after_run_at"), "after_run_at")
            if run_at is None:
                raise InvalidOption("after_id needs after_run_at (the cursor is both)")
            after = (run_at, query["after_id"])
        try:
            limit = int(query.get("limit") or PAGE_SIZE)
        except ValueError:
            raise InvalidOption(f"limit must be an int, got {query.get('limit')!r}") from None
        if not 1 <= limit <= 500:
            raise InvalidOption(f"limit must be between 1 and 500, got {limit}")
        path = (query.get("payload_path") or "").strip()
        at = None
        if path:
            at = (path, payload_value((query.get("payload_value") or "").strip()))
            check_payload_at(at)
        elif (query.get("payload_value") or "").strip():
            raise InvalidOption("payload_value needs payload_path (e.g. customer.id)")
        contains = query.get("payload_contains") or None
        check_payload_contains(contains)
        return cls(
            state=state_value,
            name=(query.get("name") or "").strip() or None,
            due_after=_bound(query.get("due_after"), "due_after"),
            due_before=_bound(query.get("due_before"), "due_before"),
            after=after,
            limit=limit,
            ticks=query.get("ticks", "") in ("1", "true", "yes"),
            retrying=retrying,
            payload_contains=contains,
            payload_at=at,
        )

    def query(self, *, after: tuple[float, str] | None = None) -> dict[str, str]:
        """These filters as query parameters (for links), with another cursor."""
        out: dict[str, str] = {}
        if self.state is not None:
            out["state"] = "retrying" if self.retrying else self.state.value
        if self.name is not None:
            out["name"] = self.name
        if self.due_after is not None:
            out["due_after"] = repr(self.due_after)
        if self.due_before is not None:
            out["due_before"] = repr(self.due_before)
        if self.limit != PAGE_SIZE:
            out["limit"] = str(self.limit)
        if self.ticks:
            out["ticks"] = "1"
        if self.payload_contains is not None:
            out["payload_contains"] = self.payload_contains
        if self.payload_at is not None:
            out["payload_path"] = self.payload_at[0]
            value = self.payload_at[1]
            out["payload_value"] = value if isinstance(value, str) else json.dumps(value)
        if after is not None:
            out["after_run_at"] = repr(after[0])
            out["after_id"] = after[1]
        return out


_HIDDEN_READS = 10

SCAN_LIMIT = 2000
"""For a store whose ``list_jobs`` has no ``name`` / ``after``: the most jobs one
page reads to filter here (the page then ends early and the cursor continues
after what was read)."""


def _store_pages(app: DelayQ) -> bool:
    params = inspect.signature(app.backend.list_jobs).parameters
    return "name" in params and "after" in params


def list_page(app: DelayQ, filters: JobFilters) -> tuple[list[Job], tuple[float, str] | None]:
    """One page of jobs and the cursor of the next page (None on the last).

    Asks the store for one job more than a page to learn whether a next page
    exists: a keyset walk on the store's due-order index, never a count. A
    store without the name filter and cursor gets bounded reads filtered here.
    """
    if not _store_pages(app):
        return _filtered_page(app, filters)
    page: list[Job] = []
    after = filters.after
    for _ in range(_HIDDEN_READS):  # hidden tick jobs are skipped: a few reads at most
        jobs = app.list_jobs(
            state=filters.state,
            name=filters.name,
            due_after=filters.due_after,
            due_before=filters.due_before,
            after=after,
            limit=filters.limit + 1,
            preview=PREVIEW_CHARS,
            payload_contains=filters.payload_contains,
            payload_at=filters.payload_at,
        )
        for job in jobs:
            if filters.shows(job):
                if len(page) == filters.limit:  # one more to show: there is a next page
                    return page, (page[-1].run_at, page[-1].id)
                page.append(job)
            after = (job.run_at, job.id)
        if len(jobs) <= filters.limit:
            return page, None
    return page, after  # read enough: the next page continues after what was read


def _filtered_page(app: DelayQ, filters: JobFilters) -> tuple[list[Job], tuple[float, str] | None]:
    """:func:`list_page` over at most :data:`SCAN_LIMIT` jobs read from the cursor on."""
    start = filters.due_after
    if filters.after is not None:
        start = filters.after[0] if start is None else max(start, filters.after[0])
    cursor_id = None if filters.after is None else filters.after[1]
    want = SCAN_LIMIT
    while True:
        rows = app.list_jobs(
            state=filters.state,
            due_after=start,
            due_before=filters.due_before,
            limit=want,
            preview=PREVIEW_CHARS,
            # refused (Unsupported) by a store that cannot search
            payload_contains=filters.payload_contains,
            payload_at=filters.payload_at,
        )
        # Rows start at the cursor's due time: skip those up to the cursor job
        # itself (ties come in enqueue order); a cursor job that is gone skips nothing.
        ids = [j.id for j in rows]
        unread = rows[ids.index(cursor_id) + 1 :] if cursor_id in ids else rows
        if unread or len(rows) < want:
            break
        want *= 2  # every row read was a tie before the cursor: read further
    page: list[Job] = []
    for job in unread:
        if (filters.name is not None and job.name != filters.name) or not filters.shows(job):
            continue
        if len(page) == filters.limit:
            return page, (page[-1].run_at, page[-1].id)
        page.append(job)
    if len(rows) == want:  # read all it may: continue after what was read
        return page, (rows[-1].run_at, rows[-1].id)
    return page, None


def overview(
    app: DelayQ, points: Sequence[SeriesPoint], slot_seconds: float, now: float
) -> dict[str, Any]:
    """Counts by state, next due, oldest overdue, lateness over time and throughput."""
    stats = app.stats()
    head = app.list_jobs(state=JobState.SCHEDULED, limit=1)
    oldest = head[0] if head and head[0].run_at <= now else None
    recent = [p for p in points if p.start >= now - 600]
    running = app.list_jobs(state=JobState.RUNNING, limit=RUNNING_SCAN, preview=1)
    count_retrying = getattr(app.backend, "count_retrying", None)
    return {
        "url": app.url,
        "now": now,
        "counts": {s.value: getattr(stats, s.value) for s in JobState},
        # scheduled jobs that failed before (counted inside "scheduled" too); None
        # when the store cannot count them cheaply
        "retrying": None if count_retrying is None else count_retrying(),
        **attention(running, now),
        "due_now": stats.due,
        "next_due": stats.next_due,
        "next_due_iso": iso(stats.next_due),
        "oldest_overdue": None
        if oldest is None
        else {
            "id": oldest.id,
            "name": oldest.name,
            "run_at": oldest.run_at,
            "age": now - oldest.run_at,
        },
        "lateness": [
            {
                "start": p.start,
                "count": p.count,
                "p50": _finite_or_none(p.p50),
                "p99": _finite_or_none(p.p99),
            }
            for p in points
        ],
        # attempts finished per minute over the last 10 minutes (or since the first slot)
        "throughput_per_minute": (
            sum(p.count for p in recent) * 60.0 / max(slot_seconds, now - recent[0].start)
            if recent
            else None
        ),
        "slot_seconds": slot_seconds,
    }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


# -- actions: the CLI's outcome words ------------------------------------------------
def _when_args(delay: object, at: object) -> dict[str, float]:
    """``delay`` (seconds or '5m') / ``at`` (epoch or ISO 8601) as reschedule arguments."""
    has_delay = delay is not None and str(delay).strip() != ""
    has_at = at is not None and str(at).strip() != ""
    if has_delay == has_at:
        raise InvalidOption("give exactly one of delay (e.g. 30s, 5m) or at (ISO 8601 or epoch)")
    if has_delay:
        if isinstance(delay, int | float) and not isinstance(delay, bool):
            return {"delay": float(delay)}
        return {"delay": parse_duration(str(delay).strip())}
    when = at if isinstance(at, int | float) and not isinstance(at, bool) else None
    return {"at": when if when is not None else parse_time(str(at), "at")}


def cancel(app: DelayQ, job_id: str) -> str:
    """``cancelled``, ``cancelled_after_attempt``, ``running``, ``finished`` or ``not_found``."""
    return _logged("cancel", job_id, app.cancel(job_id).value)


def reschedule(app: DelayQ, job_id: str, *, delay: object = None, at: object = None) -> str:
    """``rescheduled`` (or ``_after_attempt``), ``running``, ``finished`` or ``not_found``."""
    return _logged("reschedule", job_id, app.reschedule(job_id, **_when_args(delay, at)).value)


def requeue(app: DelayQ, job_id: str) -> str:
    """``requeued`` (due now, fresh attempts) or ``not_dead``, as ``delayq dead requeue``."""
    return _logged("requeue", job_id, "requeued" if app.requeue(job_id) else "not_dead")


def purge(
    app: DelayQ, *, job_ids: Sequence[str] | None, older_than: object, everything: bool
) -> int:
    """Delete dead letters: those listed, those dead longer than ``older_than``, or all."""
    age = None
    if older_than is not None and str(older_than).strip():
        age = parse_duration(str(older_than).strip())
    if not (job_ids or age is not None or everything):
        raise InvalidOption("say which dead jobs to purge: ids, older_than (e.g. 7d) or all")
    count = app.purge_dead(job_ids=list(job_ids) if job_ids else None, older_than=age)
    log.info("purged %d dead job(s)", count)
    return count

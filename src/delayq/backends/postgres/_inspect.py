"""Reading jobs back: rows to :class:`~delayq.job.Job`, and the store's inspection calls.

Every read here searches an index (``jobs_due`` by state and due time,
``jobs_finished`` for dead letters, the primary key for ``get``), so the
dashboard stays cheap on a table of millions of finished rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from delayq.backends._common import (
    check_limit,
    check_list_cursor,
    check_payload_at,
    check_payload_contains,
    check_preview,
    check_run_at,
    readable_json,
)
from delayq.backends.postgres._schema import quoted
from delayq.backends.postgres._search import search_params
from delayq.backends.postgres._sql import Statements
from delayq.codec import decode_payload
from delayq.errors import InvalidOption
from delayq.job import Job, JobState, PayloadPreview, Stats
from delayq.keyed import KeyState

__all__ = ["PostgresInspection", "to_job"]

Row = tuple[Any, ...]

_PLAIN_COLUMNS = 16  # COLUMNS up to seq
_PURGE_DEAD_BATCH = 10_000  # dead letters one statement of purge_dead deletes at most


def to_job(row: Row, *, strict: bool = False) -> Job:
    """The job of a row (``sql.COLUMNS`` order; the plain claim's rows stop before
    the flow columns and the result). ``strict`` (claim) raises on a payload or backoff that does
    not decode; otherwise such a field is its raw text."""
    if len(row) == _PLAIN_COLUMNS:
        row = (*row, None, 0, None, None, False, None)
    return Job(
        id=row[0],
        name=row[1],
        payload=decode_payload(row[2]) if strict else readable_json(row[2]),
        run_at=row[3] if row[19] is None else row[19],
        state=JobState(row[4]),
        attempts=row[5],
        max_attempts=row[6],
        backoff=json.loads(row[7]) if strict else readable_json(row[7]),
        misfire=row[8],
        created_at=row[9],
        updated_at=row[10],
        last_error=row[11],
        outcome=row[12],
        lease_until=row[13],
        key=row[16],
        priority=row[17],
        group=row[18],
        # held back over its key's rate: run_at is its next allowed time
        throttled_until=row[3] if row[19] is not None and not row[20] else None,
        result=row[21],
    )


def _listed(row: Row, preview: int | None) -> Job:
    """The job of a listing's row (``_search.list_columns``: the payload maybe cut,
    its length last): a payload longer than ``preview`` as a PayloadPreview."""
    if preview is None or row[-1] <= preview:
        return to_job(row)
    return replace(to_job((*row[:2], "null", *row[3:])), payload=PayloadPreview(row[2], row[-1]))


class _Store(Protocol):
    _sql: Statements
    schema: str

    def _read(self, doing: str, query: str, params: dict[str, Any]) -> list[Row]: ...

    def _write(self, doing: str, query: str, params: dict[str, Any]) -> list[Row]: ...

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...


class PostgresInspection:
    """``get``, ``list_jobs``, ``next_due``, ``stats``, ``dead_letters``, ``purge_dead``."""

    def get(self: _Store, job_id: str) -> Job | None:
        """The job, with its key's mode and counters when it is a key's current run."""
        rows = self._read("reading a job", self._sql.get, self._params(id=job_id))
        if not rows:
            return None
        job = to_job(rows[0])
        keyed = self._read(
            "reading a job's key",
            f"SELECT key, state FROM {quoted(self.schema)}.keyed "
            f"WHERE queue = %(q)s AND job_id = %(id)s",
            self._params(id=job_id),
        )
        if keyed:
            job = replace(job, keyed=KeyState.from_json(keyed[0][0], keyed[0][1]).info())
        return job

    def list_jobs(
        self: _Store,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties), due in ``due_after <= run_at < due_before``,
        of handler ``name`` when given, after the keyset cursor ``after`` (``(run_at,
        job id)`` of the last job of the previous page).

        One index range per state, merged here: ``limit`` rows read per state at most.
        A payload search filters those rows in SQL, and a preview reads only the
        payload's first characters (:mod:`._search`).
        """
        limit = check_limit(limit)
        cursor = check_list_cursor(after)
        search = search_params(
            check_payload_contains(payload_contains),
            check_payload_at(payload_at),
            check_preview(preview),
        )
        if name is not None and not isinstance(name, str):
            raise InvalidOption(f"name must be a handler name (str), got {name!r}")
        states = list(JobState) if state is None else [JobState(state)]
        low = -math.inf if due_after is None else check_run_at(due_after, "due_after")
        high = math.inf if due_before is None else check_run_at(due_before, "due_before")
        if cursor is not None and cursor[0] >= low:
            low = cursor[0]  # the page starts at the cursor's due time: an index bound
        elif cursor is not None:
            cursor = None  # the window starts after the cursor anyway
        rows: list[Row] = []
        for one in states:
            rows += self._read(
                "listing jobs",
                self._sql.list_by_state if name is None else self._sql.list_by_name,
                self._params(
                    state=one.value,
                    low=low,
                    high=high,
                    limit=limit,
                    name=name,
                    after_id=None if cursor is None else cursor[1],
                    **search,
                ),
            )
        rows.sort(key=lambda r: (r[3], r[15]))
        return [_listed(r, preview) for r in rows[:limit]]

    def next_due(self: _Store) -> float | None:
        rows = self._read("reading the next due time", self._sql.head, self._params())
        return rows[0][0] if rows else None

    def stats(self: _Store) -> Stats:
        rows: dict[str, float | None] = dict(
            self._read("counting jobs", self._sql.stats, self._params())
        )
        head = rows.pop("next_due")
        due = int(rows.pop("due") or 0)
        counts = {state: int(n or 0) for state, n in rows.items()}
        return Stats.from_counts(counts, due=due, next_due=head)

    def dead_letters(self: _Store, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        limit = check_limit(limit)
        preview = check_preview(preview)
        rows = self._read(
            "listing dead letters",
            self._sql.dead_letters,
            self._params(limit=limit, **search_params(None, None, preview)),
        )
        return [_listed(r, preview) for r in rows]

    def purge_dead(
        self: _Store, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``."""
        ids = None if job_ids is None else [str(i) for i in job_ids]
        bound = math.inf if older_than is None else check_run_at(older_than, "older_than")
        params = self._params(
            older_than=bound, all=ids is None, ids=ids or [], batch=_PURGE_DEAD_BATCH
        )
        total = 0
        while True:  # batches of their own transactions: no lock held for long
            rows = self._write("purging dead letters", self._sql.purge_dead, params)
            total += int(rows[0][0])
            if int(rows[0][0]) < _PURGE_DEAD_BATCH:
                return total

"""Flow control on PostgreSQL: limit records, and the claim that keeps them.

A job's flow fields are columns of ``jobs`` (migration 6). A job held back keeps
its due time in ``flow_run_at`` while ``run_at`` says when a claim may look at it
again: its next allowed time (over its key's rate: ``throttled_until``) or
``1e300`` (its key is at its concurrency limit: ``parked``). The limit
records are rows of ``limits``; each key's rate state (theoretical arrival time)
a row of ``flow_keys``; each group's claims so far, for the groups' turns, a row
of ``flow_groups``.

A queue takes this path once it uses flow control: the first job with a key,
priority or group, or the first limit, writes the queue's flags into ``meta``
(never removed). The plain claim statement checks the flag and claims nothing
when it is set, and a handle that saw it claims here from then on (it learns
the flag from the schedule read after a claim, or from a read of the flags
after a plain claim that came back short). A queue that never uses flow control
keeps the plain claim: one index probe more, nothing else (none of its rows is
in the flow indexes).

The claim is one transaction in pipeline mode (:func:`._flow_claim.claim_rows`;
about three round trips: the limits, parked keys and first candidates; the
locks and key states; the writes, the lease and the commit): expired leases
returned; parked jobs whose key has room again given back (as many as the room:
a lease that expired, a limit raised); then
rounds of due candidates in claim order (priority, the groups' turns, due
order). Before deciding on a key's jobs the claim takes the key's
transaction-level advisory lock, so concurrent claimers of one key take turns
(in a fixed order in the first round, skipping keys another claimer holds after
it: no lock cycle), and reads the key's live leases and rate state after the
lock: what the previous holder committed. The candidates are locked with
``SKIP LOCKED`` (claimers never wait on each other's jobs); those held back are
parked or throttled in the same transaction, and the rate states written back.
A lease of a key that ends (ack, retry, bury, release) gives as many of the
key's parked jobs back to the due set in the completion's own statement, and
the wake-up after its commit tells the waiters.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg.rows import tuple_row

from delayq.backends._limits import check_limit_args, check_pattern, check_version
from delayq.backends.postgres._batch import CompletionBatch
from delayq.backends.postgres._claims import NO_DISK_WAIT
from delayq.backends.postgres._flow_claim import claim_rows
from delayq.backends.postgres._flow_sql import FlowStatements, limit_of
from delayq.backends.postgres._sql import Statements
from delayq.errors import StaleClaim
from delayq.flow import Limit, LimitRecord
from delayq.job import Claim

log = logging.getLogger("delayq.postgres")

__all__ = ["PostgresFlowClaims", "PostgresLimits", "flags", "uses_flow"]

Row = tuple[Any, ...]
Cursor = psycopg.Cursor[Row]


def flags(queue: str) -> dict[str, str]:
    """The ``meta`` keys saying a queue uses flow control (and groups)."""
    return {"flow_flag": f"flow:{queue}", "groups_flag": f"flow_groups:{queue}"}


def uses_flow(specs: Sequence[Any]) -> tuple[bool, bool]:
    """(a spec of ``specs`` uses flow control, one has a group)."""
    groups = any(s.group is not None for s in specs)
    return groups or any(s.key is not None or s.priority for s in specs), groups


class PostgresLimits:
    """Mixin for :class:`~delayq.backends.postgres.PostgresBackend`: limit records in
    ``limits`` (compare-and-set on the version, one statement per call), and the
    queue's flow flags.

    ``_flow_seen`` holds the flags this handle knows are committed (they are never
    removed, so knowing is enough); it only grows, written without a lock.
    """

    queue: str
    _flow_sql: FlowStatements
    _flow_seen: set[str]

    if TYPE_CHECKING:

        def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _read(self, doing: str, query: str, params: dict[str, Any]) -> list[Row]: ...

        def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None: ...

    def _mark_flow(
        self, conn: psycopg.Connection[Any], *, groups: bool, committed: bool = False
    ) -> None:
        """Write the queue's flags before a job with flow fields (``groups``: one with
        a group) or a limit; ``committed``: ``conn`` commits it at once (autocommit),
        so this handle may remember it."""
        names = flags(self.queue)
        wanted = [names["flow_flag"]] + ([names["groups_flag"]] if groups else [])
        wanted = [flag for flag in wanted if flag not in self._flow_seen]
        if not wanted:
            return
        conn.execute(self._flow_sql.mark, {"flags": wanted})
        if committed:
            self._flow_seen.update(wanted)

    def _flow_marked(self, specs: Sequence[Any]) -> bool:
        """Whether this handle knows the flags ``specs`` need are committed already."""
        flow, groups = uses_flow(specs)
        names = flags(self.queue)
        return (not flow or names["flow_flag"] in self._flow_seen) and (
            not groups or names["groups_flag"] in self._flow_seen
        )

    def _flow_write(self, doing: str, query: str, params: dict[str, Any]) -> list[Row]:
        """A limit write: the flags and the record in one transaction, then every
        waiter woken (parked jobs may have room now; the next claim decides)."""
        with self._conn(doing) as conn:
            with conn.transaction():
                self._mark_flow(conn, groups=False)
                rows = conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()
            self._flow_seen.add(flags(self.queue)["flow_flag"])
            if rows:
                self._told(conn, -math.inf)
        return rows

    def put_limit(self, limit: Limit, *, version: int) -> int | None:
        limit, version = check_limit_args(limit, version)
        rows = self._flow_write(
            "storing a limit",
            self._flow_sql.put_new if version == 0 else self._flow_sql.put_version,
            {
                "q": self.queue,
                "pattern": limit.pattern,
                "data": limit.to_json(),
                "version": version,
            },
        )
        return int(rows[0][0]) if rows else None

    def get_limit(self, pattern: str) -> LimitRecord | None:
        rows = self._read(
            "reading a limit",
            self._flow_sql.get,
            {"q": self.queue, "pattern": check_pattern(pattern)},
        )
        return LimitRecord(limit_of(rows[0][0]), int(rows[0][1])) if rows else None

    def list_limits(self) -> list[LimitRecord]:
        rows = self._read("listing limits", self._flow_sql.list, {"q": self.queue})
        return [LimitRecord(limit_of(data), int(version)) for data, version in rows]

    def delete_limit(self, pattern: str, *, version: int | None = None) -> bool:
        rows = self._flow_write(
            "deleting a limit",
            self._flow_sql.delete,
            {
                "q": self.queue,
                "pattern": check_pattern(pattern),
                "version": None if version is None else check_version(version),
            },
        )
        return bool(rows)


class _Host(Protocol):
    """What :class:`PostgresFlowClaims` uses of the store (and of ``PostgresClaims``)."""

    queue: str
    _sql: Statements
    _flow_sql: FlowStatements
    _flow_seen: set[str]

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _set_hint(self, mark: tuple[int, int] | None, cur: Cursor | None) -> bool: ...

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None: ...

    def _claims(
        self, conn: psycopg.Connection[Any], rows: list[Row], *, ordered: bool = False
    ) -> list[Claim]: ...

    def _answers(
        self, sent: CompletionBatch, rows: list[Row], repeated: bool
    ) -> tuple[list[StaleClaim | None], float | None]: ...

    def _complete_on(
        self, conn: psycopg.Connection[Any], sent: CompletionBatch, repeated: bool
    ) -> list[StaleClaim | None]: ...

    def _complete_sql(self, sent: CompletionBatch) -> str: ...

    def _flow_groups(self, seen: bool = False) -> bool: ...


class PostgresFlowClaims:
    """Mixin for :class:`~delayq.backends.postgres.PostgresBackend`: the claim paths of
    a queue that uses flow control, taken by ``PostgresClaims`` (see the module
    docstring)."""

    def _flow_in_use(self: _Host, flagged: Cursor | None, heard: bool) -> bool:
        """Whether the flags read after a plain claim say the queue uses flow
        control (remembered: the flags are never removed): its own read of the
        flags (``flagged``), or the schedule's read after it (``heard``)."""
        found = {row[0] for row in flagged.fetchall()} if flagged is not None else set()
        if heard:
            found.add(flags(self.queue)["flow_flag"])
        self._flow_seen.update(found)
        return bool(found)

    def _flow_claim(
        self: _Host, conn: psycopg.Connection[Any], params: dict[str, Any]
    ) -> list[Claim]:
        """The claim of a queue that uses flow control (``_flow_claim.claim_rows``): one
        transaction with the lease recovery."""
        with conn.pipeline(), conn.transaction():  # a round trip per read it needs
            conn.execute(NO_DISK_WAIT)
            conn.execute(self._sql.recover, params)
            leased = claim_rows(conn, self._flow_sql, params, groups=self._flow_groups())
        self._flow_groups(leased.groups)
        self._set_hint(None, None)  # the next wait reads the schedule itself
        self._told(conn, leased.throttled)
        return self._claims(conn, leased.rows(), ordered=True)

    def _flow_groups(self: _Host, seen: bool = False) -> bool:
        """Whether this handle knows the queue's jobs have groups (``seen``: a claim
        just read the flag set)."""
        flag = flags(self.queue)["groups_flag"]
        if seen:
            self._flow_seen.add(flag)
        return flag in self._flow_seen

    def _complete_sql(self: _Host, sent: CompletionBatch) -> str:
        """The completion statement: the one that gives parked jobs back to the
        due set when a lease of a key ends, else the plain one."""
        keyed = any(item.claim.job.key is not None for item in sent.items)
        return self._sql.complete_keyed if keyed else self._sql.complete

    def _flow_complete_and_claim(
        self: _Host,
        conn: psycopg.Connection[Any],
        sent: CompletionBatch,
        params: dict[str, Any],
        repeated: bool,
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        """``complete_and_claim`` in a queue that uses flow control: the completions
        and the flow claim in one transaction (the claim sees the slots they freed).
        If the claim part fails, the batch is completed on its own."""
        try:
            with conn.pipeline(), conn.transaction():
                conn.execute(NO_DISK_WAIT)
                done = conn.cursor(row_factory=tuple_row)
                if sent.items:
                    done.execute(self._complete_sql(sent), self._params(**sent.params()))
                conn.execute(self._sql.recover, params)
                leased = claim_rows(conn, self._flow_sql, params, groups=self._flow_groups())
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            log.warning("delayq: claim after complete failed (%s); completing alone", exc)
            return self._complete_on(conn, sent, repeated), []
        self._set_hint(None, None)
        results, at = self._answers(sent, done.fetchall(), repeated) if sent.items else ([], None)
        self._flow_groups(leased.groups)
        claims = self._claims(conn, leased.rows(), ordered=True)
        throttled = leased.throttled
        self._told(
            conn, at if throttled is None or (at is not None and at < throttled) else throttled
        )
        return results, claims

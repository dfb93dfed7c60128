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
when it is set, and a handle that saw it claims here from then on. A queue that
never uses flow control keeps the plain claim: one index probe more, nothing
else (none of its rows is in the flow indexes).

The claim is one transaction (:func:`claim_rows`): expired leases returned;
parked jobs whose key has room again given back (as many as the room); then
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

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.rows import tuple_row

from delayq.backends._limits import check_limit_args, check_pattern, check_version
from delayq.backends.postgres._flow_sql import FlowStatements, limit_of
from delayq.flow import Admissions, Limit, LimitRecord, group_turns

__all__ = ["PostgresLimits", "claim_rows", "flags", "uses_flow"]

_ROUNDS = 8  # candidate reads per claim while held-back jobs keep taking their place

Row = tuple[Any, ...]


def flags(queue: str) -> dict[str, str]:
    """The ``meta`` keys saying a queue uses flow control (and groups)."""
    return {"flow_flag": f"flow:{queue}", "groups_flag": f"flow_groups:{queue}"}


def uses_flow(specs: Sequence[Any]) -> tuple[bool, bool]:
    """(a spec of ``specs`` uses flow control, one has a group)."""
    groups = any(s.group is not None for s in specs)
    return groups or any(s.key is not None or s.priority for s in specs), groups


class _Candidate(NamedTuple):
    id: str
    key: str | None
    group: str
    priority: int
    run_at: float
    seq: int


class _Claim:
    """One flow claim's state across its rounds (inside its transaction, in pipeline
    mode: a statement whose rows are not needed yet travels with the next read)."""

    def __init__(
        self, conn: psycopg.Connection[Any], sql: FlowStatements, params: dict[str, Any]
    ) -> None:
        self.conn = conn
        self.sql = sql
        self.params = params
        now, limits, parked = self.send(sql.now), self.send(sql.limits), self.send(sql.parked_keys)
        first = now.fetchone()  # one round trip for the three
        assert first is not None
        self.at: float = float(first[0])
        self.groups = bool(first[1])
        self.params["at"] = self.at
        self.limits = [limit_of(data) for (data,) in limits.fetchall()]
        self.parked = [(str(k), int(n)) for k, n in parked.fetchall()]
        self.admissions = Admissions(self.limits)
        self.locked: set[str] = set()  # keys whose lock this transaction holds
        self.busy: set[str] = set()  # keys another claimer holds: left for a later claim
        self.served: dict[str, int] = {}
        self.throttled: float | None = None  # the earliest next allowed time given

    def send(self, sql: str, **more: Any) -> psycopg.Cursor[Row]:
        """Queue ``sql``; its cursor (fetching its rows sends what is queued)."""
        cur = self.conn.cursor(row_factory=tuple_row)
        cur.execute(sql, {**self.params, **more})
        return cur

    def unpark(self) -> None:
        """Parked jobs whose key has room again (a lease expired, a limit changed)
        back to the due set, as many as the room (read before any key lock: the
        jobs only become candidates; the decision is made under the lock)."""
        if not self.parked:
            return
        unlocked = Admissions(self.limits, running=dict(self.parked))
        back = [(k, unlocked.room(k)) for k, _n in self.parked]
        back = [(k, room) for k, room in back if room is None or room > 0]
        if back:
            self.send(self.sql.unpark, keys=[k for k, _ in back], rooms=[r for _, r in back])

    def candidates(self, n: int) -> list[_Candidate]:
        if not self.groups:
            return [_Candidate(*row) for row in self.send(self.sql.candidates, n=n).fetchall()]
        rows = self.send(self.sql.group_candidates, n=n).fetchall()
        names = sorted({row[2] for row in rows})
        stored: dict[str, int] = (
            dict(self.send(self.sql.served, groups=names).fetchall()) if names else {}
        )
        turn = group_turns({g: int(stored.get(g, 0)) + self.served.get(g, 0) for g in names})
        rows.sort(key=lambda r: (-r[3], turn[r[2]] + r[6], r[4], r[5]))
        return [_Candidate(*row[:6]) for row in rows]

    def lock(self, rows: list[_Candidate], *, wait: bool) -> list[_Candidate]:
        """Take the locks of the limited keys among ``rows`` not held yet and read
        their state (with ``wait`` False a key another claimer holds is skipped),
        then lock the rows (``SKIP LOCKED``); the rows locked, in order."""
        admissions = self.admissions
        need = sorted(
            {r.key for r in rows if r.key is not None and admissions.limit_of(r.key) is not None}
            - self.locked
            - self.busy
        )
        state = None
        if need and wait:
            self.send(self.sql.lock_keys, keys=need)
            self.locked.update(need)
            state = self.send(self.sql.key_state, keys=need)
        elif need:
            got = [k for (k,) in self.send(self.sql.try_lock_keys, keys=need).fetchall()]
            self.busy.update(set(need) - set(got))
            self.locked.update(got)
            state = self.send(self.sql.key_state, keys=got) if got else None
        rows = [r for r in rows if r.key not in self.busy]
        locked = self.send(self.sql.lock_rows, ids=[r.id for r in rows])
        if state is not None:
            for key, running, tat, promised in state.fetchall():
                admissions.seed(key, int(running), (tat, promised))
        ids = {i for (i,) in locked.fetchall()}
        return [r for r in rows if r.id in ids]

    def decide(self, rows: list[_Candidate], want: int, taken: list[str]) -> bool:
        """Take (into ``taken``) or hold back each of ``rows`` in order, up to
        ``want`` taken; True when some were held back (another round may help)."""
        admissions, at = self.admissions, self.at
        held: list[tuple[str, float | None]] = []
        for row in rows:
            if len(taken) >= want:
                break
            if row.key is not None:
                ok, until = admissions.decide(row.key, at)
                if not ok:
                    held.append((row.id, until))
                    if until is not None and (self.throttled is None or until < self.throttled):
                        self.throttled = until
                    continue
                admissions.start(row.key, at)
            taken.append(row.id)
            self.served[row.group] = self.served.get(row.group, 0) + 1
        if held:
            self.send(self.sql.hold, ids=[i for i, _ in held], ats=[a for _, a in held])
        return bool(held)

    def save(self) -> None:
        """Queue the writes of the rate states and the groups' turns."""
        rates = self.admissions.rate_rows()
        if rates:
            self.send(
                self.sql.save_rates,
                keys=[r[0] for r in rates],
                tats=[r[1] for r in rates],
                promised=[r[2] for r in rates],
            )
        if self.groups and self.served:
            served = sorted(self.served.items())
            self.send(
                self.sql.save_served, groups=[g for g, _ in served], counts=[n for _, n in served]
            )


def claim_rows(
    conn: psycopg.Connection[Any], sql: FlowStatements, params: dict[str, Any]
) -> tuple[list[Row], float | None]:
    """Lease up to ``params["limit"]`` due jobs with the limits applied (inside the
    caller's transaction and pipeline, after the lease recovery); the rows in claim
    order and the earliest next allowed time given to a throttled job (to wake
    waiters)."""
    claim = _Claim(conn, sql, dict(params))
    claim.unpark()
    want = int(params["limit"])
    taken: list[str] = []
    for round_ in range(_ROUNDS):
        left = want - len(taken)
        if left <= 0:
            break
        chosen = set(taken)
        rows = [r for r in claim.candidates(left * 2 + 4 + len(taken)) if r.id not in chosen]
        if not rows:
            break
        if not claim.decide(claim.lock(rows, wait=round_ == 0), want, taken):
            break
    claim.save()
    if not taken:
        return [], claim.throttled
    order = {job_id: i for i, job_id in enumerate(taken)}
    leased = claim.send(sql.lease, ids=taken).fetchall()
    leased.sort(key=lambda r: order[r[0]])
    return leased, claim.throttled


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

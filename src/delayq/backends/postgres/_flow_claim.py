"""The flow-control claim on PostgreSQL, inside the caller's transaction and pipeline
(see :mod:`._flow` for the design)."""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg.rows import tuple_row

from delayq.backends.postgres._flow_sql import FlowStatements, limit_of
from delayq.flow import Admissions, group_turns

__all__ = ["Leased", "claim_rows"]

_ROUNDS = 8  # candidate reads per claim while held-back jobs keep taking their place

Row = tuple[Any, ...]


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
        self,
        conn: psycopg.Connection[Any],
        sql: FlowStatements,
        params: dict[str, Any],
        *,
        groups: bool,
        n: int,
    ) -> None:
        self.conn = conn
        self.sql = sql
        self.params = params
        self.groups = groups
        self.served: dict[str, int] = {}
        now, limits, parked = self.send(sql.now), self.send(sql.limits), self.send(sql.parked_keys)
        first_candidates = self.send_candidates(n)
        row = now.fetchone()  # one round trip for the four
        assert row is not None
        self.at: float = float(row[0])
        self.groups_seen = bool(row[1])
        self.limits = [limit_of(data) for (data,) in limits.fetchall()]
        self.parked = [(str(k), int(n)) for k, n in parked.fetchall()]
        self.first: list[_Candidate] | None = self.candidates(first_candidates)
        self.admissions = Admissions(self.limits)
        self.locked: set[str] = set()  # keys whose lock this transaction holds
        self.busy: set[str] = set()  # keys another claimer holds: left for a later claim
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
            self.first = None  # read before they came back: read again

    def send_candidates(self, n: int) -> psycopg.Cursor[Row]:
        """Queue the read of ``n`` due candidates (per group, with groups)."""
        return self.send(self.sql.group_candidates if self.groups else self.sql.candidates, n=n)

    def candidates(self, cur: psycopg.Cursor[Row]) -> list[_Candidate]:
        """The candidates ``cur`` read, in claim order."""
        rows = cur.fetchall()
        if not self.groups:
            return [_Candidate(*row) for row in rows]
        stored = {row[2]: int(row[7]) for row in rows}
        turn = group_turns({g: n + self.served.get(g, 0) for g, n in stored.items()})
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


class Leased(NamedTuple):
    """What a flow claim leased: the lease statement's cursor (its rows arrive with
    the commit's round trip) and the ids in claim order; and the earliest next
    allowed time given to a throttled job (to wake waiters)."""

    cursor: psycopg.Cursor[Row] | None
    ids: list[str]
    throttled: float | None
    groups: bool  # the queue's jobs have groups (its flag, read by this claim)

    def rows(self) -> list[Row]:
        """The leased rows in claim order (after the pipeline synced)."""
        if self.cursor is None:
            return []
        order = {job_id: i for i, job_id in enumerate(self.ids)}
        return sorted(self.cursor.fetchall(), key=lambda r: order[r[0]])


def claim_rows(
    conn: psycopg.Connection[Any], sql: FlowStatements, params: dict[str, Any], *, groups: bool
) -> Leased:
    """Lease up to ``params["limit"]`` due jobs with the limits applied (inside the
    caller's transaction and pipeline, after the lease recovery). ``groups``: take
    the groups' turns (the queue's groups flag as the caller last knew it; this
    claim reads it again, for the next one)."""
    want = int(params["limit"])
    claim = _Claim(conn, sql, dict(params), groups=groups, n=want * 2 + 4)
    claim.unpark()
    taken: list[str] = []
    for round_ in range(_ROUNDS):
        left = want - len(taken)
        if left <= 0:
            break
        chosen = set(taken)
        if round_ == 0 and claim.first is not None:
            found = claim.first
        else:
            found = claim.candidates(claim.send_candidates(left * 2 + 4 + len(taken)))
        rows = [r for r in found if r.id not in chosen]
        if not rows:
            break
        if not claim.decide(claim.lock(rows, wait=round_ == 0), want, taken):
            break
    claim.save()
    if not taken:
        return Leased(None, [], claim.throttled, claim.groups_seen)
    return Leased(claim.send(sql.lease, ids=taken), taken, claim.throttled, claim.groups_seen)

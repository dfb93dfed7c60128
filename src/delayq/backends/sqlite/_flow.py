"""Flow control on SQLite: limit records, and the claim that keeps them.

Everything happens inside the claim's own ``BEGIN IMMEDIATE`` transaction, so
the limits hold across every process on the file. A job's flow fields are
columns of ``delayq_jobs``; a job held back keeps its due time in
``flow_run_at`` while ``run_at`` says when a claim may look at it again: its
next allowed time (over its key's rate: ``throttled_until``) or ``PARKED_AT``
(its key is at its concurrency limit; ``parked = 1``). Each claim first gives
parked jobs whose key has a free slot their place back, so a freed slot is used
by the next claim of any process (a worker's own complete-and-claim refills
it). Each key's rate state (theoretical arrival time) is a row of
``delayq_flow_keys``; each group's claims so far, for the groups' turns, a row
of ``delayq_flow_groups``. A file written without flow control gains the
columns and tables on open and is otherwise unchanged; until a job with a key,
priority or group or a limit is stored (meta ``flow``), ``claim`` takes its
plain path.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from delayq.backends._limits import check_limit_args, check_pattern, check_version
from delayq.flow import Admissions, Limit, LimitRecord, group_turns

__all__ = [
    "PARKED_AT",
    "SQLiteLimits",
    "add_flow_schema",
    "flow_claim_rows",
    "flow_in_use",
    "mark_flow_used",
]

PARKED_AT = 1e300
"""``run_at`` of a parked job: past every real time, so due-order queries skip it."""

_COLUMNS = (
    ("flow_key", "TEXT"),
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("flow_group", "TEXT"),
    ("flow_run_at", "REAL"),  # the due time of a job held back (run_at moved)
    ("parked", "INTEGER NOT NULL DEFAULT 0"),
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayq_limits (
    pattern TEXT PRIMARY KEY,
    data    TEXT NOT NULL,      -- delayq.flow.Limit.to_json()
    version INTEGER NOT NULL    -- 1 when created, +1 per write (compare-and-set)
);
CREATE TABLE IF NOT EXISTS delayq_flow_keys (
    key      TEXT PRIMARY KEY,
    tat      REAL,              -- rate: theoretical arrival time
    promised REAL               -- rate: next moment to give a throttled job
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS delayq_flow_groups (
    grp    TEXT PRIMARY KEY,
    served INTEGER NOT NULL     -- claims so far (the groups' turns)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS delayq_jobs_flow_key ON delayq_jobs (flow_key, state)
    WHERE flow_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS delayq_jobs_parked ON delayq_jobs (flow_key) WHERE parked = 1;
CREATE INDEX IF NOT EXISTS delayq_jobs_priority ON delayq_jobs (state, priority DESC, run_at, seq);
INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('flow', 0);
INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('flow_groups', 0)
"""
FLOW_COLUMNS = "flow_key, priority, flow_group, flow_run_at, parked"
"""The flow columns, in the order ``_schema.COLUMNS`` appends them."""


def add_flow_schema(conn: sqlite3.Connection) -> None:
    """Add the flow columns and tables (inside the schema transaction); idempotent."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(delayq_jobs)")}
    for name, kind in _COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE delayq_jobs ADD COLUMN {name} {kind}")
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def flow_in_use(conn: sqlite3.Connection) -> tuple[bool, bool]:
    """(any flow field or limit was ever stored, any group was)."""
    rows = dict(
        conn.execute("SELECT key, value FROM delayq_meta WHERE key IN ('flow', 'flow_groups')")
    )
    return bool(rows.get("flow")), bool(rows.get("flow_groups"))


def mark_flow_used(conn: sqlite3.Connection, *, groups: bool = False) -> None:
    conn.execute("UPDATE delayq_meta SET value = 1 WHERE key = 'flow' AND value = 0")
    if groups:
        conn.execute("UPDATE delayq_meta SET value = 1 WHERE key = 'flow_groups' AND value = 0")


def _limits(conn: sqlite3.Connection) -> list[Limit]:
    return [Limit.from_json(data) for (data,) in conn.execute("SELECT data FROM delayq_limits")]


def _running(conn: sqlite3.Connection, key: str) -> int:
    return int(
        conn.execute(
            "SELECT COUNT(*) FROM delayq_jobs WHERE flow_key = ? AND state = 'running'", (key,)
        ).fetchone()[0]
    )


class _Limiter(Admissions):
    """The limits and key states one claim works with (read when first needed,
    written back by :meth:`save`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(_limits(conn))
        self._conn = conn

    def _load_running(self, key: str) -> int:
        return _running(self._conn, key)

    def _load_rate(self, key: str) -> tuple[float | None, float | None]:
        row = self._conn.execute(
            "SELECT tat, promised FROM delayq_flow_keys WHERE key = ?", (key,)
        ).fetchone()
        return (None, None) if row is None else (row[0], row[1])

    def unpark(self) -> None:
        """Give parked jobs whose key has a free slot (or no limit now) their place back."""
        keys = [
            k
            for (k,) in self._conn.execute(
                "SELECT DISTINCT flow_key FROM delayq_jobs WHERE parked = 1"
            )
        ]
        for key in keys:
            room = self.room(key)
            if room is None or room > 0:
                self._conn.execute(
                    "UPDATE delayq_jobs SET run_at = flow_run_at, flow_run_at = NULL, parked = 0 "
                    "WHERE flow_key = ? AND parked = 1",
                    (key,),
                )

    def save(self) -> None:
        rows = self.rate_rows()
        if rows:
            self._conn.executemany(
                "INSERT INTO delayq_flow_keys (key, tat, promised) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET tat = excluded.tat, promised = excluded.promised",
                rows,
            )


_CANDIDATES = (
    "SELECT {columns} FROM delayq_jobs WHERE state = 'scheduled' AND run_at <= ?{names} "
    "ORDER BY priority DESC, run_at, seq LIMIT ?"
)
_GROUP_CANDIDATES = (
    "SELECT * FROM (SELECT {columns}, COALESCE(flow_group, '') AS grp, ROW_NUMBER() OVER "
    "(PARTITION BY COALESCE(flow_group, '') ORDER BY priority DESC, run_at, seq) AS rn "
    "FROM delayq_jobs WHERE state = 'scheduled' AND run_at <= ?{names}) WHERE rn <= ?"
)
_ROUNDS = 8  # candidate reads per claim when held-back jobs keep taking their place


def flow_claim_rows(
    conn: sqlite3.Connection,
    columns: str,
    at: float,
    limit: int,
    *,
    groups: bool,
    names: frozenset[str] | None = None,
) -> list[tuple[Any, ...]]:
    """The rows one claim takes, in claim order, with the limits applied: rows held
    back are moved out of the due set here (parked or throttled); the rows
    returned get their slot and rate step recorded. The caller leases them (and
    restores ``run_at`` from ``flow_run_at``). ``names``: only those handlers'
    rows are candidates (the handler filter)."""
    limiter = _Limiter(conn)
    limiter.unpark()
    key_at = columns.split(", ").index("flow_key")
    taken: list[tuple[Any, ...]] = []
    served: dict[str, int] = {}
    chosen: set[int] = set()
    for _ in range(_ROUNDS):
        want = limit - len(taken)
        if want <= 0:
            break
        rows = _ordered(
            conn,
            columns,
            at,
            want * 2 + 4 + len(taken),
            groups=groups,
            served=served,
            handlers=names,
        )
        rows = [row for row in rows if row[0] not in chosen]  # taken: still 'scheduled' here
        if not rows:
            break
        held = 0
        for row in rows:
            if len(taken) >= limit:
                break
            key = row[key_at]
            if key is not None:
                ok, until = limiter.decide(key, at)
                if not ok:
                    held += 1
                    conn.execute(
                        "UPDATE delayq_jobs SET flow_run_at = COALESCE(flow_run_at, run_at), "
                        "run_at = ?, parked = ? WHERE seq = ?",
                        (PARKED_AT if until is None else until, int(until is None), row[0]),
                    )
                    continue
                limiter.start(key, at)
            taken.append(row[: len(row) - (2 if groups else 0)])
            chosen.add(row[0])
            if groups:
                served[row[-2]] = served.get(row[-2], 0) + 1
        if not held:
            break
    limiter.save()
    if served:
        conn.executemany(
            "INSERT INTO delayq_flow_groups (grp, served) VALUES (?, ?) "
            "ON CONFLICT (grp) DO UPDATE SET served = served + excluded.served",
            list(served.items()),
        )
    return taken


def _ordered(
    conn: sqlite3.Connection,
    columns: str,
    at: float,
    n: int,
    *,
    groups: bool,
    served: dict[str, int],
    handlers: frozenset[str] | None,
) -> list[tuple[Any, ...]]:
    """Due candidates in claim order: priority first; with groups, each group's
    rows take turns (fewest claims first, a group that was away joining the
    turn just behind the others), then due order. Only of ``handlers`` if given."""
    chosen = () if handlers is None else tuple(sorted(handlers))
    where = "" if handlers is None else f" AND name IN ({', '.join('?' * len(chosen))})"
    if not groups:
        query = _CANDIDATES.format(columns=columns, names=where)
        return conn.execute(query, (at, *chosen, n)).fetchall()
    query = _GROUP_CANDIDATES.format(columns=columns, names=where)
    rows = conn.execute(query, (at, *chosen, n)).fetchall()
    if not rows:
        return []
    names = sorted({row[-2] for row in rows})
    stored: dict[str, int] = {}
    for i in range(0, len(names), 500):  # well under SQLite's parameter limit
        chunk = names[i : i + 500]
        marks = ", ".join("?" * len(chunk))
        stored.update(
            conn.execute(
                f"SELECT grp, served FROM delayq_flow_groups WHERE grp IN ({marks})", chunk
            )
        )
    turn = group_turns({g: stored.get(g, 0) + served.get(g, 0) for g in names})
    prio_at = columns.split(", ").index("priority")
    run_at_i = columns.split(", ").index("run_at")
    return sorted(rows, key=lambda r: (-r[prio_at], turn[r[-2]] + r[-1], r[run_at_i], r[0]))


class SQLiteLimits:
    """Mixin for :class:`~delayq.backends.sqlite.SQLiteBackend`: limit records in
    ``delayq_limits``, written with compare-and-set in one transaction."""

    if TYPE_CHECKING:

        def _write(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def put_limit(self, limit: Limit, *, version: int) -> int | None:
        limit, version = check_limit_args(limit, version)
        with self._write("writing a limit") as conn:
            row = conn.execute(
                "SELECT version FROM delayq_limits WHERE pattern = ?", (limit.pattern,)
            ).fetchone()
            if (0 if row is None else int(row[0])) != version:
                return None
            conn.execute(
                "INSERT INTO delayq_limits (pattern, data, version) VALUES (?, ?, ?) "
                "ON CONFLICT (pattern) DO UPDATE SET data = excluded.data, "
                "version = excluded.version",
                (limit.pattern, limit.to_json(), version + 1),
            )
            mark_flow_used(conn)
            return version + 1

    def get_limit(self, pattern: str) -> LimitRecord | None:
        pattern = check_pattern(pattern)
        with self._read("reading a limit") as conn:
            row = conn.execute(
                "SELECT data, version FROM delayq_limits WHERE pattern = ?", (pattern,)
            ).fetchone()
        return None if row is None else LimitRecord(Limit.from_json(row[0]), int(row[1]))

    def list_limits(self) -> list[LimitRecord]:
        with self._read("listing limits") as conn:
            rows = conn.execute(
                "SELECT data, version FROM delayq_limits ORDER BY pattern"
            ).fetchall()
        return [LimitRecord(Limit.from_json(data), int(version)) for data, version in rows]

    def delete_limit(self, pattern: str, *, version: int | None = None) -> bool:
        pattern = check_pattern(pattern)
        if version is not None:
            version = check_version(version)
        with self._write("deleting a limit") as conn:
            if version is None:
                cur = conn.execute("DELETE FROM delayq_limits WHERE pattern = ?", (pattern,))
            else:
                cur = conn.execute(
                    "DELETE FROM delayq_limits WHERE pattern = ? AND version = ?",
                    (pattern, version),
                )
            return cur.rowcount == 1


def flow_rows(specs: Sequence[Any]) -> bool:
    """True when a spec of ``specs`` uses flow control (key, priority or group)."""
    return any(s.key is not None or s.priority or s.group is not None for s in specs)

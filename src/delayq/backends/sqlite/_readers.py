"""Read-only connections, one per thread, for the store's inspection reads.

In WAL mode a reader never waits for a writer nor holds one up, but only on
a connection of its own: the writer connection is guarded by the backend's
process-wide lock, so a dashboard page read on it would hold off the worker's
claims and commits for as long as the read takes. :class:`ReadConnections`
gives each thread its own connection (``PRAGMA query_only``), opened on first
use, so ``get``, ``list_jobs``, ``stats`` and ``dead_letters`` never take that
lock. An in-memory database has no second connection to the same data: the
backend keeps reading it on its one connection.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator

__all__ = ["ReadConnections"]


class ReadConnections:
    """Per-thread read-only connections to the database file ``path``.

    ``_lock`` guards ``_all`` (every connection opened, to close them) and
    ``_closed``; a thread's own connection sits in ``_local`` and is used by
    that thread only. After ``fork`` the parent's connections are never used:
    each is keyed by the process id that opened it.
    """

    def __init__(self, path: str, *, busy_timeout: float) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[tuple[int, sqlite3.Connection]] = []
        self._closed = False

    def _connection(self) -> sqlite3.Connection:
        mine: tuple[int, sqlite3.Connection] | None = getattr(self._local, "conn", None)
        if mine is not None and mine[0] == os.getpid():
            return mine[1]
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,  # BEGIN / COMMIT issued here
            check_same_thread=False,  # closed by close() from another thread
            uri=self.path.startswith("file:"),
        )
        conn.execute("PRAGMA query_only = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        with self._lock:
            if self._closed:
                conn.close()
                raise sqlite3.ProgrammingError("closed")
            self._all.append((os.getpid(), conn))
        self._local.conn = (os.getpid(), conn)
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One read snapshot on this thread's connection (``sqlite3.Error`` for
        the backend to wrap)."""
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection of this process (idempotent)."""
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for pid, conn in conns:
            if pid == os.getpid():  # a parent's (inherited by fork) is never touched
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

"""Writers take turns on one SQLite database, across threads and processes.

SQLite admits one writer at a time; the others wait in its busy handler,
which sleeps 1..100 ms between retries. A writer that commits and begins again
at once re-takes the lock long before a sleeping waiter looks again, so one
producer writing flat out can hold off a worker's claims and acks for seconds
("whoever retries luckiest").

delayq's writers queue in the kernel instead, on two byte locks of the file
``<db>.lock`` (taken before ``BEGIN IMMEDIATE``, released after ``COMMIT``):

* acquire: lock the **gate**, lock the **turn**, unlock the gate;
* release: unlock the turn.

Only the gate holder ever waits for the turn, so when a writer releases the
turn the kernel hands it to the writer that was waiting at the gate, and a
writer that just committed must queue at the gate behind the others (who
have the whole next transaction to be woken and take it). Every writer waits
for a bounded number of turns, never for the luck of a retry. Kernel locks
vanish with their process (SIGKILL included), so a crashed writer never
blocks the others.

The locks are open-file-description locks (Linux ``F_OFD_SETLKW``): owned by
one backend's descriptor, not by the process, so two backends of one process
take turns as well. Elsewhere ``flock`` on the file gives plain mutual
exclusion (no gate). A wait is bounded by ``busy_timeout``: when a lock is
taken, a helper thread blocks in the kernel and the caller waits for it with a
timeout, then gives up with :class:`TurnTimeout` (the helper hands back what it
gets later).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import queue
import struct
import threading
from dataclasses import dataclass, field

from delayq.backends.sqlite._wake import share_like_database

try:
    import fcntl
except ImportError:  # Windows: no kernel file locks here; writers rely on SQLite's busy handler
    fcntl = None  # type: ignore[assignment]

__all__ = ["TurnTimeout", "WriteTurns", "open_turns"]

log = logging.getLogger("delayq.sqlite")

_OFD = fcntl is not None and hasattr(fcntl, "F_OFD_SETLKW")
_GATE, _TURN = 0, 1  # byte offsets in <db>.lock


class TurnTimeout(Exception):
    """The write turn was not free within the timeout (another writer holds it)."""


@functools.cache
def _flock_struct(kind: int, start: int, length: int = 1) -> bytes:
    # struct flock { short l_type, l_whence; off_t l_start, l_len; pid_t l_pid; }
    # (l_pid must be 0 for open-file-description locks); padded to 32 bytes.
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)


@dataclass(eq=False)
class _Ticket:
    """One slow acquisition handed to the helper thread.

    ``lock`` guards ``granted`` and ``abandoned``: the caller abandons it on
    timeout, the helper grants it; whichever comes second sees the other.
    """

    has_gate: bool
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    granted: bool = False
    abandoned: bool = False


class WriteTurns:
    """The turn of one backend (one descriptor) at writing one database.

    Not thread-safe by itself: the backend calls :meth:`acquire` and
    :meth:`release` under its own connection lock, one writer at a time.
    ``_slow`` counts tickets the helper has not finished (while it is nonzero
    the helper may hold the gate or the turn on this descriptor, so a new
    acquisition queues behind it instead of locking the same bytes again).
    """

    def __init__(self, lock_path: str, fd: int) -> None:
        self.lock_path = lock_path
        self._fd = fd
        self._tickets: queue.SimpleQueue[_Ticket | None] = queue.SimpleQueue()
        self._helper: threading.Thread | None = None
        self._state = threading.Lock()  # guards _slow and _helper
        self._slow = 0

    # -- kernel locks ---------------------------------------------------------
    def _lock(self, start: int, *, wait: bool, length: int = 1) -> bool:
        if _OFD:
            cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
            try:
                fcntl.fcntl(self._fd, cmd, _flock_struct(fcntl.F_WRLCK, start, length))
            except OSError as exc:
                if not wait and exc.errno in (errno.EAGAIN, errno.EACCES):
                    return False
                raise
            return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def _unlock(self, start: int) -> None:
        if _OFD:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock_struct(fcntl.F_UNLCK, start))
        else:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- turns ------------------------------------------------------------------
    def acquire(self, timeout: float) -> None:
        """Wait for this writer's turn, at most ``timeout`` seconds (:class:`TurnTimeout`)."""
        with self._state:
            fast = self._slow == 0
        if fast and _OFD and self._lock(_GATE, wait=False, length=2):
            self._unlock(_GATE)  # gate and turn were both free: the turn is ours
            return
        if fast:
            if not _OFD:
                if self._lock(_TURN, wait=False):
                    return
                has_gate = False
            elif self._lock(_GATE, wait=False):
                if self._lock(_TURN, wait=False):
                    self._unlock(_GATE)
                    return
                has_gate = True
            else:
                has_gate = False
        else:
            has_gate = False
        ticket = _Ticket(has_gate)
        with self._state:
            self._slow += 1
            if self._helper is None:
                self._helper = threading.Thread(
                    target=self._serve, name="delayq-sqlite-turns", daemon=True
                )
                self._helper.start()
        self._tickets.put(ticket)
        ticket.done.wait(timeout)
        with ticket.lock:
            if ticket.granted:
                return
            ticket.abandoned = True
        raise TurnTimeout(f"no write turn on {self.lock_path!r} within {timeout}s")

    def probe(self) -> None:
        """Take and drop the gate without waiting: raises OSError where the file
        system has no such locks (a busy gate is fine: the locks work)."""
        if self._lock(_GATE, wait=False):
            self._unlock(_GATE)

    def release(self) -> None:
        """End this writer's turn: the writer waiting at the gate goes next."""
        self._unlock(_TURN)

    def _serve(self) -> None:
        """The helper thread: blocks in the kernel for tickets, one at a time."""
        while (ticket := self._tickets.get()) is not None:
            try:
                if _OFD:
                    if not ticket.has_gate:
                        self._lock(_GATE, wait=True)
                    self._lock(_TURN, wait=True)
                    self._unlock(_GATE)
                else:
                    self._lock(_TURN, wait=True)
            except OSError:
                # A closed descriptor (the backend closed while waiting): give up.
                with ticket.lock:
                    ticket.abandoned = True
                with self._state:
                    self._slow -= 1
                ticket.done.set()
                continue
            with ticket.lock:
                give_back = ticket.abandoned
                ticket.granted = not give_back
            if give_back:
                with contextlib.suppress(OSError):
                    self._unlock(_TURN)
            with self._state:
                self._slow -= 1
            ticket.done.set()

    def forget(self) -> None:
        """In a forked child: close the inherited descriptor without unlocking
        anything (the parent's locks stay the parent's)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def close(self) -> None:
        """Stop the helper thread and close the descriptor (releases every lock)."""
        with self._state:
            helper, self._helper = self._helper, None
        if helper is not None:
            self._tickets.put(None)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_turns(db_path: str) -> WriteTurns | None:
    """The write turns of the database at ``db_path`` (its ``<db>.lock`` file).

    None, with a warning, when the lock file cannot be opened (a read-only
    directory): writers then wait in SQLite's busy handler alone.
    """
    if fcntl is None:
        return None
    lock_path = db_path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        log.warning(
            "delayq sqlite %s: cannot open the write-turn file %s (%s); writers will "
            "not take turns (a busy producer may delay claims)",
            db_path,
            lock_path,
            exc,
        )
        return None
    share_like_database(lock_path, db_path)
    turns = WriteTurns(lock_path, fd)
    try:  # a file system without these locks (some network mounts) says so here
        turns.probe()
    except OSError as exc:
        turns.close()
        log.warning(
            "delayq sqlite %s: kernel file locks do not work on %s (%s); writers will "
            "not take turns (a busy producer may delay claims)",
            db_path,
            lock_path,
            exc,
        )
        return None
    return turns

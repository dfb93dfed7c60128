"""Cross-process wake-ups for processes sharing one SQLite file, without polling it.

A worker sleeping in ``wait_for_due`` must wake within milliseconds when
another process schedules an earlier job. SQLite has no notification channel,
so delayq builds one next to the database with unix datagram sockets:

* Every backend that waits binds one socket in the wake directory
  ``<db>.wake/<random hex>.sock``, and a daemon thread blocks on it. The name
  is random (uuid4), not the pid: containers sharing the database's volume
  often all run as pid 1, and a name one of them computes must never be a live
  socket of another. Binding never unlinks an existing file either (only a
  sender that gets ``ECONNREFUSED`` removes a socket, so only dead ones go). A
  datagram (its content is ignored) means "the schedule changed: look again".
* A process that commits a change making some job earlier than the previous
  head (enqueue, reschedule, retry, requeue) sends one byte to every socket in
  the directory. Sockets nobody listens on any more (a killed process) answer
  ``ECONNREFUSED`` or are gone (``ENOENT``); the sender unlinks them. A full
  receive buffer (``EAGAIN``) is ignored: a wake-up is already pending there.
* **Other users.** The directory and every socket get the database file's
  group and the read/write access it grants (:func:`share_like_database`), so
  a web app running as ``www-data`` wakes a worker running as ``delayq`` when
  both may write the database.
* **Long paths.** Unix socket addresses hold about 100 bytes. The directory
  always sits next to the database (never in ``/tmp``, which may be private to
  a process); when a socket's full path is too long it is bound and addressed
  as ``/proc/self/fd/<fd of the directory>/<name>``.

Nothing fails silently. :meth:`WakeChannel.listen` checks itself once (a
datagram to its own socket must arrive; the socket must be as accessible as
the database) and returns False, with a warning, when wake-ups cannot be
relied on; a ``sendto`` that fails for another reason than a dead or busy
listener (``EACCES``, ``EPERM`` ...) is counted (:attr:`WakeChannel.failures`),
logged once per socket, and reported through ``on_undelivered`` so the SQLite
backend can tell every waiter (a counter in the database) to fall back to a
bounded wait. Where wake-ups are unavailable the backend re-checks
``PRAGMA data_version`` every 50 ms while it waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["WakeChannel", "share_like_database", "wake_directory"]

log = logging.getLogger("delayq.sqlite")

_SUPPORTED = hasattr(socket, "AF_UNIX") and hasattr(os, "O_DIRECTORY")  # not on Windows
_MAX_SOCKET_PATH = 100  # sun_path is 104-108 bytes depending on the OS; keep a margin
_SUFFIX = ".sock"
_PROBE = b"?"  # the self-check's datagram: received, but wakes nobody
_SELF_CHECK_TIMEOUT = 5.0  # seconds for the start-up datagram to reach our own socket


def share_like_database(path: str, db_path: str, *, directory: bool = False) -> bool:
    """Give a file delayq created next to the database the database's access.

    Its group becomes the database's, and the read/write bits the database
    grants its group and others are granted here too (plus search on a
    directory): every user who may write the database may also send wake-ups
    and take write turns (a web app as ``www-data`` scheduling, a worker as
    ``delayq`` claiming). Only the file's owner can change it; returns False
    when the file is not (or could not be made) that accessible.
    """
    try:
        db = os.stat(db_path)
    except OSError:
        return True  # no database file (yet): nothing to follow
    try:
        mine = os.stat(path)
    except OSError:
        return False
    bits = (stat.S_IMODE(db.st_mode) & 0o666) | 0o600
    if directory:
        bits |= (bits & 0o444) >> 2  # search wherever read is granted
    if mine.st_gid != db.st_gid:
        with contextlib.suppress(OSError):
            os.chown(path, -1, db.st_gid)
    if stat.S_IMODE(mine.st_mode) & bits != bits:
        with contextlib.suppress(OSError):
            os.chmod(path, stat.S_IMODE(mine.st_mode) | bits)
    try:
        now = os.stat(path)
    except OSError:
        return False
    shared_ok = now.st_gid == db.st_gid or not db.st_mode & stat.S_IWGRP
    return shared_ok and stat.S_IMODE(now.st_mode) & bits == bits


def wake_directory(db_path: str) -> Path:
    """The directory holding the wake sockets of the database at ``db_path``:
    always next to the database file (its real path)."""
    return Path(os.path.realpath(db_path) + ".wake")


class WakeChannel:
    """Send and receive "look again" datagrams for one database file.

    ``on_wake`` is called on the listener thread for every datagram received;
    ``on_undelivered`` (optional) once per socket a wake-up could not be sent
    to for a reason other than a dead or busy listener. Both must be quick and
    never run user code.

    Lock rule: ``_lock`` guards ``_listener``, ``_name``, ``_thread``,
    ``_sender``, ``_dir_fd``, ``_failed``, ``_warned`` and ``_closed``;
    ``failures`` is only incremented under it.
    """

    def __init__(
        self,
        db_path: str,
        on_wake: Callable[[], None],
        on_undelivered: Callable[[], None] | None = None,
    ) -> None:
        self.db_path = db_path
        self.directory = wake_directory(db_path)
        self.failures = 0
        """Wake-ups not delivered (``sendto`` refused for a reason other than a
        dead or busy listener) since this channel was created."""
        self._on_wake = on_wake
        self._on_undelivered = on_undelivered
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._name: str | None = None
        self._thread: threading.Thread | None = None
        self._sender: socket.socket | None = None
        self._dir_fd: int | None = None
        self._received = threading.Event()  # set by the listener thread on each datagram
        self._closed = False
        self._failed = not _SUPPORTED
        self._warned: set[str] = set()

    @property
    def socket_path(self) -> str | None:
        """This process's listening socket (its full path), once :meth:`listen` succeeded."""
        name = self._name
        return None if name is None else str(self.directory / name)

    # -- addresses ----------------------------------------------------------------
    def _open_directory(self) -> int:
        """The directory's descriptor, creating the directory (shared like the
        database) first. Call with ``_lock`` held."""
        if self._dir_fd is None:
            try:
                self.directory.mkdir()
            except FileExistsError:
                pass
            else:
                share_like_database(str(self.directory), self.db_path, directory=True)
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._dir_fd

    def _address(self, name: str, dir_fd: int) -> str:
        full = str(self.directory / name)
        if len(os.fsencode(full)) <= _MAX_SOCKET_PATH:
            return full
        return f"/proc/self/fd/{dir_fd}/{name}"  # the same socket, by a short path

    # -- listening ----------------------------------------------------------------
    def listen(self) -> bool:
        """Bind this channel's socket and start its listener thread (once).

        Returns True when cross-process wake-ups will arrive (the start-up
        self-check passed), False, with a warning, when they cannot be relied on.
        """
        with self._lock:
            if self._listener is not None:
                return True
            if self._failed or self._closed:
                return False
            problem = self._bind()
            if problem is None:
                assert self._listener is not None and self._name is not None
                self._thread = threading.Thread(
                    target=self._listen_loop,
                    args=(self._listener,),
                    name="delayq-sqlite-wake",
                    daemon=True,
                )
                self._thread.start()
                problem = self._self_check()
            if problem is not None:
                self._failed = True
                log.warning(
                    "delayq sqlite %s: cross-process wake-ups unavailable (%s); waiting "
                    "workers re-check the database every 50 ms instead",
                    self.db_path,
                    problem,
                )
                self._stop_listening()
                return False
            return True

    def _bind(self) -> str | None:
        """Bind the socket (``_lock`` held); None or what went wrong."""
        name = f"{uuid.uuid4().hex}{_SUFFIX}"
        try:
            dir_fd = self._open_directory()
        except OSError as exc:
            return f"cannot use the wake directory {self.directory}: {exc}"
        address = self._address(name, dir_fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(address)  # a random name: never someone else's (never unlinked)
        except OSError as exc:
            sock.close()
            return f"cannot bind {self.directory / name}: {exc}"
        self._listener, self._name = sock, name
        if not share_like_database(str(self.directory / name), self.db_path):
            return (
                f"the socket {self.directory / name} cannot be given the database's "
                f"group and access, so other users writing the database could not wake it"
            )
        try:
            directory_ok = (
                share_like_database(str(self.directory), self.db_path, directory=True)
                or os.stat(self.directory).st_uid != os.getuid()
            )
        except OSError:
            directory_ok = False
        if not directory_ok:
            return f"the wake directory {self.directory} is less accessible than the database"
        return None

    def _self_check(self) -> str | None:
        """One datagram to our own socket, as another process would send it."""
        assert self._name is not None and self._dir_fd is not None
        self._received.clear()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
                probe.sendto(_PROBE, self._address(self._name, self._dir_fd))
        except OSError as exc:
            return f"a test wake-up could not be sent: {exc}"
        if not self._received.wait(_SELF_CHECK_TIMEOUT):
            return f"a test wake-up did not arrive within {_SELF_CHECK_TIMEOUT}s"
        return None

    def _listen_loop(self, sock: socket.socket) -> None:
        while True:
            wake = False
            try:
                wake = sock.recv(16) != _PROBE
                while True:  # coalesce a burst of wake-ups into one
                    wake = sock.recv(16, socket.MSG_DONTWAIT) != _PROBE or wake
            except BlockingIOError:
                pass
            except OSError:
                return  # closed
            self._received.set()
            with self._lock:
                if self._closed:
                    return
            if wake:
                self._on_wake()

    # -- sending ------------------------------------------------------------------
    def notify(self) -> None:
        """Wake every other process (and backend) waiting on this database.

        Never raises: a wake-up that cannot be delivered is counted, logged
        once per socket and reported through ``on_undelivered``.
        """
        with self._lock:
            if self._closed or not _SUPPORTED:
                return
            try:
                dir_fd = self._open_directory()
                if self._sender is None:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
            except OSError as exc:
                failure: OSError | None = exc
            else:
                failure = None
            sender, own = self._sender, self._name
        if failure is not None or sender is None:
            self._undelivered(str(self.directory), failure or OSError("no sender"))
            return
        try:
            names = os.listdir(dir_fd)
        except OSError as exc:
            self._undelivered(str(self.directory), exc)
            return
        for name in names:
            if not name.endswith(_SUFFIX) or name == own:
                continue
            try:
                sender.sendto(b"!", self._address(name, dir_fd))
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)  # its process is gone
            except BlockingIOError:
                pass  # a wake-up is already pending there
            except OSError as exc:
                self._undelivered(str(self.directory / name), exc)

    def _undelivered(self, where: str, exc: OSError) -> None:
        with self._lock:
            self.failures += 1
            first = where not in self._warned
            self._warned.add(where)
        if first:
            log.warning(
                "delayq sqlite %s: a wake-up could not be delivered to %s (%s); the process "
                "waiting there falls back to re-checking the database every 50 ms. Give "
                "every process using the database the same group and a group-writable "
                "database file (see the README, SQLite section)",
                self.db_path,
                where,
                exc,
            )
            if self._on_undelivered is not None:
                try:
                    self._on_undelivered()
                except Exception:
                    log.exception("delayq sqlite %s: reporting an undelivered wake-up", where)

    # -- closing ------------------------------------------------------------------
    def _stop_listening(self) -> None:
        """Stop the listener thread and remove our socket (``_lock`` held)."""
        listener, name, thread = self._listener, self._name, self._thread
        self._listener = self._name = self._thread = None
        if listener is None or name is None:
            return
        if self._dir_fd is not None:
            # Closing a socket does not interrupt a recv() blocked on it; a datagram does.
            with (
                contextlib.suppress(OSError),
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s,
            ):
                s.sendto(b"!", self._address(name, self._dir_fd))
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._dir_fd)
        listener.close()
        if thread is not None and thread is not threading.current_thread():
            self._lock.release()
            try:
                thread.join(timeout=1.0)
            finally:
                self._lock.acquire()

    def close(self) -> None:
        """Stop listening and remove this process's socket. Idempotent.

        The directory stays (like SQLite's ``-wal`` and ``-shm`` files): a
        process holding its descriptor must never find it replaced.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_listening()
            sender, self._sender = self._sender, None
            dir_fd, self._dir_fd = self._dir_fd, None
        if sender is not None:
            sender.close()
        if dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(dir_fd)

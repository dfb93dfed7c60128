"""Cross-process wake-ups for processes sharing one SQLite file, without polling it.

A worker sleeping in ``wait_for_due`` must wake within milliseconds when
another process schedules an earlier job. SQLite has no notification channel,
so delayq builds one next to the database with unix datagram sockets:

* Every backend that waits binds one socket in the wake directory,
  ``<db>.wake/<random hex>.sock``, and a daemon thread blocks on it. The name
  is random (uuid4), not the pid: containers sharing the database's volume
  often all run as pid 1, and a name one of them computes must never be a live
  socket of another. Binding never unlinks an existing file either (only a
  sender that gets ``ECONNREFUSED`` removes a socket, so only dead ones go). A datagram
  (its content is ignored) means "the schedule changed: look again"; the thread
  bumps the backend's wake generation and notifies its condition.
* A process that commits a change making some job earlier than the previous
  head (enqueue, reschedule, retry, requeue) sends one byte to every socket in
  the directory. Sockets nobody listens on any more (a killed process) answer
  ``ECONNREFUSED`` or are gone (``ENOENT``); the sender unlinks them. A full
  receive buffer (``EAGAIN``) is ignored: the receiver already has a wake-up
  pending.

The directory is removed again by the last listener to close.

Sending is a directory scan plus one non-blocking ``sendto`` per waiting
process, done after the commit and only when the head moved earlier, so a
steady stream of later jobs costs nothing. Unix socket paths are limited to
about 100 bytes; when ``<db>.wake`` would be too long the directory is
``<tmp>/delayq-wake-<hash of the db's real path>`` instead, which every process
computes the same way.

Where unix datagram sockets are unavailable (or the directory is not
writable) :meth:`WakeChannel.listen` returns False and the SQLite backend falls
back to re-checking ``PRAGMA data_version`` every 50 ms while it waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["WakeChannel", "share_like_database", "wake_directory"]

log = logging.getLogger("delayq.sqlite")

_MAX_SOCKET_PATH = 100  # sun_path is 104-108 bytes depending on the OS; keep a margin
_SUFFIX = ".sock"
_NAME_LENGTH = 32 + len(_SUFFIX)  # "<uuid4 hex>.sock"


def share_like_database(path: str, db_path: str, *, directory: bool = False) -> bool:
    """Give a file delayq created next to the database the database's access.

    Its group becomes the database's, and the read/write bits the database
    grants its group and others are granted here too (plus search on a
    directory): every user who may write the database may also send wake-ups
    and take write turns (a web app as ``www-data`` scheduling, a worker as
    ``delayq`` claiming). Only the file's owner can change it; returns False
    when that failed (the caller decides whether it matters).
    """
    try:
        db = os.stat(db_path)
        mine = os.stat(path)
    except OSError:
        return False
    bits = (stat.S_IMODE(db.st_mode) & 0o666) | 0o600
    if directory:
        bits |= (bits & 0o444) >> 2  # search wherever read is granted
    ok = True
    if mine.st_gid != db.st_gid:
        try:
            os.chown(path, -1, db.st_gid)
        except OSError:
            ok = False
    if stat.S_IMODE(mine.st_mode) != bits:
        try:
            os.chmod(path, bits)
        except OSError:
            ok = False
    return ok


def wake_directory(db_path: str) -> Path:
    """The directory holding the wake sockets of the database at ``db_path``."""
    real = os.path.realpath(db_path)
    preferred = Path(real + ".wake")
    # "/<uuid4 hex>.sock"
    if len(os.fsencode(preferred)) + 1 + _NAME_LENGTH <= _MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"delayq-wake-{digest}"


class WakeChannel:
    """Send and receive "look again" datagrams for one database file.

    ``on_wake`` is called on the listener thread for every wake-up received;
    it must be quick and never run user code (the SQLite backend only bumps a
    counter and notifies a condition).

    Lock rule: ``_lock`` guards ``_listener``, ``_path``, ``_thread``, ``_sender``
    and ``_closed``.
    """

    def __init__(self, db_path: str, on_wake: Callable[[], None]) -> None:
        self.directory = wake_directory(db_path)
        self._on_wake = on_wake
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._path: str | None = None
        self._thread: threading.Thread | None = None
        self._sender: socket.socket | None = None
        self._closed = False
        self._failed = not hasattr(socket, "AF_UNIX")

    @property
    def socket_path(self) -> str | None:
        """This process's listening socket, once :meth:`listen` succeeded."""
        return self._path

    def listen(self) -> bool:
        """Bind this channel's socket and start its listener thread (once).

        Returns True when cross-process wake-ups will arrive, False when this
        platform or directory cannot provide them.
        """
        with self._lock:
            if self._listener is not None:
                return True
            if self._failed or self._closed:
                return False
            path = str(self.directory / f"{uuid.uuid4().hex}{_SUFFIX}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            for attempt in range(3):
                try:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    sock.bind(path)  # a random name: never someone else's (never unlinked)
                    break
                except FileNotFoundError:
                    # Another process removed the (then empty) directory as it closed.
                    if attempt == 2:
                        sock.close()
                        self._failed = True
                        return False
                except OSError:
                    sock.close()
                    self._failed = True
                    return False
            self._listener, self._path = sock, path
            self._thread = threading.Thread(
                target=self._listen_loop, args=(sock,), name="delayq-sqlite-wake", daemon=True
            )
            self._thread.start()
            return True

    def _listen_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                sock.recv(16)
                while True:  # coalesce a burst of wake-ups into one
                    sock.recv(16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    return
            self._on_wake()

    def notify(self) -> None:
        """Wake every other process (and backend) waiting on this database."""
        with self._lock:
            if self._closed or self._failed:
                return
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            sender, own = self._sender, self._path
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in entries:
            if not entry.name.endswith(_SUFFIX) or entry.path == own:
                continue
            try:
                sender.sendto(b"!", entry.path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # its process is gone
            except OSError:
                pass  # EAGAIN (a wake-up is already pending there) or a closed sender

    def close(self) -> None:
        """Stop listening, remove this process's socket. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listener, path, thread, sender = self._listener, self._path, self._thread, self._sender
            self._listener = self._sender = None
        if listener is not None and path is not None:
            # Closing a socket does not interrupt a recv() blocked on it; a datagram does.
            with (
                contextlib.suppress(OSError),
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s,
            ):
                s.sendto(b"!", path)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=1.0)
            with contextlib.suppress(OSError):
                os.unlink(path)
            listener.close()
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only succeeds when no other process listens
        if sender is not None:
            sender.close()

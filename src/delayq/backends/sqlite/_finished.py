"""Telling other processes that jobs finished with a result (``handle.result()`` waiters).

The wake channel (:mod:`._wake`) tells of due jobs; this one, beside it, tells of
results. It uses the same kind of unix datagram sockets, in their own directory
``<db>.done/``, so a worker's wake-ups and a web app's result waits never wake each
other:

* A process waiting for a result binds one socket there (a random name, like the
  wake sockets) the first time it waits, with a daemon thread reading it; each
  datagram is job ids, one per line, handed to ``on_finished``.
* A process that committed succeeded jobs with a stored result sends their ids to
  every socket in the directory, and nothing when the directory does not exist
  (nobody ever waited on this database). A dead listener's socket is unlinked, a
  full one skipped (its waiter reads again after its pause).

A lost datagram costs latency, never a result: a waiter still reads the job after
each pause. Only results are told: a job that failed or was cancelled elsewhere is
found by that next read.

Lock rule: ``_lock`` guards ``_listener``, ``_name``, ``_thread``, ``_sender``,
``_dir_fd``, ``_deaf`` and ``_closed``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from delayq.backends.sqlite._wake import share_like_database

__all__ = ["FinishChannel"]

log = logging.getLogger("delayq.sqlite")

_SUFFIX = ".sock"
_MAX_SOCKET_PATH = 100  # as in _wake: sun_path is 104-108 bytes
_MAX_DATAGRAM = 60_000  # bytes of ids per datagram (unix datagrams carry far more)


class FinishChannel:
    """Send and receive "these jobs finished" datagrams for one database file."""

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.directory = Path(os.path.realpath(db_path) + ".done")
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._name: str | None = None
        self._thread: threading.Thread | None = None
        self._sender: socket.socket | None = None
        self._dir_fd: int | None = None
        self._deaf = False  # listening failed once: not tried again
        self._closed = False

    def _address(self, name: str, dir_fd: int) -> str:
        full = str(self.directory / name)
        if len(os.fsencode(full)) <= _MAX_SOCKET_PATH:
            return full
        return f"/proc/self/fd/{dir_fd}/{name}"

    def _open_directory(self, *, create: bool) -> int | None:
        """The directory's descriptor (``_lock`` held); None when it does not exist
        and ``create`` is False."""
        if self._dir_fd is None:
            if create:
                try:
                    self.directory.mkdir()
                except FileExistsError:
                    pass
                else:
                    share_like_database(str(self.directory), self.db_path, directory=True)
            try:
                self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        return self._dir_fd

    def listen(self, on_finished: Callable[[list[str]], None]) -> bool:
        """Hear the ids other processes send (once; later calls return at once).
        False, logged, when this process cannot (it then relies on reading again)."""
        with self._lock:
            if self._listener is not None:
                return True
            if self._closed or self._deaf:
                return False
            name = f"{uuid.uuid4().hex}{_SUFFIX}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                dir_fd = self._open_directory(create=True)
                assert dir_fd is not None
                sock.bind(self._address(name, dir_fd))
            except OSError as exc:
                sock.close()
                log.warning(
                    "delayq sqlite %s: results finished by other processes are read after "
                    "a pause, not told (%s)",
                    self.db_path,
                    exc,
                )
                self._deaf = True  # not tried again on every wait
                return False
            share_like_database(str(self.directory / name), self.db_path)
            self._listener, self._name = sock, name
            self._thread = threading.Thread(
                target=self._listen_loop,
                args=(sock, on_finished),
                name="delayq-sqlite-finished",
                daemon=True,
            )
            self._thread.start()
            return True

    def _listen_loop(self, sock: socket.socket, on_finished: Callable[[list[str]], None]) -> None:
        while True:
            try:
                data = sock.recv(65_536)
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    return
            ids = [i for i in data.decode("utf-8", "replace").split("\n") if i]
            if ids:
                try:
                    on_finished(ids)
                except Exception:
                    log.exception("delayq sqlite: telling result waiters failed")

    def send(self, job_ids: Iterable[str]) -> None:
        """Tell every listening process that these jobs finished. Never raises."""
        with self._lock:
            if self._closed:
                return
            try:
                dir_fd = self._open_directory(create=False)
                if dir_fd is None:
                    return  # nobody ever waited for a result on this database
                if self._sender is None:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                names = os.listdir(dir_fd)
            except OSError as exc:
                log.debug("delayq sqlite: cannot tell result waiters: %s", exc)
                return
            sender, own = self._sender, self._name
        names = [n for n in names if n.endswith(_SUFFIX) and n != own]
        if not names:
            return
        datagrams = _datagrams(job_ids)
        for name in names:
            for data in datagrams:
                try:
                    sender.sendto(data, self._address(name, dir_fd))
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=dir_fd)  # its process is gone
                    break
                except OSError:
                    break  # full (it reads again after its pause) or refused: not ours to fix

    def close(self) -> None:
        """Stop listening and remove this process's socket. Idempotent."""
        with self._lock:
            if self._closed and self._listener is None:
                return
            self._closed = True
            listener, name, dir_fd = self._listener, self._name, self._dir_fd
            sender = self._sender
            self._listener = self._name = self._sender = self._dir_fd = None
            thread, self._thread = self._thread, None
        if listener is not None and name is not None and dir_fd is not None:
            # Closing a socket does not interrupt a recv() blocked on it; a datagram does.
            with (
                contextlib.suppress(OSError),
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s,
            ):
                s.sendto(b"\n", self._address(name, dir_fd))
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        if listener is not None:
            listener.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        if sender is not None:
            sender.close()
        if dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(dir_fd)


def _datagrams(job_ids: Iterable[str]) -> list[bytes]:
    """The ids, one per line, in datagrams of at most ``_MAX_DATAGRAM`` bytes."""
    out: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for job_id in job_ids:
        encoded = job_id.encode()
        if part and size + len(encoded) + 1 > _MAX_DATAGRAM:
            out.append(b"\n".join(part))
            part, size = [], 0
        part.append(encoded)
        size += len(encoded) + 1
    if part:
        out.append(b"\n".join(part))
    return out

"""Frames over the pipe between the process pool and a child, both ways.

A frame is what ``multiprocessing.connection.Connection.send_bytes`` writes (a
4-byte big-endian size, ``-1`` then an 8-byte size for the huge, then the bytes),
so either end may still use the connection's own calls. Reading goes through a
:class:`FrameReader` instead: one ``read`` takes every frame the pipe holds
(answers that piled up while the reader was busy cost one system call, not
three each), and a look for more is one ``poll``, not a selector built per call
as ``Connection.poll`` does.
"""

from __future__ import annotations

import math
import os
import select
import struct
from collections import deque

__all__ = ["FrameReader", "write_frame"]

_READ_SIZE = 1 << 16
_SIZE = struct.Struct("!i")
_HUGE = struct.Struct("!Q")


def write_frame(fd: int, data: bytes) -> None:
    """Write ``data`` as one frame to ``fd`` (blocking until all of it is written)."""
    size = len(data)
    head = _SIZE.pack(size) if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _HUGE.pack(size)
    view = memoryview(head + data)
    while view:
        view = view[os.write(fd, view) :]


class FrameReader:
    """The frames read from ``fd`` and not handled yet (``frames``), in order.

    ``sentinel`` (optional) is another descriptor watched with it: a child's
    process sentinel, readable once the child ended. Used by one thread at a time.
    """

    __slots__ = ("_buf", "_fd", "_poller", "frames")

    def __init__(self, fd: int, sentinel: int | None = None) -> None:
        self._fd = fd
        self._buf = bytearray()  # read, not a whole frame yet
        self.frames: deque[bytes] = deque()
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        if sentinel is not None:
            self._poller.register(sentinel, select.POLLIN)

    def fill(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: no limit, 0: only look) for the pipe,
        then move the whole frames it holds to ``frames``. EOFError when the other
        end is gone (its writes before that are read first), or the sentinel fired
        with nothing left to read."""
        fd = self._fd
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        ready = self._poller.poll(ms)
        if not ready:
            return
        if not any(got == fd for got, _ in ready) and not any(
            got == fd for got, _ in self._poller.poll(0)
        ):
            raise EOFError  # only the sentinel: the child ended, and wrote nothing more
        data = os.read(fd, _READ_SIZE)
        if not data:
            raise EOFError
        buf = self._buf
        buf += data
        start = 0
        while len(buf) - start >= 4:
            (size,) = _SIZE.unpack_from(buf, start)
            head = 4
            if size == -1:
                if len(buf) - start < 12:
                    break
                (size,) = _HUGE.unpack_from(buf, start + 4)
                head = 12
            if len(buf) - start - head < size:
                break
            self.frames.append(bytes(buf[start + head : start + head + size]))
            start += head + size
        del buf[:start]

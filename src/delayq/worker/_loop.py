"""The event loop that async handlers run on: one daemon thread, kept alive against handlers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

__all__ = ["Cancelled", "EventLoopThread"]

log = logging.getLogger("delayq.worker")


class Cancelled(Exception):
    """Recorded as the error of an async handler that was cancelled (not by shutdown)."""


class EventLoopThread:
    """An asyncio event loop on its own daemon thread, for async handlers.

    Handler code must not end the loop: when ``run_forever`` returns or raises
    before :meth:`shutdown` (a handler called ``loop.stop()``, or a callback let
    a ``SystemExit`` escape), the loop is logged and run again, so the tasks on
    it still finish and report. ``_closing`` is only touched on the loop thread.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except BaseException:
                    log.exception("delayq worker: an error escaped the asyncio loop")
                    if self._closing:
                        return
                    continue
                if self._closing:
                    return
                log.warning("delayq worker: a handler stopped the asyncio loop; it goes on")
        finally:
            self.loop.close()

    @property
    def alive(self) -> bool:
        """True while the loop accepts work (its thread runs and it is not closed)."""
        return self._thread.is_alive() and not self.loop.is_closed()

    def shutdown(self) -> None:
        def cancel_all() -> None:
            self._closing = True
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)

        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(cancel_all)

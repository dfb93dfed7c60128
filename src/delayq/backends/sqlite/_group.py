"""Group commit: concurrent ``enqueue`` calls of one process share a transaction.

A threaded web app calls ``schedule`` from many threads at once. On
``synchronous=full`` each commit costs an fsync, so one transaction per call
caps them all at the fsync rate. Instead the first call to arrive leads: it
takes every call waiting at that moment and commits them together (the
backend's ``commit`` callback, one transaction; a conflict fails only its own
call). Calls arriving meanwhile wait for that commit to end and then go
together in the next one. Every call returns after the commit that stored it,
with its own outcomes or its own error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from delayq.errors import BackendError, DelayqError
from delayq.job import EnqueueOutcome, JobSpec

__all__ = ["EnqueueRequest", "GroupCommit"]


@dataclass(eq=False, slots=True)
class EnqueueRequest:
    """One ``enqueue`` call: its specs, then its outcomes or its error."""

    specs: list[JobSpec]
    on_conflict: str
    outcomes: list[EnqueueOutcome] | None = None
    error: BaseException | None = None
    shared: bool = False  # error is the whole group's (not this call's own conflict)
    done: bool = False


def _follower_error(exc: BaseException) -> BaseException:
    """The error a waiting call raises when the group commit it joined failed."""
    if isinstance(exc, DelayqError):
        return type(exc)(*exc.args)
    return BackendError(f"enqueue failed in the group commit it joined: {exc!r}")


class GroupCommit:
    """Leader/follower batching of enqueue requests (see the module docstring).

    ``commit(group)`` stores every request of ``group`` and sets each one's
    ``outcomes`` or ``error``; it must not raise an ``Exception``.

    Lock rule: ``_cond``'s lock guards ``_pending``, ``_leading`` and every
    request's ``done``; it is never held while committing.
    """

    def __init__(self, commit: Callable[[list[EnqueueRequest]], None]) -> None:
        self._commit = commit
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[EnqueueRequest] = []
        self._leading = False

    @property
    def leading(self) -> bool:
        """A commit is in progress."""
        return self._leading

    @property
    def waiting(self) -> int:
        """Calls waiting for the next commit."""
        return len(self._pending)

    def run(self, request: EnqueueRequest) -> list[EnqueueOutcome]:
        """Store ``request`` in this commit or the next; its outcomes, or raise its error."""
        with self._cond:
            self._pending.append(request)
            while self._leading and not request.done:
                self._cond.wait()
            if request.done:
                group: list[EnqueueRequest] = []
            else:
                self._leading = True
                group, self._pending = self._pending, []
        if group:
            try:
                self._commit(group)
            finally:
                with self._cond:
                    self._leading = False
                    for member in group:
                        member.done = True
                    self._cond.notify_all()
        error = request.error
        if error is not None:
            if request.shared and not group:
                # The whole group failed in the leader's thread: a fresh error here.
                raise _follower_error(error) from error
            raise error
        assert request.outcomes is not None
        return request.outcomes

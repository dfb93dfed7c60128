"""Scheduling after the caller's database transaction commits: ``schedule(on_commit=True)``.

A base of :class:`~delayq.app.DelayQ`. A web framework that knows the caller's
transaction installs its "run this after commit" function with
:meth:`AppCommitHook.set_commit_hook` (the Django integration installs
``django.db.transaction.on_commit``); ``schedule(..., on_commit=True)`` then
checks its arguments and chooses the job id at once (a bad argument fails the
call, and the id is returned), and stores the job only when the transaction
commits: a rolled-back transaction leaves no job. Outside a transaction the hook
runs it at once (Django's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from delayq.errors import ConfigurationError
from delayq.job import JobSpec, OnConflict

__all__ = ["AppCommitHook", "CommitHook"]

CommitHook = Callable[[Callable[[], None]], Any]
"""Runs the function it is given once the current transaction commits."""


class AppCommitHook:
    """``set_commit_hook`` and the deferred enqueue of ``schedule(on_commit=True)``."""

    _commit_hook: CommitHook | None = None

    def set_commit_hook(self, hook: CommitHook | None) -> None:
        """Install (None: remove) the function that defers ``schedule(on_commit=True)``."""
        if hook is not None and not callable(hook):
            raise ConfigurationError(f"a commit hook must be callable, got {hook!r}")
        self._commit_hook = hook

    if TYPE_CHECKING:  # DelayQ's

        def _store(
            self, specs: list[JobSpec], policy: OnConflict, connection: Any = None
        ) -> tuple[list[JobSpec], list[Any]]: ...

    def _enqueue_on_commit(self, spec: JobSpec, policy: OnConflict) -> str:
        hook = self._commit_hook
        if hook is None:
            raise ConfigurationError(
                "schedule(on_commit=True) needs a commit hook: use the Django integration "
                "(INSTALLED_APPS 'delayq.integrations.django') or app.set_commit_hook(...)"
            )

        def store() -> None:
            self._store([spec], policy)

        hook(store)
        return spec.id

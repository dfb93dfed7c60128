"""The app's flow-control limits: ``app.limit(...)``, stored in the store.

A base of :class:`~delayq.app.DelayQ`. Limits are records in the store (every
worker and process reads them in its claim step), written with compare-and-set
so two editors never silently overwrite each other.
"""

from __future__ import annotations

from delayq.backends import Backend
from delayq.backends.base import LimitStore
from delayq.errors import InvalidOption, Unsupported
from delayq.flow import Limit, Rate

__all__ = ["AppLimits"]

_WRITE_TRIES = 20  # compare-and-set retries when other editors keep writing the record


class AppLimits:
    """``limit``, ``limits`` and ``remove_limit`` of the app."""

    _backend: Backend

    def _limit_store(self) -> LimitStore:
        backend = self._backend
        if "flow_control" not in backend.features or not isinstance(backend, LimitStore):
            raise Unsupported(
                f"{backend.url} has no flow control: limits need a store with the "
                f"'flow_control' feature (memory://, sqlite://, redis://, postgresql://; "
                f"see the README's store table)"
            )
        return backend

    def limit(
        self,
        pattern: str,
        *,
        concurrency: int | None = None,
        rate: str | Rate | None = None,
        burst: int = 0,
    ) -> Limit:
        """Declare (or replace) the limit of the keys matching ``pattern``.

        ``pattern`` is a key (``"stripe:acct_1"``) or a key with ``*`` wildcards
        (``"tenant:*"``: every matching key gets its own copy of the limit; a
        key's own limit wins over its pattern's). ``concurrency`` bounds the
        jobs of one key running at once; ``rate`` (``"100/s"``, ``"5/m"``,
        ``"20/10s"``) bounds how many start per period, ``burst`` more than that
        allowed within one period. A job over its rate waits, scheduled, until
        its next allowed time (``get(job_id).throttled_until``). Stored in the
        store: every worker sees the change at its next claim. Returns the
        stored limit.
        """
        wanted = Limit(pattern, concurrency=concurrency, rate=rate, burst=burst)  # type: ignore[arg-type]
        store = self._limit_store()
        for _ in range(_WRITE_TRIES):
            current = store.get_limit(pattern)
            if store.put_limit(wanted, version=0 if current is None else current.version):
                return wanted
        raise InvalidOption(
            f"limit {pattern!r} kept changing under {_WRITE_TRIES} writes; try again"
        )

    def limits(self) -> list[Limit]:
        """Every declared limit, by pattern."""
        return [record.limit for record in self._limit_store().list_limits()]

    def remove_limit(self, pattern: str) -> bool:
        """Delete the limit of ``pattern``; False when there was none."""
        return self._limit_store().delete_limit(pattern)

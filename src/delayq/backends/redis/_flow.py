"""Flow control on Redis: the limit records (the claim that keeps them is Lua).

Everything a claim decides happens inside its script (``lua/_flow.lua``, which
describes the keys): a job of a queue that uses flow control moves from the due
set into a ready stage once due (a ZSET per priority and group, the groups of a
priority taking turns), and the claim takes ready jobs in that order, parking
those whose key is at its concurrency (until a lease of the key ends) and
giving those over their key's rate their next allowed time in the due set. The
limit records are one hash (pattern -> ``"<version>:<JSON>"``); writes and deletes are
compare-and-set scripts that also hand every parked job back to the next claim,
which decides again under the new limits. Reads are plain ``HGET`` /
``HGETALL``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from delayq.backends._limits import check_limit_args, check_pattern, check_version
from delayq.errors import BackendError
from delayq.flow import Limit, LimitRecord

if TYPE_CHECKING:
    import redis

    from delayq.backends.redis._waiting import Wakeups

__all__ = ["RedisLimits"]

T = TypeVar("T")


def _record(pattern: str, value: str) -> LimitRecord:
    version, sep, data = value.partition(":")
    if not sep or not version.isdigit():
        raise BackendError(f"limit {pattern!r} is stored in an unreadable form: {value[:80]!r}")
    return LimitRecord(Limit.from_json(data), int(version))


class RedisLimits:
    """Mixin for :class:`~delayq.backends.redis.RedisBackend`: limit records.

    Uses the host's client, keys, ``_run`` (scripts) and ``_call`` (driver errors
    become delayq errors; reads retried once).
    """

    if TYPE_CHECKING:
        _redis: redis.Redis
        _keys: dict[str, str]
        _wakes: Wakeups

        def _call(self, fn: Callable[[], T], *, retry: bool = False) -> T: ...

        def _check_open(self) -> None: ...

        def _run(self, name: str, args: Sequence[Any] = ()) -> Any: ...

    def put_limit(self, limit: Limit, *, version: int) -> int | None:
        limit, version = check_limit_args(limit, version)
        reply = self._run("put_limit", [limit.pattern, version, limit.to_json()])
        self._wakes.woke(reply[1])
        return None if int(reply[0]) < 0 else int(reply[0])

    def get_limit(self, pattern: str) -> LimitRecord | None:
        pattern = check_pattern(pattern)
        self._check_open()
        value: Any = self._call(lambda: self._redis.hget(self._keys["limits"], pattern), retry=True)
        return None if value is None else _record(pattern, str(value))

    def list_limits(self) -> list[LimitRecord]:
        self._check_open()
        values: Any = self._call(lambda: self._redis.hgetall(self._keys["limits"]), retry=True)
        return [_record(str(p), str(v)) for p, v in sorted(dict(values).items())]

    def delete_limit(self, pattern: str, *, version: int | None = None) -> bool:
        pattern = check_pattern(pattern)
        expected = "" if version is None else str(check_version(version))
        reply = self._run("delete_limit", [pattern, expected])
        self._wakes.woke(reply[1])
        return int(reply[0]) > 0

"""Schedule records on Redis (the ``recurring`` feature): one hash under the queue's tag.

``P:{Q}:schedules`` is a HASH: field = schedule name, value =
``"<version>:<definition JSON>"``. It shares the queue's hash tag, so it sits
in the same cluster slot as the queue's jobs. Compare-and-set writes and
deletes are one small Lua script each (below), so two editors on two hosts
never overwrite each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from delayq.backends._schedules import check_schedule_args, check_schedule_name, check_version
from delayq.backends.base import ScheduleRecord
from delayq.errors import BackendError

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

__all__ = ["RedisSchedules"]

T = TypeVar("T")

# KEYS[1] schedules hash; ARGV[1] name, ARGV[2] expected version (0: absent),
# ARGV[3] data. Returns the new version, or -1 when the stored version differs.
_PUT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local version = 0
if cur then version = tonumber(string.match(cur, '^(%d+):')) end
if version ~= tonumber(ARGV[2]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], (version + 1) .. ':' .. ARGV[3])
return version + 1
"""

# KEYS[1] schedules hash; ARGV[1] name, ARGV[2] expected version ('' = any).
# Returns 1 when deleted, 0 otherwise.
_DELETE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
if ARGV[2] ~= '' and tonumber(string.match(cur, '^(%d+):')) ~= tonumber(ARGV[2]) then
    return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


def _record(name: str, value: str) -> ScheduleRecord:
    version, sep, data = value.partition(":")
    if not sep or not version.isdigit():
        raise BackendError(f"schedule {name!r} is stored in an unreadable form: {value[:80]!r}")
    return ScheduleRecord(name, data, int(version))


class RedisSchedules:
    """Mixin for :class:`~delayq.backends.redis.RedisBackend`: schedule records.

    Uses the host's client (``_redis``), key prefix and queue, and its
    ``_call`` (driver errors become delayq errors; reads retried once).
    """

    if TYPE_CHECKING:
        _redis: redis.Redis
        prefix: str
        queue: str

        def _call(self, fn: Callable[[], T], *, retry: bool = False) -> T: ...

        def _check_open(self) -> None: ...

    _schedule_scripts: tuple[Script, Script] | None = None

    def _schedules_key(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}:schedules"

    def _scripts_for_schedules(self) -> tuple[Script, Script]:
        scripts = self._schedule_scripts
        if scripts is None:  # a race registers twice: harmless, both are equal
            scripts = (self._redis.register_script(_PUT), self._redis.register_script(_DELETE))
            self._schedule_scripts = scripts
        return scripts

    def put_schedule(self, name: str, data: str, *, version: int) -> int | None:
        name, data, version = check_schedule_args(name, data, version)
        self._check_open()
        put, _ = self._scripts_for_schedules()
        reply: Any = self._call(
            lambda: put(keys=[self._schedules_key()], args=[name, version, data])
        )
        return None if int(reply) < 0 else int(reply)

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        name = check_schedule_name(name)
        self._check_open()
        value: Any = self._call(lambda: self._redis.hget(self._schedules_key(), name), retry=True)
        return None if value is None else _record(name, str(value))

    def list_schedules(self) -> list[ScheduleRecord]:
        self._check_open()
        values: Any = self._call(lambda: self._redis.hgetall(self._schedules_key()), retry=True)
        return [_record(str(k), str(v)) for k, v in sorted(dict(values).items())]

    def delete_schedule(self, name: str, *, version: int | None = None) -> bool:
        name = check_schedule_name(name)
        expected = "" if version is None else str(check_version(version))
        self._check_open()
        _, delete = self._scripts_for_schedules()
        reply: Any = self._call(lambda: delete(keys=[self._schedules_key()], args=[name, expected]))
        return int(reply) > 0

"""Arguments -> :class:`~delayq.job.JobSpec`: the checks of every job an app stores.

The hot path of scheduling: :class:`JobBuilder` (a base of
:class:`~delayq.app.DelayQ`, so a call costs no extra frame) validates one job or a
batch into specs in a fixed order (id, name, payload, due time, max_attempts,
backoff, misfire). Plain JSON payloads skip the checking walk
(:func:`_is_plain`), a batch draws its ids from one source (:class:`_BatchIds`)
and parses an option object it has already seen once (:func:`_parsed`).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from delayq._validate import (
    MAX_ATTEMPTS,
    MAX_DELAY,
    check_datetime,
    check_duration,
    check_int,
    check_job_id,
    check_list_cursor,
    utf8_problem,
)
from delayq.backoff import Backoff, ExponentialBackoff, ScheduleBackoff, backoff_from_spec
from delayq.codec import encode_payload
from delayq.errors import ConfigurationError, InvalidDelay, InvalidInput, InvalidOption
from delayq.flow import check_flow_key, check_priority
from delayq.job import JobSpec, Misfire

__all__ = [
    "MAX_ATTEMPTS",
    "BackoffArg",
    "JobBuilder",
    "MisfireArg",
    "WhenArg",
    "check_name",
    "is_async_callable",
    "takes_context",
]

MAX_NAME_LENGTH = 200

BackoffArg = Backoff | Mapping[str, Any] | str | Sequence[float] | None
MisfireArg = Misfire | str | float | int | None
WhenArg = datetime | float | int

_SCHEDULE_KEYS = frozenset(
    {
        "name",
        "payload",
        "delay",
        "at",
        "job_id",
        "max_attempts",
        "backoff",
        "misfire",
        "key",
        "priority",
        "group",
    }
)


def check_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str):
        raise InvalidOption(f"{field} must be a str, got {type(value).__name__}")
    problem = _name_problem(value)
    if problem is not None:
        raise InvalidOption(f"{field} {problem}")
    return value


@functools.lru_cache(maxsize=4096)  # names repeat and scheduling is hot
def _name_problem(value: str) -> str | None:
    if not value.strip():
        return f"must be a non-empty handler name, got {value!r}"
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters; at most {MAX_NAME_LENGTH} are allowed"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return f"must not contain control characters, got {value!r}"
    return utf8_problem(value)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for an async function, a callable instance with an async ``__call__``,
    or a sync wrapper (``functools.wraps``) around either: such a wrapper returns
    the coroutine, which the worker must await, not drop."""
    try:
        inner = inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle
        inner = fn
    for candidate in (fn, inner) if inner is not fn else (fn,):
        if inspect.iscoroutinefunction(candidate):
            return True
        call = getattr(type(candidate), "__call__", None)  # noqa: B004 - callable instances
        if call is not None and inspect.iscoroutinefunction(call):
            return True
    return False


def takes_context(name: str, fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"handler {name!r}: cannot read the signature of {fn!r}; wrap it in a function "
            f"taking (payload) or (payload, ctx)"
        ) from exc
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    required = [p for p in positional if p.default is p.empty]
    required_kw = [
        p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if len(required) > 2 or required_kw or (not positional and not var_positional):
        raise ConfigurationError(
            f"handler {name!r}: {getattr(fn, '__qualname__', fn)!r}{sig} must accept "
            f"(payload) or (payload, ctx)"
        )
    return len(positional) >= 2 or var_positional


def _id_prefix(now: float) -> str:
    return f"{int(now * 1_000_000) & (1 << 56) - 1:014x}"


def _new_id(now: float) -> str:
    """A new job id: 32 hex digits, the creation time in microseconds then 72 random bits.

    Like a ULID, ids sort by creation time, so a store's id index grows at its
    end instead of splitting random pages (much faster inserts into big tables).
    """
    return _id_prefix(now) + os.urandom(9).hex()


class _BatchIds:
    """New job ids for one ``schedule_many`` call: the ids of :func:`_new_id`, with
    the time prefix computed once (one ``now`` per batch) and the random bits
    read from the OS 256 ids at a time instead of one system call per id."""

    __slots__ = ("_hex", "_pos", "_prefix")

    _CHUNK = 256 * 18  # hex digits: 256 ids of 72 random bits

    def __init__(self, now: float) -> None:
        self._prefix = _id_prefix(now)
        self._hex = ""
        self._pos = 0

    def next(self) -> str:
        pos = self._pos
        if pos >= len(self._hex):
            self._hex = os.urandom(self._CHUNK // 2).hex()
            pos = 0
        self._pos = pos + 18
        return self._prefix + self._hex[pos : pos + 18]


_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_PLAIN_DEPTH = 100
_encode_plain = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
).encode


def _is_plain(value: object, depth: int = 0) -> bool:
    """True when ``value`` is built only of the exact types dict (with str keys),
    list, tuple, str, int, float, bool and None, at most ``_PLAIN_DEPTH`` deep.

    Such a payload needs no checking walk: ``json`` encodes it exactly as
    :func:`~delayq.codec.encode_payload` would, and only a NaN or infinity can
    still fail (``allow_nan=False`` raises). The type checks run in C (sets of
    ``type`` over a container), so a flat dict costs about a microsecond.
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    items: Iterable[object]
    if kind is dict:
        if not _STR.issuperset(map(type, value)):  # type: ignore[call-overload]
            return False
        items = value.values()  # type: ignore[attr-defined]
    elif kind is list or kind is tuple:
        items = value  # type: ignore[assignment]
    else:
        return False
    if _SCALARS.issuperset(map(type, items)):
        return True
    return all(_is_plain(item, depth + 1) for item in items)


_IMMUTABLE_OPTIONS = (str, int, float, Misfire, ExponentialBackoff, ScheduleBackoff)


def _parsed(
    cache: dict[int, tuple[object, Any]] | None, value: object, parse: Callable[[object], Any]
) -> Any:
    """``parse(value)``, remembered in ``cache`` (one batch) by the identity of an
    immutable ``value``: the cache holds the value itself, so its id is not reused."""
    if cache is None or not isinstance(value, _IMMUTABLE_OPTIONS):
        return parse(value)
    hit = cache.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    result = parse(value)
    cache[id(value)] = (value, result)
    return result


class JobBuilder:
    """Validation of job arguments into specs, with the app's job defaults.

    A base class of :class:`~delayq.app.DelayQ`, which sets the four defaults
    below in its constructor; every method only reads them.
    """

    max_payload_bytes: int
    _default_max_attempts: int
    _default_backoff: dict[str, Any]
    _default_misfire: str
    _no_flow_control: str | None  # the store's URL when it has no flow control, else None

    def _build_batch(self, jobs: Iterable[Mapping[str, Any]], now: float) -> list[JobSpec]:
        """Validate ``schedule_many``'s items into specs; an error names the item."""
        specs: list[JobSpec] = []
        seen: set[str] = set()
        ids = _BatchIds(now)
        options: dict[int, tuple[object, Any]] = {}  # parsed backoff / misfire, by identity
        for i, item in enumerate(jobs):
            try:
                if type(item) is not dict and not isinstance(item, Mapping):
                    raise InvalidOption(
                        f"each job must be a mapping of schedule() arguments, "
                        f"got {type(item).__name__}"
                    )
                if not _SCHEDULE_KEYS.issuperset(item):
                    unknown = set(item) - _SCHEDULE_KEYS
                    raise InvalidOption(
                        f"unknown key(s) {sorted(unknown)}; accepted: {sorted(_SCHEDULE_KEYS)}"
                    )
                if "name" not in item:
                    raise InvalidOption("missing the handler 'name'")
                spec = self._build(
                    item["name"],
                    item.get("payload"),
                    delay=item.get("delay"),
                    at=item.get("at"),
                    job_id=item.get("job_id"),
                    max_attempts=item.get("max_attempts"),
                    backoff=item.get("backoff"),
                    misfire=item.get("misfire"),
                    key=item.get("key"),
                    priority=item.get("priority"),
                    group=item.get("group"),
                    now=now,
                    ids=ids,
                    options=options,
                )
                if spec.id in seen:
                    raise InvalidOption(f"job_id {spec.id!r} appears more than once in the batch")
            except InvalidInput as exc:
                raise type(exc)(f"jobs[{i}]: {exc}") from exc
            seen.add(spec.id)
            specs.append(spec)
        return specs

    def _build(
        self,
        name: object,
        payload: Any,
        *,
        delay: Any,
        at: Any,
        job_id: Any,
        max_attempts: Any,
        backoff: Any,
        misfire: Any,
        now: float,
        key: Any = None,
        priority: Any = None,
        group: Any = None,
        ids: _BatchIds | None = None,
        options: dict[int, tuple[object, Any]] | None = None,
    ) -> JobSpec:
        """Validate one job into a spec (checks in this order: id, name, payload,
        due time, max_attempts, backoff, misfire, key, priority, group).

        ``ids`` and ``options`` speed up a batch: ids drawn from one source, and
        backoff / misfire values that are the very same immutable object as an
        earlier item's parsed only once.
        """
        if delay is None and at is None:
            delay = 0.0  # neither: due now, on the store's clock like any delay
        if job_id is not None:
            job_id = check_job_id(job_id)
        elif ids is not None:
            job_id = ids.next()
        else:
            job_id = _new_id(now)
        return JobSpec(
            id=job_id,
            name=check_name(name),
            payload=self._encode(payload),
            run_at=(run_at := self._run_at(delay, at, now)),
            max_attempts=(
                self._default_max_attempts
                if max_attempts is None
                else self._check_max_attempts(max_attempts)
            ),
            backoff=(
                self._default_backoff
                if backoff is None
                else _parsed(options, backoff, self._backoff_spec)
            ),
            misfire=(
                self._default_misfire
                if misfire is None
                else _parsed(options, misfire, self._misfire_spec)
            ),
            created_at=now,
            # delay= is relative on the STORE's clock (a skewed producer clock
            # must not move it); run_at is then only this host's estimate.
            delay=None if at is not None else run_at - now,
            **(
                {}
                if key is None
                and group is None
                and (priority is None or (priority.__class__ is int and not priority))
                else self._flow_fields(key, priority, group)
            ),
        )

    def _flow_fields(self, key: object, priority: object, group: object) -> dict[str, Any]:
        """The checked ``key``, ``priority`` and ``group`` of a job (flow control)."""
        fields = {
            "key": check_flow_key(key, "key"),
            "priority": 0 if priority is None else check_priority(priority),
            "group": check_flow_key(group, "group"),
        }
        if self._no_flow_control is not None and (
            fields["key"] is not None or fields["priority"] or fields["group"] is not None
        ):
            raise InvalidOption(
                f"key=, priority= and group= need a store with flow control; "
                f"{self._no_flow_control} has none (memory://, sqlite://, redis://, "
                f"postgresql://; see the README's store table)"
            )
        return fields

    def _encode(self, payload: Any) -> str:
        """``payload`` as compact JSON text, size-checked.

        Plain JSON data (the usual case) is encoded at once without the checking
        walk of :func:`~delayq.codec.encode_payload`, which gives the same text;
        anything else, and every error, takes that checked path, so bad input
        gets the same message naming what is wrong.
        """
        if _is_plain(payload):
            try:
                text = _encode_plain(payload)
            except ValueError:
                pass  # NaN or infinity: the checked path names where
            else:
                limit = self.max_payload_bytes
                if text.isascii():  # O(1): a flag of the str
                    if len(text) <= limit:
                        return text
                else:
                    try:
                        if len(text.encode("utf-8")) <= limit:
                            return text
                    except UnicodeEncodeError:
                        pass  # a lone surrogate: the checked path names where
        return encode_payload(payload, max_bytes=self.max_payload_bytes)

    def _run_at(self, delay: object, at: object, now: float) -> float:
        if at is None and (type(delay) is float or (type(delay) is int and -1e300 < delay < 1e300)):
            # The hot path (a plain number of seconds); anything unusual below.
            seconds = float(delay)
            if math.isfinite(seconds) and seconds <= MAX_DELAY:
                return now + max(0.0, seconds)
        if (delay is None) == (at is None):
            raise InvalidOption(
                "give exactly one of delay= (seconds from now) or at= (an aware datetime or "
                "epoch seconds)"
            )
        if delay is not None:
            seconds = check_duration(delay, "delay")
            if seconds > MAX_DELAY:
                raise InvalidDelay(
                    f"delay must be at most {MAX_DELAY:.0f} seconds (100 years), got {delay!r}"
                )
            # A delay <= 0 means "due now"; clamping keeps FIFO order among such jobs.
            return now + max(0.0, seconds)
        when = check_datetime(at, "at")
        if when - now > MAX_DELAY:
            raise InvalidDelay(f"at must be within 100 years from now, got {at!r}")
        # A past due time means "due now" (not "overdue": that would trip misfire policies).
        return max(now, when)

    @staticmethod
    def _check_max_attempts(value: object) -> int:
        return check_int(value, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS)

    @staticmethod
    def _id_list(job_ids: object) -> Iterable[object]:
        """``job_ids`` as an iterable of ids; a bare str is refused, not split into
        characters (``purge_dead(job_ids="order-17")`` would purge ids "o", "r", ...)."""
        if isinstance(job_ids, str | bytes):
            one = job_ids if isinstance(job_ids, str) else job_ids.decode("utf-8", "replace")
            raise InvalidOption(
                f"job_ids must be a list of ids, got the {type(job_ids).__name__} "
                f"{job_ids!r}; for one id write job_ids=[{one!r}]"
            )
        if not isinstance(job_ids, Iterable):
            raise InvalidOption(
                f"job_ids must be a list of ids, got {type(job_ids).__name__} {job_ids!r}"
            )
        return job_ids

    @staticmethod
    def _cursor(after: object) -> tuple[float, str] | None:
        cursor = check_list_cursor(after)
        return None if cursor is None else (cursor[0], check_job_id(cursor[1]))

    @staticmethod
    def _backoff_spec(value: object) -> dict[str, Any]:
        if not isinstance(value, Backoff | Mapping | str | list | tuple) and value is not None:
            raise InvalidOption(
                f"backoff must be a Backoff policy, a spec dict, '2s,5s,10s,20s' or a list of "
                f"seconds; got {value!r}"
            )
        try:
            policy = backoff_from_spec(value)
            spec = policy.to_spec()
            backoff_from_spec(spec)  # a worker must be able to read it back
        except InvalidInput as exc:
            raise InvalidOption(f"backoff: {exc}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidOption(
                f"backoff must be a Backoff policy, a spec dict, '2s,5s,10s,20s' or a list of "
                f"seconds; got {value!r}"
            ) from exc
        return spec

    @staticmethod
    def _misfire_spec(value: object) -> str:
        return Misfire.parse(value).to_spec()  # type: ignore[arg-type]

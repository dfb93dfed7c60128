"""Flow control: the value types of limits and the arithmetic every store shares.

A job may carry a flow ``key`` (``"tenant:42"``, ``"stripe:acct_1"``), a
``priority`` and a fair-share ``group``. Limits are records kept in the store
(:class:`Limit`, edited with compare-and-set like recurring schedules): a limit's
``pattern`` is a key, or a key with ``*`` wildcards that gives every matching key
its own copy of the limit (``"tenant:*"`` with ``concurrency=2`` lets each tenant
run two jobs at once). A key's own record wins over any pattern; among patterns
the most specific (the longest literal text) wins.

Each store enforces the limits inside its own atomic claim step:

* ``concurrency``: at most that many live leases of the key at once; a due job
  over it is passed over (other keys' jobs are claimed in its place) and claimed
  once a slot frees.
* ``rate`` (``"100/s"``, ``"5/m"``, ``"20/10s"``) with ``burst``: a generic cell
  rate algorithm (:func:`admit_rate`) on one "theoretical arrival time" per key.
  In any window of one period at most ``count + burst`` jobs of the key start;
  a due job over it is given its next allowed time (``Job.throttled_until``) and
  waits as a scheduled job until then.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from delayq.errors import InvalidOption

__all__ = [
    "MAX_FLOW_KEY_LENGTH",
    "MAX_PRIORITY",
    "Admissions",
    "Limit",
    "LimitRecord",
    "Rate",
    "admit_rate",
    "check_flow_key",
    "check_priority",
    "group_turns",
    "pick_limit",
]

MAX_FLOW_KEY_LENGTH = 255
MAX_PRIORITY = 1_000_000
"""Priorities are ints in ``-MAX_PRIORITY ..= MAX_PRIORITY`` (higher runs first)."""
MAX_CONCURRENCY = 1_000_000
MAX_BURST = 1_000_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def check_flow_key(value: object, field: str) -> str | None:
    """A flow key or group (``key=``, ``group=``): None, or 1-255 characters of
    text without control characters. ``*`` is refused in a job's key (it is the
    wildcard of limit patterns)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidOption(f"{field} must be a string or None, got {type(value).__name__}")
    if not value or len(value) > MAX_FLOW_KEY_LENGTH:
        raise InvalidOption(
            f"{field} must be 1 to {MAX_FLOW_KEY_LENGTH} characters, got {len(value)}"
        )
    if _CONTROL.search(value):
        raise InvalidOption(f"{field} must not contain control characters, got {value!r}")
    if "*" in value:
        raise InvalidOption(f"{field} must not contain '*' (the wildcard of limits), got {value!r}")
    return value


def check_priority(value: object) -> int:
    """A job's ``priority``: an int in ``-MAX_PRIORITY ..= MAX_PRIORITY``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"priority must be an int, got {value!r}")
    if not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidOption(
            f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {value}"
        )
    return value


def _check_count(value: object, field: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{field} must be an int, got {value!r}")
    if not minimum <= value <= maximum:
        raise InvalidOption(f"{field} must be between {minimum} and {maximum}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` jobs per ``period`` seconds; parse one with :meth:`parse`."""

    count: int
    period: float

    def __post_init__(self) -> None:
        _check_count(self.count, "rate count", 1, 10**9)
        period = self.period
        if (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not math.isfinite(period)
            or not 0 < period <= 366 * 86400
        ):
            raise InvalidOption(f"rate period must be > 0 and at most a year, got {period!r}")
        object.__setattr__(self, "period", float(period))

    @classmethod
    def parse(cls, value: object) -> Rate:
        """``"100/s"``, ``"5/m"``, ``"1000/h"``, ``"20/10s"`` (count per period)."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, str):
            raise InvalidOption(f"rate must be text like '100/s' or '20/10s', got {value!r}")
        found = _RATE.match(value)
        if found is None:
            raise InvalidOption(
                f"rate must be <count>/<unit> with unit s, m, h or d (e.g. '100/s', "
                f"'20/10s'), got {value!r}"
            )
        count, many, unit = found.groups()
        return cls(int(count), float(many or 1) * _UNITS[unit])

    @property
    def interval(self) -> float:
        """Seconds between two jobs at the steady rate."""
        return self.period / self.count

    def __str__(self) -> str:
        for unit, seconds in _UNITS.items():
            if self.period == seconds:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.period:g}s"


@dataclass(frozen=True, slots=True)
class Limit:
    """A flow-control limit on the keys matching ``pattern``.

    ``concurrency``: live leases at once per key (None: no bound). ``rate``:
    starts per period per key (None: no bound); ``burst``: how many more than
    ``rate.count`` may start within one period (0 by default: the starts are
    spaced evenly). A limit with neither bound is refused.
    """

    pattern: str
    concurrency: int | None = None
    rate: Rate | None = None
    burst: int = 0

    def __post_init__(self) -> None:
        pattern = self.pattern
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_FLOW_KEY_LENGTH:
            raise InvalidOption(
                f"a limit's pattern must be 1 to {MAX_FLOW_KEY_LENGTH} characters, got {pattern!r}"
            )
        if _CONTROL.search(pattern):
            raise InvalidOption(
                f"a limit's pattern must not contain control characters: {pattern!r}"
            )
        if self.concurrency is not None:
            _check_count(self.concurrency, "concurrency", 1, MAX_CONCURRENCY)
        if self.rate is not None:
            object.__setattr__(self, "rate", Rate.parse(self.rate))
        _check_count(self.burst, "burst", 0, MAX_BURST)
        if self.rate is None and self.burst:
            raise InvalidOption("burst is only for a limit with a rate")
        if self.concurrency is None and self.rate is None:
            raise InvalidOption(f"limit {pattern!r} needs concurrency=, rate= or both")

    @property
    def is_pattern(self) -> bool:
        return "*" in self.pattern

    def matches(self, key: str) -> bool:
        """True when this limit applies to ``key``."""
        return key == self.pattern or (
            self.is_pattern and _regex(self.pattern).match(key) is not None
        )

    def to_json(self) -> str:
        """The stored form (what every store keeps and reads in its claim step)."""
        data: dict[str, Any] = {"pattern": self.pattern}
        if self.concurrency is not None:
            data["concurrency"] = self.concurrency
        if self.rate is not None:
            data["rate_count"] = self.rate.count
            data["rate_period"] = self.rate.period
            data["burst"] = self.burst
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Limit:
        data = json.loads(text)
        rate = None
        if "rate_count" in data:
            rate = Rate(int(data["rate_count"]), float(data["rate_period"]))
        return cls(
            str(data["pattern"]),
            concurrency=data.get("concurrency"),
            rate=rate,
            burst=int(data.get("burst", 0)),
        )

    def describe(self) -> str:
        """One line for the CLI and the dashboard: ``tenant:* concurrency 2, rate 100/s + 20``."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}" + (f" burst {self.burst}" if self.burst else ""))
        return f"{self.pattern}: {', '.join(parts)}"


@dataclass(frozen=True, slots=True)
class LimitRecord:
    """A stored limit and its version (1 when created, one more per write)."""

    limit: Limit
    version: int


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern))
        + r"\Z",
        re.DOTALL,
    )


def _specificity(limit: Limit) -> tuple[int, int, str]:
    return (0 if limit.is_pattern else 1, len(limit.pattern.replace("*", "")), limit.pattern)


def pick_limit(limits: list[Limit], key: str) -> Limit | None:
    """The limit that applies to ``key``: its own record, else the most specific
    matching pattern (longest literal text, then the greatest pattern text)."""
    best: Limit | None = None
    for limit in limits:
        if limit.matches(key) and (best is None or _specificity(limit) > _specificity(best)):
            best = limit
    return best


def admit_rate(tat: float | None, now: float, rate: Rate, burst: int) -> tuple[bool, float]:
    """One start of a rate-limited key at ``now`` (generic cell rate algorithm).

    ``tat`` is the key's stored theoretical arrival time (None: never started).
    Returns ``(True, new_tat)`` when the start is allowed (store ``new_tat``),
    else ``(False, next_allowed)``: the earliest time the start would be allowed.
    """
    interval = rate.interval
    tolerance = burst * interval
    arrival = now if tat is None or tat < now else tat
    allowed_at = arrival - tolerance
    if allowed_at > now:
        return False, allowed_at
    return True, arrival + interval


RateState = tuple[float | None, float | None]
"""A key's stored rate state: (theoretical arrival time, next moment promised to a
throttled job); None where never set."""


class Admissions:
    """One claim step's decisions on the keys it meets, for a store that reads the
    keys' state (live leases, rate state) first and writes back :meth:`rate_rows`.

    ``running`` and ``rates`` hold what the store read; a key missing from them
    is asked of :meth:`_load_running` / :meth:`_load_rate` (a store that reads
    lazily overrides them; by default a missing key has none). A job over the
    rate is given the next free moment after those already promised to the key's
    other throttled jobs, so a backlog is spread over the coming slots.
    """

    def __init__(
        self,
        limits: list[Limit],
        running: dict[str, int] | None = None,
        rates: dict[str, RateState] | None = None,
    ) -> None:
        self._limits = limits
        self._by_key: dict[str, Limit | None] = {}
        self._running = {} if running is None else running
        self._rates = {} if rates is None else rates
        self._dirty: set[str] = set()

    def _load_running(self, key: str) -> int:
        return 0

    def _load_rate(self, key: str) -> RateState:
        return None, None

    def seed(self, key: str, running: int, rate: RateState) -> None:
        """What the store read of ``key`` (its live leases and rate state)."""
        self._running[key] = running
        self._rates[key] = rate

    def limit_of(self, key: str) -> Limit | None:
        if key not in self._by_key:
            self._by_key[key] = pick_limit(self._limits, key)
        return self._by_key[key]

    def running(self, key: str) -> int:
        if key not in self._running:
            self._running[key] = self._load_running(key)
        return self._running[key]

    def _rate(self, key: str) -> RateState:
        if key not in self._rates:
            self._rates[key] = self._load_rate(key)
        return self._rates[key]

    def room(self, key: str) -> int | None:
        """How many more jobs of ``key`` may hold a lease (None: no bound)."""
        limit = self.limit_of(key)
        if limit is None or limit.concurrency is None:
            return None
        return max(0, limit.concurrency - self.running(key))

    def decide(self, key: str, now: float) -> tuple[bool, float | None]:
        """(may start now; else its next allowed time, or None: at its concurrency)."""
        limit = self.limit_of(key)
        if limit is None:
            return True, None
        if limit.concurrency is not None and self.running(key) >= limit.concurrency:
            return False, None
        if limit.rate is not None:
            tat, promised = self._rate(key)
            allowed, at = admit_rate(tat, now, limit.rate, limit.burst)
            if not allowed:
                at = max(at, promised if promised is not None else at)
                self._rates[key] = (tat, at + limit.rate.interval)
                self._dirty.add(key)
                return False, at
        return True, None

    def start(self, key: str, now: float) -> None:
        """Record a start :meth:`decide` allowed: a lease and a rate step."""
        self._running[key] = self.running(key) + 1
        limit = self.limit_of(key)
        if limit is not None and limit.rate is not None:
            tat, promised = self._rate(key)
            _ok, new_tat = admit_rate(tat, now, limit.rate, limit.burst)
            self._rates[key] = (new_tat, promised)
            self._dirty.add(key)

    def rate_rows(self) -> list[tuple[str, float | None, float | None]]:
        """The rate states this step changed: ``(key, tat, promised)``, by key."""
        return [(key, *self._rates[key]) for key in sorted(self._dirty)]


def group_turns(served: dict[str, int]) -> dict[str, int]:
    """Each group's place in the turn from its claims so far: the fewest claims go
    first, and a group that was away (far fewer claims) joins just behind the
    others rather than taking every turn until it caught up. A store orders a
    group's ``n``-th due job (``n`` from 0) at ``turn + n``."""
    if not served:
        return {}
    top = max(served.values())
    return {group: max(count, top - 1) for group, count in served.items()}

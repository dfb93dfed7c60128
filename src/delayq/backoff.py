"""Retry backoff policies.

A policy answers one question: after attempt ``n`` (1-based) failed, how many
seconds until attempt ``n + 1``? Policies are plain data so durable backends can
store them with the job (:meth:`Backoff.to_spec` / :func:`backoff_from_spec`).

* :class:`ExponentialBackoff`: ``base * factor ** (n - 1)``, capped, with optional
  jitter drawn from an injected ``random.Random`` (so tests are exact).
* :class:`ScheduleBackoff`: an explicit list, ``[2, 5, 10, 20]`` or
  ``"2s,5s,10s,20s"``; attempts past the end reuse the last delay.

Any attempt number works: ``delay(10**6)`` returns the cap, it never overflows.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from delayq._validate import check_int, check_seconds
from delayq.errors import InvalidOption

__all__ = [
    "Backoff",
    "ExponentialBackoff",
    "ScheduleBackoff",
    "backoff_from_spec",
    "parse_duration",
]

Jitter = Literal["none", "full", "equal"]


@runtime_checkable
class Backoff(Protocol):
    """Seconds to wait after failed attempt ``attempt`` (1-based) before the next."""

    def delay(self, attempt: int) -> float: ...

    def to_spec(self) -> dict[str, Any]:
        """A JSON-serialisable description, read back by :func:`backoff_from_spec`."""
        ...


def _check_attempt(attempt: int) -> int:
    return check_int(attempt, "attempt", minimum=1)


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """``min(cap, base * factor ** (attempt - 1))`` seconds, with optional jitter.

    ``jitter="full"`` draws uniformly from ``[0, d]``, ``"equal"`` from
    ``[d/2, d]`` (AWS's names); ``rng`` makes the draw reproducible.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: Jitter = "none"
    rng: random.Random | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        base = check_seconds(self.base, "base")
        cap = check_seconds(self.cap, "cap")
        factor = check_seconds(self.factor, "factor")
        if base < 0:
            raise InvalidOption(f"base must be >= 0 seconds, got {self.base!r}")
        if cap < base:
            raise InvalidOption(f"cap must be >= base ({self.base!r}), got {self.cap!r}")
        if factor < 1:
            raise InvalidOption(f"factor must be >= 1, got {self.factor!r}")
        if self.jitter not in ("none", "full", "equal"):
            raise InvalidOption(f"jitter must be 'none', 'full' or 'equal', got {self.jitter!r}")

    def delay(self, attempt: int) -> float:
        n = _check_attempt(attempt) - 1
        if self.base == 0:
            d = 0.0
        elif self.factor == 1:
            d = min(self.cap, self.base)
        else:
            # Compare exponents instead of computing factor**n, which overflows.
            limit = math.log(self.cap / self.base, self.factor) if self.cap > 0 else 0.0
            d = self.cap if n >= limit else min(self.cap, self.base * self.factor**n)
        if self.jitter == "none" or d == 0:
            return d
        rng = self.rng if self.rng is not None else random
        if self.jitter == "full":
            return rng.uniform(0.0, d)
        return d / 2 + rng.uniform(0.0, d / 2)

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "exponential",
            "base": self.base,
            "factor": self.factor,
            "cap": self.cap,
            "jitter": self.jitter,
        }


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Parse ``"250ms"``, ``"2s"``, ``"5m"``, ``"1.5h"``, ``"1d"`` or ``"3"`` (seconds)."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidOption(
            f"cannot read {text!r} as a duration; use a number with an optional unit "
            f"ms, s, m, h or d (e.g. '250ms', '2s', '5m')"
        )
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(frozen=True, slots=True)
class ScheduleBackoff:
    """An explicit schedule: the n-th retry waits ``delays[n - 1]`` seconds.

    ``ScheduleBackoff.parse("2s,5s,10s,20s")`` equals ``ScheduleBackoff((2, 5, 10, 20))``.
    """

    delays: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.delays:
            raise InvalidOption("a backoff schedule needs at least one delay")
        checked = tuple(check_seconds(d, "backoff delay") for d in self.delays)
        if any(d < 0 for d in checked):
            raise InvalidOption(f"backoff delays must be >= 0 seconds, got {self.delays!r}")
        object.__setattr__(self, "delays", checked)

    @classmethod
    def parse(cls, spec: str | Iterable[float]) -> ScheduleBackoff:
        if isinstance(spec, str):
            parts = [p for p in spec.split(",") if p.strip()]
            return cls(tuple(parse_duration(p) for p in parts))
        return cls(tuple(spec))

    def delay(self, attempt: int) -> float:
        n = _check_attempt(attempt)
        return self.delays[min(n, len(self.delays)) - 1]

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "schedule", "delays": list(self.delays)}


def backoff_from_spec(spec: Backoff | Mapping[str, Any] | str | Iterable[float] | None) -> Backoff:
    """Build a policy from what users and stores give: a policy, a spec dict,
    ``"2s,5s,10s,20s"``, ``[2, 5, 10, 20]``, or None (the default exponential)."""
    if spec is None:
        return ExponentialBackoff()
    if isinstance(spec, Backoff):
        return spec
    if isinstance(spec, str):
        return ScheduleBackoff.parse(spec)
    if isinstance(spec, Mapping):
        kind = spec.get("kind")
        if kind == "exponential":
            return ExponentialBackoff(
                base=spec.get("base", 1.0),
                factor=spec.get("factor", 2.0),
                cap=spec.get("cap", 3600.0),
                jitter=spec.get("jitter", "none"),
            )
        if kind == "schedule":
            return ScheduleBackoff.parse(spec.get("delays", ()))
        raise InvalidOption(f"unknown backoff kind {kind!r}; expected 'exponential' or 'schedule'")
    try:
        return ScheduleBackoff.parse(spec)
    except TypeError as exc:
        raise InvalidOption(f"cannot use {spec!r} as a backoff policy") from exc

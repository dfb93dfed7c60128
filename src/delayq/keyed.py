"""Keyed jobs: debounce with a max wait, throttle, unique, append. The policy
values and the one decision every store applies in its own atomic step.

A keyed call names a ``key`` (the ``job_id`` given to ``schedule``) and a
:class:`KeyPolicy`. The store keeps one :class:`KeyState` per key: the key's
mode, its *current* job (the one later calls act on) and its counters. The
current job's id is the key for the first run and ``<key>#<n>`` for the n-th, so
a running job is never touched: a call that must make a new run while the
current one runs (or waits to retry) creates the next id beside it.

Modes (:func:`decide`; "open" means the current job is scheduled and no attempt
of it has started):

* ``debounce`` (``delay``, ``max_wait``): an open job moves to ``now + delay``
  with the new payload, never past ``first_at + max_wait`` (``EXTENDED`` or
  ``CAPPED``); otherwise a new run is ``CREATED``.
* ``throttle`` (``window``, ``trailing``): the first call of a window runs now
  (``CREATED``); later calls in it are ``DROPPED`` or, with ``trailing``, fold
  into one run at the window's end with the latest payload (``FOLDED``), which
  starts the next window.
* ``unique`` (``"until_finished"`` / ``"until_started"`` / seconds): while the
  current job holds the key a call is ``KEPT`` (``JobConflict`` with
  ``reject``). ``until_finished`` holds it while scheduled or running, retries
  included; a finished job (succeeded, dead-lettered, cancelled, skipped, or
  purged) frees it. ``until_started`` holds it until the first attempt starts.
  Seconds hold it that long after the run was created, whatever its state.
* ``append`` (``max_items``): an open job below ``max_items`` gets the payload
  appended to its list (``APPENDED``); its due time stays the first call's. A
  full or started batch makes a new one. The handler receives the list.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from delayq.errors import InvalidOption, JobConflict
from delayq.job import JobState, KeyInfo

__all__ = [
    "KEYED_MODES",
    "Decision",
    "KeyPolicy",
    "KeyState",
    "KeyedMode",
    "KeyedOutcome",
    "KeyedResult",
    "Unique",
    "current_job_id",
    "decide",
]

Mode = Literal["debounce", "throttle", "unique", "append"]
KeyedMode = Literal["debounce", "throttle", "append"]
"""The ``on_conflict`` values of keyed calls (unique= goes with "keep" / "reject")."""
Unique = Literal["until_finished", "until_started"] | float
KEYED_MODES: tuple[Mode, ...] = ("debounce", "throttle", "unique", "append")
MAX_ITEMS = 100_000
_YEAR = 366 * 86400.0


class KeyedOutcome(StrEnum):
    """What a keyed call did."""

    CREATED = "created"  # a new run of the key was stored
    EXTENDED = "extended"  # debounce: the open run moved to now + delay, payload replaced
    CAPPED = "capped"  # debounce: moved, but only to first call + max_wait
    KEPT = "kept"  # unique: the key is held; nothing changed
    DROPPED = "dropped"  # throttle (leading): inside the window; nothing changed
    FOLDED = "folded"  # throttle (trailing): the window's trailing run carries this payload
    APPENDED = "appended"  # append: the payload joined the open batch


@dataclass(frozen=True, slots=True)
class KeyedResult:
    """A keyed call's answer: the job id acted on, the outcome, its due time."""

    id: str
    outcome: KeyedOutcome
    run_at: float


def _seconds(value: object, field: str, *, zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not (value >= 0 if zero else value > 0)
        or value > _YEAR
    ):
        bound = ">= 0" if zero else "> 0"
        raise InvalidOption(f"{field} must be seconds {bound} and at most a year, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """How calls with one key combine; build one with :meth:`build`."""

    mode: Mode
    max_wait: float | None = None  # debounce
    window: float | None = None  # throttle
    trailing: bool = False  # throttle
    unique: Unique | None = None  # unique
    reject: bool = False  # unique: a held key raises JobConflict instead of KEPT
    max_items: int | None = None  # append

    @classmethod
    def build(
        cls,
        on_conflict: str,
        *,
        max_wait: object = None,
        window: object = None,
        trailing: object = None,
        unique: object = None,
        max_items: object = None,
    ) -> KeyPolicy | None:
        """The policy of ``schedule``'s keyed options, or None for a plain call.

        Raises InvalidOption for an option that does not belong to the mode."""
        given = {
            "max_wait": max_wait,
            "window": window,
            "trailing": trailing,
            "unique": unique,
            "max_items": max_items,
        }
        allowed = {
            "debounce": {"max_wait"},
            "throttle": {"window", "trailing"},
            "append": {"max_items"},
            "keep": {"unique"},
            "reject": {"unique"},
        }.get(on_conflict, set())
        wrong = [name for name, value in given.items() if value is not None and name not in allowed]
        if wrong:
            raise InvalidOption(
                f"{', '.join(wrong)} does not apply to on_conflict={on_conflict!r} "
                f"(max_wait: 'debounce'; window, trailing: 'throttle'; max_items: 'append'; "
                f"unique: 'keep' or 'reject')"
            )
        if on_conflict == "debounce":
            if max_wait is None:
                raise InvalidOption("on_conflict='debounce' needs max_wait= (seconds > 0)")
            return cls("debounce", max_wait=_seconds(max_wait, "max_wait"))
        if on_conflict == "throttle":
            if window is None:
                raise InvalidOption("on_conflict='throttle' needs window= (seconds > 0)")
            if trailing is not None and not isinstance(trailing, bool):
                raise InvalidOption(f"trailing must be True or False, got {trailing!r}")
            return cls("throttle", window=_seconds(window, "window"), trailing=bool(trailing))
        if on_conflict == "append":
            if max_items is None:
                max_items = 1000
            if (
                isinstance(max_items, bool)
                or not isinstance(max_items, int)
                or not 1 <= max_items <= MAX_ITEMS
            ):
                raise InvalidOption(f"max_items must be an int 1..{MAX_ITEMS}, got {max_items!r}")
            return cls("append", max_items=max_items)
        if unique is not None:
            held: Unique
            if unique in ("until_finished", "until_started"):
                held = unique
            elif isinstance(unique, str):
                raise InvalidOption(
                    f"unique must be 'until_finished', 'until_started' or seconds, got {unique!r}"
                )
            else:
                held = _seconds(unique, "unique")
            return cls("unique", unique=held, reject=on_conflict == "reject")
        return None

    def describe(self) -> str:
        """The policy as text, for ``get`` and the dashboard (``debounce max_wait=60``)."""
        if self.mode == "debounce":
            return f"debounce max_wait={self.max_wait:g}"
        if self.mode == "throttle":
            return f"throttle window={self.window:g}" + (" trailing" if self.trailing else "")
        if self.mode == "append":
            return f"append max_items={self.max_items}"
        held = self.unique if isinstance(self.unique, str) else f"{self.unique:g}s"
        return f"unique {held}"


@dataclass(frozen=True, slots=True)
class KeyState:
    """What a store keeps per key (one record, changed only by :func:`decide`)."""

    key: str
    mode: str  # KeyPolicy.describe() of the last call
    runs: int  # runs created so far: the current job is run number ``runs``
    first_at: float  # the current run's first call (debounce cap, append, unique period)
    window_end: float = 0.0  # throttle: the current window ends then
    extended: int = 0  # debounce: times the current run was moved
    items: int = 0  # append: payloads in the current batch
    calls: int = 0  # calls that reached the current run (created, moved, kept...)

    @property
    def job_id(self) -> str:
        return current_job_id(self.key, self.runs)

    def info(self) -> KeyInfo:
        return KeyInfo(
            self.key, self.mode, self.runs, self.first_at, self.extended, self.items, self.calls
        )

    def to_json(self) -> str:
        return json.dumps(
            [self.mode, self.runs, self.first_at, self.window_end, self.extended, self.items,
             self.calls]
        )  # fmt: skip

    @classmethod
    def from_json(cls, key: str, text: str) -> KeyState:
        mode, runs, first_at, window_end, extended, items, calls = json.loads(text)
        return cls(key, mode, runs, first_at, window_end, extended, items, calls)


def current_job_id(key: str, runs: int) -> str:
    """The job id of a key's ``runs``-th run: the key itself, then ``key#2``, ``key#3``..."""
    return key if runs <= 1 else f"{key}#{runs}"


@dataclass(frozen=True, slots=True)
class Current:
    """The key's current job as the store sees it (None when it is gone)."""

    state: JobState
    attempts: int
    run_at: float


@dataclass(frozen=True, slots=True)
class Decision:
    """What the store does: ``write`` the job ``job_id`` (create it when ``create``,
    else update its due time and payload), store ``state``, answer ``outcome``.

    ``payload`` is the new payload text; ``append`` means add it to the list."""

    outcome: KeyedOutcome
    state: KeyState
    job_id: str
    run_at: float
    write: bool
    create: bool = False
    append: bool = False


def append_payload(current: str | None, item: str) -> str:
    """The batch payload text with ``item`` (JSON text) appended (a new list without one)."""
    if current is None:
        return f"[{item}]"
    return f"{current[:-1]},{item}]" if current != "[]" else f"[{item}]"


def decide(
    policy: KeyPolicy,
    key: str,
    state: KeyState | None,
    current: Current | None,
    *,
    now: float,
    due: float,
) -> Decision:
    """The outcome of one keyed call at ``now`` for a job due at ``due``.

    ``state`` is the key's record (None: never seen), ``current`` its current
    job (None: gone, e.g. purged). A record whose current job is gone and whose
    throttle window (if any) has ended decides nothing any more: the call is a
    fresh key's (run 1), whether or not the store has dropped the record yet.
    Raises JobConflict for a held unique key with ``reject``. Pure: every store
    calls this (or its Lua copy) inside its atomic step."""
    if state is not None and current is None and state.window_end <= now:
        state = None  # released with its run
    desc = policy.describe()
    open_ = current is not None and current.state is JobState.SCHEDULED and current.attempts == 0
    live = current is not None and current.state in (JobState.SCHEDULED, JobState.RUNNING)

    def create(run_at: float, **fields: float) -> Decision:
        runs = 1 if state is None else state.runs + 1
        new = KeyState(key, desc, runs, now, calls=1, **fields)  # type: ignore[arg-type]
        return Decision(KeyedOutcome.CREATED, new, new.job_id, run_at, True, create=True)

    if policy.mode == "debounce":
        assert policy.max_wait is not None
        if state is not None and open_:
            cap = state.first_at + policy.max_wait
            run_at = min(due, cap)
            outcome = KeyedOutcome.CAPPED if due > cap else KeyedOutcome.EXTENDED
            new = replace(state, mode=desc, extended=state.extended + 1, calls=state.calls + 1)
            return Decision(outcome, new, state.job_id, run_at, True)
        return create(min(due, now + policy.max_wait))
    if policy.mode == "throttle":
        assert policy.window is not None
        if (
            policy.trailing
            and state is not None
            and current is not None
            and state.window_end <= now < state.window_end + policy.window
            and current.run_at >= state.window_end
        ):  # the trailing run (due at the window's end) opened the window ``now`` is in
            state = replace(state, window_end=state.window_end + policy.window)
        if state is None or now >= state.window_end:
            return create(due, window_end=now + policy.window)
        new = replace(state, mode=desc, calls=state.calls + 1)
        if not policy.trailing:
            run_at = current.run_at if current is not None else state.window_end
            return Decision(KeyedOutcome.DROPPED, new, state.job_id, run_at, False)
        if open_ and current is not None and current.run_at >= state.window_end:
            return Decision(KeyedOutcome.FOLDED, new, state.job_id, state.window_end, True)
        trailing = create(state.window_end, window_end=state.window_end)
        return replace(trailing, outcome=KeyedOutcome.FOLDED)
    if policy.mode == "unique":
        if state is not None and current is not None:
            held = policy.unique
            if held == "until_finished":
                holds = live
            elif held == "until_started":
                holds = open_
            else:
                assert isinstance(held, float)
                holds = now < state.first_at + held
            if holds:
                if policy.reject:
                    raise JobConflict(
                        f"key {key!r} is held by job {state.job_id!r} (unique={held!r}, "
                        f"{current.state.value})"
                    )
                new = replace(state, calls=state.calls + 1)
                return Decision(KeyedOutcome.KEPT, new, state.job_id, current.run_at, False)
        return create(due)
    assert policy.max_items is not None
    # Only onto an append batch (items > 0): an open run of another mode holds a
    # plain payload, so the call starts a batch of its own as the key's next run.
    batch = state is not None and 0 < state.items < policy.max_items
    if state is not None and open_ and current is not None and batch:
        new = replace(state, mode=desc, items=state.items + 1, calls=state.calls + 1)
        return Decision(KeyedOutcome.APPENDED, new, state.job_id, current.run_at, True, append=True)
    made = create(due, items=1)
    return replace(made, append=True)

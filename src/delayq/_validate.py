"""Input checks shared by every layer (no dependencies)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from numbers import Real

from delayq.errors import InvalidDelay, InvalidJobId, InvalidOption

MAX_JOB_ID_LENGTH = 255

MAX_DELAY = 100 * 365.25 * 86400.0
"""The furthest a job (or a recurring interval) may reach ahead: 100 years, in seconds."""

MAX_ATTEMPTS = 2**31 - 1
"""The largest ``max_attempts``: every store keeps it as a 32-bit signed int."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 control characters
_INF = math.inf
_BIG_INT = 2**1000  # ints beyond this may not convert to float: the slow path checks them


def check_seconds(value: object, name: str = "delay") -> float:
    """Return ``value`` as float seconds, or raise :class:`InvalidDelay` naming it.

    Accepts int and float (and other real numbers), rejects bool, strings,
    NaN and infinities. Negative values are allowed here: callers treat them
    as "already due".
    """
    # Fast paths for the exact built-in types (the ``Real`` ABC check below
    # costs several times more); anything else, including NaN, inf and
    # subclasses, takes the full checks and gets the same errors.
    if type(value) is float:
        if -_INF < value < _INF:  # False for NaN and the infinities
            return value
    elif type(value) is int and -_BIG_INT < value < _BIG_INT:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidDelay(
            f"{name} must be a number of seconds (int or float), got {value!r} "
            f"of type {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range (10**400)
        seconds = _INF
    if not math.isfinite(seconds):
        raise InvalidDelay(f"{name} must be a finite number of seconds, got {value!r}")
    return seconds


def check_int(
    value: object,
    name: str,
    *,
    minimum: int,
    maximum: int | None = None,
    none_ok: bool = False,
    note: str = "",
) -> int:
    """Return ``value`` if it is an int (not a bool) in ``minimum..maximum``, or raise
    :class:`InvalidOption` naming it and the range.

    ``none_ok`` only words the message ("None or an int ..."): a caller that
    accepts None handles it first. ``note`` follows the range, e.g. ``" (0: no cap)"``.
    """
    if type(value) is int and minimum <= value and (maximum is None or value <= maximum):
        return value  # the fast path; subclasses of int take the checks below
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and minimum <= value
        and (maximum is None or value <= maximum)
    ):
        return value
    bound = f">= {minimum}" if maximum is None else f">= {minimum} and <= {maximum}"
    either = "None or " if none_ok else ""
    raise InvalidOption(f"{name} must be {either}an int {bound}{note}, got {value!r}")


def check_limit(limit: object) -> int:
    """A page or batch size: an int >= 1."""
    return check_int(limit, "limit", minimum=1)


def check_duration(value: object, name: str) -> float:
    """A ``timedelta`` or a number of seconds, as float seconds (:func:`check_seconds`)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return check_seconds(value, name)


def check_option_seconds(value: object, name: str, *, allow_zero: bool = False) -> float:
    """Return an option given in seconds (a lease, a timeout, a grace period) as a
    float, or raise :class:`InvalidOption` naming it: finite, and > 0 (>= 0 with
    ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOption(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidOption(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def check_datetime(value: object, name: str = "at") -> float:
    """Return an aware ``datetime`` (or epoch seconds) as epoch seconds."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidDelay(
                f"{name}={value!r} is a naive datetime; give it a timezone, e.g. "
                f"datetime.now(timezone.utc) or value.replace(tzinfo=ZoneInfo('Europe/Paris'))"
            )
        return value.timestamp()
    return check_seconds(value, name)


def utf8_problem(text: str) -> str | None:
    """None when ``text`` can be stored as UTF-8; else why not (the lone surrogate).

    A Python str may hold lone surrogates (``"\\ud800"``, e.g. from
    ``os.fsdecode`` or bad JSON); no store can keep them.
    """
    if text.isascii():  # O(1) in CPython: a flag of the string
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"is not valid UTF-8 text (a lone surrogate {text[exc.start]!r} at index {exc.start})"
        )
    return None


def check_job_id(value: object) -> str:
    """Return a valid job id or raise :class:`InvalidJobId`."""
    if not isinstance(value, str):
        raise InvalidJobId(f"job_id must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidJobId("job_id must not be empty")
    if len(value) > MAX_JOB_ID_LENGTH:
        raise InvalidJobId(
            f"job_id is {len(value)} characters; at most {MAX_JOB_ID_LENGTH} are allowed"
        )
    if _CONTROL.search(value) is not None:
        raise InvalidJobId(f"job_id must not contain control characters, got {value!r}")
    problem = utf8_problem(value)
    if problem is not None:
        raise InvalidJobId(f"job_id {problem}: {value!r}")
    return value


# -- shared by the stores and the layers above them ---------------------------------
def finite_number(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a finite real number (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range (10**400)
        return None
    return number if math.isfinite(number) else None


def check_run_at(run_at: object, name: str = "run_at") -> float:
    seconds = finite_number(run_at)
    if seconds is None:
        raise InvalidDelay(f"{name} must be finite epoch seconds, got {run_at!r}")
    return seconds


def check_list_cursor(after: object) -> tuple[float, str] | None:
    """A ``list_jobs(after=)`` keyset cursor: ``(run_at, job_id)`` of the last job
    of the previous page, or None."""
    if after is None:
        return None
    if not isinstance(after, tuple | list) or len(after) != 2 or not isinstance(after[1], str):
        raise InvalidOption(
            f"after must be (run_at, job_id) of the last job of the previous page, got {after!r}"
        )
    return check_run_at(after[0], "after[0] (run_at)"), after[1]


MAX_PREVIEW = 100_000
"""The longest payload preview a list may ask for (characters)."""

MAX_SEARCH_CHARS = 1000
"""The longest payload substring or JSON path a search takes."""

_PATH_PART = re.compile(r"([A-Za-z0-9_-]+)|\[([0-9]{1,9})\]")


def check_preview(preview: object) -> int | None:
    """``list_jobs(preview=)``: payloads longer than this many characters of JSON
    text are listed cut; None lists them whole."""
    if preview is None:
        return None
    if isinstance(preview, bool) or not isinstance(preview, int) or not 1 <= preview <= MAX_PREVIEW:
        raise InvalidOption(
            f"preview must be an int in 1..{MAX_PREVIEW} (characters), got {preview!r}"
        )
    return preview


def check_payload_contains(text: object) -> str | None:
    """``list_jobs(payload_contains=)``: a substring of the payload's JSON text."""
    if text is None:
        return None
    if not isinstance(text, str) or not text or len(text) > MAX_SEARCH_CHARS:
        raise InvalidOption(
            f"payload_contains must be a non-empty str of at most {MAX_SEARCH_CHARS} characters, "
            f"got {text!r:.80}"
        )
    return text


PayloadPath = tuple[str | int, ...]
"""A parsed JSON path: object keys (str) and array indexes (int), outermost first."""

JsonScalar = str | int | float | bool


def check_payload_at(at: object) -> tuple[PayloadPath, JsonScalar] | None:
    """``list_jobs(payload_at=(path, value))``: jobs whose payload holds ``value`` (a
    JSON string, number or boolean) at ``path``, written ``$.customer.id`` or
    ``items[0].sku`` (keys of letters, digits, ``_`` and ``-``; ``[n]`` indexes)."""
    if at is None:
        return None
    if not isinstance(at, tuple | list) or len(at) != 2 or not isinstance(at[0], str):
        raise InvalidOption(
            f"payload_at must be (path, value), e.g. ('$.user.id', 42), got {at!r:.80}"
        )
    path, value = at
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidOption(f"payload_at's value must be finite, got {value!r}")
    if not isinstance(value, str | int | float | bool):
        raise InvalidOption(
            f"payload_at's value must be a JSON string, number or boolean, got {value!r:.80}"
        )
    return parse_payload_path(path), value


def parse_payload_path(path: str) -> PayloadPath:
    text = path.strip()
    if len(text) > MAX_SEARCH_CHARS:
        raise InvalidOption(f"a payload path has at most {MAX_SEARCH_CHARS} characters")
    rest = text[1:] if text.startswith("$") else "." + text
    parts: list[str | int] = []
    while rest:
        dotted = rest.startswith(".")
        match = _PATH_PART.match(rest[1:] if dotted else rest)
        if (
            match is None
            or (dotted and match.group(1) is None)
            or (not dotted and match.group(2) is None)
        ):
            break
        parts.append(match.group(1) if dotted else int(match.group(2)))
        rest = rest[match.end() + (1 if dotted else 0) :]
    if rest or not parts:
        raise InvalidOption(
            f"a payload path looks like $.customer.id or items[0].sku (keys of letters, "
            f"digits, _ and -), got {path!r:.80}"
        )
    return tuple(parts)


def format_time(epoch: float) -> str:
    """Epoch seconds as a readable UTC timestamp (for error messages)."""
    try:
        return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return repr(epoch)


MAX_SCHEDULE_NAME = 160
"""The longest schedule name: its occurrence and tick job ids (name + time) must
stay within the 255 characters of a job id."""


def check_schedule_name(name: object) -> str:
    """``name`` if it can name a schedule, else :class:`~delayq.errors.InvalidOption`."""
    if not isinstance(name, str):
        raise InvalidOption(f"schedule name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise InvalidOption(f"schedule name must not be empty, got {name!r}")
    if len(name) > MAX_SCHEDULE_NAME:
        raise InvalidOption(
            f"schedule name is {len(name)} characters; at most {MAX_SCHEDULE_NAME} are allowed"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 or 0x80 <= ord(ch) < 0xA0 for ch in name):
        raise InvalidOption(f"schedule name must not contain control characters, got {name!r}")
    problem = utf8_problem(name)
    if problem is not None:
        raise InvalidOption(f"schedule name {problem}")
    return name


def check_handler_names(names: object) -> frozenset[str] | None:
    """A claim's or a worker's handler filter (``names=`` / ``handlers=``): None
    (every handler), or a non-empty collection of non-empty names (a str alone is
    refused: ``"a,b"`` would be its characters)."""
    if names is None:
        return None
    if isinstance(names, str | bytes) or not hasattr(names, "__iter__"):
        raise InvalidOption(
            f"handler names must be a collection of names (['a', 'b']), got {names!r}"
        )
    chosen = frozenset(names)
    if not chosen:
        raise InvalidOption("handler names must name at least one handler (None for all)")
    for name in chosen:
        if not isinstance(name, str) or not name:
            raise InvalidOption(f"handler names must be non-empty strs, got {name!r}")
    return chosen

"""One rendering of jobs and times for every front end (CLI, dashboard, JSON API, logs).

* :func:`iso`: epoch seconds as ISO 8601 UTC **to the millisecond**
  (``2030-01-01T08:00:00.000+00:00``), the precision the stores keep.
* :func:`relative`: ``in 29m 59s`` / ``1h 5m ago`` / ``250ms ago`` (two units, exact
  to the second, for tables).
* :func:`job_dict`: a job as JSON data, its times as epoch seconds plus ``run_at_iso``.
* :func:`error_summary`: why a job failed, in one line: the exception's type and
  message (a traceback's last line), for lists, dead letters and log lines.
* :func:`payload_value` / :func:`parse_payload_at`: a payload search typed by a person
  (``customer.id=42``: a JSON number, ``true`` / ``false`` or ``"quoted"`` text is
  that value, anything else is the text itself).
* :func:`parse_time` / :func:`parse_when`: a time typed by a person. An ISO 8601 time
  **without an offset is read as UTC** (the dashboard shows UTC, and a browser's
  ``datetime-local`` field sends no offset), so the CLI and the dashboard read the
  same text as the same instant.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from delayq.backoff import parse_duration
from delayq.errors import InvalidInput, InvalidOption
from delayq.job import Job

__all__ = [
    "ERROR_SUMMARY_CHARS",
    "error_summary",
    "iso",
    "job_dict",
    "local",
    "parse_payload_at",
    "parse_time",
    "parse_when",
    "payload_value",
    "relative",
]

ERROR_SUMMARY_CHARS = 300

_TRACEBACK = "Traceback (most recent call last):"


def error_summary(text: str | None, width: int = ERROR_SUMMARY_CHARS) -> str | None:
    """The exception of a stored error, in one line of at most ``width`` characters.

    A worker stores the whole traceback (``traceback.format_exception``); its
    ``Type: message`` comes after the last traceback's frames (indented lines),
    the message possibly over several lines (joined here). Any other error text
    (a timeout, an unknown handler) is summarised by its first line.
    """
    if text is None:
        return None
    lines = text.strip().splitlines()
    if lines and lines[0].startswith(_TRACEBACK):
        start = max(i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK))
        tail = lines[start + 1 :]
        first = next((i for i, ln in enumerate(tail) if ln and not ln[0].isspace()), None)
        picked = [] if first is None else [ln.strip() for ln in tail[first:] if ln.strip()]
        line = " ".join(picked) if picked else lines[-1].strip()
    else:
        line = next((ln.strip() for ln in lines if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def iso(epoch: float | None) -> str | None:
    """``epoch`` as ISO 8601 UTC to the millisecond, or None (also for NaN / infinity)."""
    if epoch is None or not math.isfinite(epoch):
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def local(epoch: float | None, tz: str = "UTC") -> str:
    """``epoch`` as a wall-clock time in the zone ``tz``, to the second, with the
    zone's abbreviation (``2026-12-03 03:00:00 CET``); ``-`` for none. A recurring
    schedule's times read in the zone its cron is evaluated in."""
    if epoch is None or not math.isfinite(epoch):
        return "-"
    at = datetime.fromtimestamp(epoch, UTC).astimezone(ZoneInfo(tz))
    return f"{at:%Y-%m-%d %H:%M:%S} {at:%Z}"


def relative(epoch: float | None, now: float) -> str:
    """``in 5m 3s`` / ``12.0s ago`` / ``-`` for none."""
    if epoch is None:
        return "-"
    seconds = epoch - now
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f}ms"
    elif s < 60:
        text = f"{s:.1f}s"
    elif s < 3600:
        text = f"{int(s // 60)}m {int(s % 60)}s"
    elif s < 86400:
        text = f"{int(s // 3600)}h {int(s % 3600 // 60)}m"
    else:
        text = f"{int(s // 86400)}d {int(s % 86400 // 3600)}h"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def job_dict(job: Job) -> dict[str, Any]:
    """A job as JSON-ready data (times as epoch seconds, the due time also as ISO 8601 UTC);
    a job under flow control also shows its key, priority, group and ``throttled_until``;
    a keyed job's current run its key's mode and counters (``keyed``); a succeeded job
    that kept its return value, that value (``result``, its raw text if it does not
    decode)."""
    data = {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "payload": job.payload,
        "run_at": job.run_at,
        "run_at_iso": iso(job.run_at),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "backoff": job.backoff,
        "misfire": job.misfire,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "lease_until": job.lease_until,
        "last_error": job.last_error,
        "error_summary": error_summary(job.last_error),
        "outcome": job.outcome,
    }
    if job.key is not None or job.priority or job.group is not None:
        data.update(key=job.key, priority=job.priority, group=job.group)
        data["throttled_until"] = job.throttled_until
        data["throttled_until_iso"] = (
            None if job.throttled_until is None else iso(job.throttled_until)
        )
    if job.keyed is not None:  # the current run of a keyed call's key: its mode and counters
        data["keyed"] = dataclasses.asdict(job.keyed)
    if job.result is not None:
        try:
            data["result"] = json.loads(job.result)
        except ValueError:
            data["result"] = job.result
    return data


def payload_value(text: str) -> str | int | float | bool:
    """A value to find in payloads, as typed: ``42``, ``1.5``, ``true``, ``"42"`` (a
    JSON number, boolean or string) are those; any other text is that string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str | bool) or (isinstance(value, int | float) and math.isfinite(value)):
        return value
    return text


def parse_payload_at(text: str, field: str) -> tuple[str, str | int | float | bool]:
    """``PATH=VALUE`` (``customer.id=42``, ``$.items[0].sku=A-1``) as
    ``list_jobs(payload_at=)``; else :class:`~delayq.errors.InvalidOption` naming ``field``."""
    path, sep, value = text.partition("=")
    if not sep or not path.strip():
        raise InvalidOption(f"{field} must be PATH=VALUE, e.g. customer.id=42, got {text!r}")
    return path.strip(), payload_value(value.strip())


def parse_time(text: str, field: str) -> float:
    """An absolute time: epoch seconds or ISO 8601 (UTC when it has no offset), as
    epoch seconds; else :class:`~delayq.errors.InvalidOption` naming ``field``."""
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise InvalidOption(f"{field} must be a finite number of epoch seconds, got {text!r}")
        return number
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidOption(
            f"{field}: cannot read {text!r} as a time; use 'now', '+10m', '-1h', "
            f"an ISO 8601 time (2030-01-01T09:00:00+01:00; UTC without an offset) "
            f"or epoch seconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_when(text: str, *, now: float, field: str) -> float:
    """``now``, ``+10m`` / ``-1h`` / ``+30`` (relative: a sign always means "from
    now", a bare number of seconds included), or an absolute time
    (:func:`parse_time`), as epoch seconds."""
    value = text.strip()
    if value == "now":
        return now
    if value[:1] in "+-" and value[1:2].isdigit():
        try:
            seconds = parse_duration(value[1:])
        except InvalidInput as exc:
            raise InvalidOption(f"{field}: {exc}") from exc
        return now + seconds if value[0] == "+" else now - seconds
    return parse_time(value, field)

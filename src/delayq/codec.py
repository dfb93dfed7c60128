"""The JSON payload codec: payloads are JSON data, never pickle.

:func:`encode_payload` accepts exactly what JSON can round-trip (dict with str
keys, list, tuple, str, int, finite float, bool, None), names the first value
that is not (a str with a lone surrogate, which is not UTF-8 text, and an int
too long for Python to print are not), and enforces a size limit on the encoded
UTF-8 bytes.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from delayq._validate import check_int, utf8_problem
from delayq.errors import InvalidPayload, InvalidResult, PayloadTooLarge, ResultTooLarge

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "JSONValue",
    "decode_payload",
    "encode_payload",
    "encode_result",
]

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB
DEFAULT_MAX_RESULT_BYTES = 64 << 10  # 64 KiB: a result is kept with every finished record

JSONValue = Any  # dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None

_BIG_INT_BITS = 2000
"""Ints longer than this many bits (~600 digits) are checked against Python's
limit on int-to-text conversion (``sys.get_int_max_str_digits()``, at least 640)."""


def _check(value: object, path: str, depth: int, what: str = "payload") -> None:
    if depth > 500:
        raise InvalidPayload(f"{what} is nested more than 500 levels deep at {path}")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        problem = utf8_problem(value)
        if problem is not None:
            raise InvalidPayload(f"{what}{path} {problem}")
        return
    if isinstance(value, int):
        if value.bit_length() > _BIG_INT_BITS:
            try:
                int.__repr__(value)  # what json does
            except ValueError:
                raise InvalidPayload(
                    f"{what}{path} is an int with more than {sys.get_int_max_str_digits()} "
                    f"digits, which Python will not convert to JSON text; send it as a str"
                ) from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayload(f"{what}{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidPayload(
                    f"{what}{path} has a key {k!r} of type {type(k).__name__}; "
                    f"JSON object keys must be str"
                )
            problem = utf8_problem(k)
            if problem is not None:
                raise InvalidPayload(f"{what}{path} has a key {k!r} that {problem}")
            _check(v, f"{path}[{k!r}]", depth + 1, what)
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", depth + 1, what)
        return
    raise InvalidPayload(
        f"{what}{path or ''} is a {type(value).__name__} ({value!r:.60}); {what}s must be "
        f"JSON data: dict, list, str, int, float, bool or None"
    )


def encode_payload(payload: object, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Validate ``payload`` and return its compact JSON text.

    Raises :class:`InvalidPayload` for non-JSON data and
    :class:`PayloadTooLarge` when the UTF-8 encoding exceeds ``max_bytes``.
    """
    check_int(max_bytes, "max_payload_bytes", minimum=1)
    _check(payload, "", 0)
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:  # anything _check let through
        raise InvalidPayload(f"payload cannot be encoded as JSON: {exc}") from exc
    # len(text) <= bytes <= 4 * len(text): encode only when it could matter.
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes as JSON; the limit is {max_bytes} bytes "
                f"(set max_payload_bytes to change it)"
            )
    return text


def encode_result(value: object, *, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> str:
    """A handler's return value as compact JSON text, checked like a payload.

    Raises :class:`InvalidResult` for non-JSON data and :class:`ResultTooLarge`
    when the UTF-8 encoding exceeds ``max_bytes``.
    """
    try:
        _check(value, "", 0, "result")
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except InvalidPayload as exc:
        raise InvalidResult(str(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidResult(f"result cannot be encoded as JSON: {exc}") from exc
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise ResultTooLarge(
                f"result is {size} bytes as JSON; the limit is {max_bytes} bytes "
                f"(return less, or store it elsewhere and return its key)"
            )
    return text


def decode_payload(text: str) -> JSONValue:
    """Decode JSON text stored by :func:`encode_payload`."""
    return json.loads(text)

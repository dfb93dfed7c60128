"""The JSON payload codec: JSON data only, the bad value named, a size limit in bytes."""

from __future__ import annotations

import math

import pytest

from delayq import InvalidOption, InvalidPayload, PayloadTooLarge
from delayq.codec import DEFAULT_MAX_PAYLOAD_BYTES, decode_payload, encode_payload


@pytest.mark.parametrize(
    "payload",
    [None, True, 0, -7, 1.5, "", "héllo ✓", [], {}, {"a": [1, {"b": None}], "c": "d"}],
)
def test_json_data_round_trips(payload: object) -> None:
    assert decode_payload(encode_payload(payload)) == payload


def test_tuples_encode_as_lists_and_the_text_is_compact_utf8() -> None:
    assert encode_payload({"k": (1, 2)}) == '{"k":[1,2]}'
    assert encode_payload("é") == '"é"'


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({1: "x"}, "key 1 of type int"),
        ({"a": {"b": math.nan}}, "payload['a']['b'] is nan"),
        ([1, math.inf], "payload[1] is inf"),
        ({"when": object()}, "payload['when'] is a object"),
        ({1, 2}, "is a set"),
        (b"bytes", "is a bytes"),
        ({"n": [10**5000]}, "payload['n'][0] is an int with more than 4300 digits"),
        ({"s": "a\ud800"}, "payload['s'] is not valid UTF-8 text (a lone surrogate '\\ud800'"),
        ({"\udfff": 1}, "has a key '\\udfff' that is not valid UTF-8 text"),
        ("\ud800", "payload is not valid UTF-8 text"),
    ],
)
def test_non_json_data_is_rejected_naming_the_value(payload: object, where: str) -> None:
    with pytest.raises(InvalidPayload) as info:
        encode_payload(payload)
    assert where in str(info.value)


def test_deep_nesting_is_rejected() -> None:
    payload: object = []
    for _ in range(600):
        payload = [payload]
    with pytest.raises(InvalidPayload, match="nested more than 500"):
        encode_payload(payload)


def test_the_size_limit_counts_utf8_bytes() -> None:
    assert len(encode_payload("é" * 4, max_bytes=10).encode()) == 10  # '"' + 8 bytes + '"'
    with pytest.raises(PayloadTooLarge, match="11 bytes as JSON; the limit is 10"):
        encode_payload("é" * 4 + "x", max_bytes=10)


def test_the_default_limit_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_PAYLOAD_BYTES == 1 << 20
    encode_payload("x" * (DEFAULT_MAX_PAYLOAD_BYTES - 2))
    with pytest.raises(PayloadTooLarge):
        encode_payload("x" * (DEFAULT_MAX_PAYLOAD_BYTES - 1))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_a_bad_size_limit_is_an_invalid_option(bad: object) -> None:
    with pytest.raises(InvalidOption, match="max_payload_bytes"):
        encode_payload({}, max_bytes=bad)  # type: ignore[arg-type]


def test_payload_errors_are_value_errors_for_callers_that_catch_those() -> None:
    with pytest.raises(ValueError):
        encode_payload(object())

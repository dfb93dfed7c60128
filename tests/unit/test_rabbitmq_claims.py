"""What a due RabbitMQ delivery becomes (``_claims.judge``): a table, no broker needed."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("pika")

from delayq.backends.rabbitmq._claims import judge
from delayq.backends.rabbitmq._consumer import Delivery
from delayq.backends.rabbitmq._message import JobMessage, decode, encode

MESSAGE = JobMessage(
    id="j",
    name="x",
    payload="{}",
    run_at=0.0,
    max_attempts=3,
    backoff={"kind": "exponential"},
    misfire="run",
    created_at=0.0,
)


def delivery(message: JobMessage | None, returns: int = 0) -> Delivery:
    return Delivery(1, 1, b"?", returns, message, None if message else "ValueError: bad")


@pytest.mark.parametrize(
    ("attempts_before", "returns", "kind", "attempt"),
    [
        (0, 0, "run", 1),  # a first delivery
        (1, 0, "run", 2),  # a retry's message carries the attempts before it
        (0, 1, "run", 2),  # returned once (a killed worker): that counts as an attempt
        (1, 1, "run", 3),
        (0, 3, "bury", 0),  # returned more often than max_attempts: it keeps killing workers
        (2, 1, "bury", 0),
    ],
)
def test_attempts_count_the_earlier_attempts_and_the_broker_returns(
    attempts_before: int, returns: int, kind: str, attempt: int
) -> None:
    verdict = judge(delivery(replace(MESSAGE, attempts=attempts_before), returns))
    assert verdict.kind == kind
    if kind == "run":
        assert verdict.attempts == attempt
        assert (verdict.last_error is not None) == (returns > 0)
    else:
        assert verdict.message is not None and verdict.message.last_error is not None
        assert "max_attempts=3" in verdict.message.last_error


def test_an_unreadable_body_is_buried_with_the_reason() -> None:
    verdict = judge(delivery(None))
    assert verdict.kind == "bury" and verdict.message is None
    assert "cannot decode" in verdict.error and "bad" in verdict.error


def test_a_delay_left_for_another_pass_is_passed_on() -> None:
    assert judge(delivery(replace(MESSAGE, more=5.0))).kind == "pass_on"


def test_a_message_survives_encoding() -> None:
    assert decode(encode(MESSAGE)) == MESSAGE
    with pytest.raises(ValueError):
        decode(b'{"v": 2}')

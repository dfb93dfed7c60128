"""What a due RabbitMQ delivery becomes (``_claims.judge``): a table, no broker needed."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

pytest.importorskip("pika")

from delayq.backends.rabbitmq._claims import Held, due_on_worker, expired, judge
from delayq.backends.rabbitmq._consumer import ENTERED, Delivery, _entered
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


def delivery(message: JobMessage | None, redelivered: bool = False) -> Delivery:
    return Delivery(1, 1, b"?", redelivered, message, None if message else "ValueError: bad")


@pytest.mark.parametrize("attempts_before", [0, 1, 4])
def test_a_claim_is_the_attempt_after_those_the_message_carries(attempts_before: int) -> None:
    verdict = judge(delivery(replace(MESSAGE, attempts=attempts_before, returns=3)))
    assert (verdict.kind, verdict.attempts) == ("run", attempts_before + 1)


@pytest.mark.parametrize(("returns_before", "kind"), [(0, "again"), (4, "again"), (5, "bury")])
def test_a_returned_delivery_is_published_again_with_its_return_counted_never_an_attempt(
    returns_before: int, kind: str
) -> None:
    message = replace(MESSAGE, attempts=2, returns=returns_before)
    verdict = judge(delivery(message, redelivered=True), max_returns=5)
    assert verdict.kind == kind and verdict.message is not None
    assert verdict.message.returns == returns_before + 1
    assert verdict.message.attempts == 2  # a return is never an attempt
    assert verdict.message.last_error is not None
    assert "max_returns=5" in verdict.message.last_error


def test_a_copy_that_carries_more_returns_than_allowed_is_buried() -> None:
    assert judge(delivery(replace(MESSAGE, returns=6)), max_returns=5).kind == "bury"


@pytest.mark.parametrize(("attempt", "kind"), [(1, "again"), (2, "again"), (3, "bury")])
def test_an_expired_lease_counts_its_attempt_and_buries_the_last(attempt: int, kind: str) -> None:
    held = Held(delivery(MESSAGE), MESSAGE, attempt, 0.0)
    verdict, message = expired(held)
    assert verdict == kind and message.attempts == attempt
    assert message.last_error is not None and "lease expired" in message.last_error


def test_an_unreadable_body_is_buried_with_the_reason() -> None:
    verdict = judge(delivery(None))
    assert verdict.kind == "bury" and verdict.message is None
    assert "cannot decode" in verdict.error and "bad" in verdict.error


def test_a_delay_left_for_another_pass_is_passed_on() -> None:
    assert judge(delivery(replace(MESSAGE, more=5.0))).kind == "pass_on"


def test_a_message_survives_encoding_with_a_fresh_instance_id() -> None:
    decoded = decode(encode(MESSAGE))
    assert replace(decoded, instance="") == MESSAGE and decoded.instance
    assert decode(encode(decoded)).instance == decoded.instance
    with pytest.raises(ValueError):
        decode(b'{"v": 3}')


def test_non_ascii_text_is_carried_as_utf8_not_escaped() -> None:
    text = "\u65e5\u672c" * 1000 + "\U0001f600" * 1000
    body = encode(replace(MESSAGE, payload=json.dumps(text, ensure_ascii=False)))
    assert len(body) < len(text.encode()) + 1000  # escaped, it would be 2.4 times as large


@pytest.mark.parametrize(
    "field", [("local", "1e308"), ("local", "NaN"), ("run_at", "Infinity"), ("more", "-Infinity")]
)
def test_a_body_with_a_number_out_of_range_is_unreadable(field: tuple[str, str]) -> None:
    name, value = field
    data = json.loads(encode(MESSAGE))
    body = json.dumps(data).replace(f'"{name}": {json.dumps(data[name])}', f'"{name}": {value}')
    assert value in body
    with pytest.raises(ValueError):
        decode(body.encode())


# -- when a claimed job fell due, on the worker's clock -----------------------------------

T = 1_700_000_100.0  # the worker's wall clock at the claim


@pytest.mark.parametrize(
    ("case", "run_at", "entered", "held_late", "lateness"),
    [
        # The producer's clock agrees with the broker's stamp: its run_at decides, exactly.
        ("clocks agree", T - 0.010, T - 0.6, 0.002, 0.010),
        ("clocks agree, waited 5 s in the ready queue", T - 5.0, T - 5.4, 0.0, 5.0),
        ("published due: only the producer's clock tells", T - 0.2, None, 0.0, 0.2),
        # A producer 3 s behind: the broker's stamp (whole seconds) overrules it, never
        # more late than the stamp allows; this worker's own hold is the floor.
        ("producer 3 s behind", T - 3.010, T - 0.6, 0.002, 0.002),
        ("producer 3 s behind, stamp a second old", T - 3.010, T - 1.4, 0.0, 0.395),
        ("producer 3 s behind, waited 5 s", T - 8.0, T - 5.4, 0.0, 4.395),
        # A producer ahead: never negative, never less than this worker held it.
        ("producer 3 s ahead", T + 3.0, T - 0.6, 0.004, 0.004),
    ],
)
def test_a_claim_is_judged_late_on_the_clocks_that_made_it_due(
    case: str, run_at: float, entered: float | None, held_late: float, lateness: float
) -> None:
    due = due_on_worker(run_at, T, held_late, entered, local=0.005)
    assert T - due == pytest.approx(lateness, abs=1e-6), case


def test_a_delivery_due_more_than_the_guard_ahead_of_the_workers_clock_is_delayed_again() -> None:
    # A message-ttl policy shortened a level, or a broker node's clock stepped: never early.
    early = judge(delivery(replace(MESSAGE, run_at=T + 5.0)), wall=T)
    assert (early.kind, early.error) == ("pass_on", "early by 5.000 s")
    assert early.message is not None and early.message.more == pytest.approx(5.0)
    within = judge(delivery(replace(MESSAGE, run_at=T + 1.5)), wall=T)
    assert within.kind == "run"  # within the clock skew hosts are assumed to keep


def test_the_broker_stamp_is_read_from_x_death_or_from_the_copy_a_worker_published_back() -> None:
    stamp = datetime.fromtimestamp(T - 1, UTC)
    deaths = {"x-death": [{"time": stamp, "queue": "L5"}, {"time": stamp, "queue": "L6"}]}
    assert _entered(SimpleNamespace(headers=deaths)) == T - 1
    assert _entered(SimpleNamespace(headers={ENTERED: int(T - 2)})) == T - 2
    assert _entered(SimpleNamespace(headers=None)) is None  # published due: no stamp

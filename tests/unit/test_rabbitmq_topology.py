"""The RabbitMQ store's level arithmetic and URL options (no broker needed)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pika")

from delayq.backends._urls import mask
from delayq.backends.rabbitmq._connection import Settings
from delayq.backends.rabbitmq._topology import (
    BASE_MS,
    LEG,
    LEVELS,
    MAX_DELAY,
    Topology,
    ready_key,
    route,
)
from delayq.errors import ConfigurationError, InvalidDelay, InvalidOption

TOPO = Topology("orders")


def held_ms(key: str) -> int:
    """The broker delay a routing key's bits stand for."""
    if key == TOPO.ready_queue:
        return 0
    bits = key.split(".")[: len(LEVELS)]
    return sum(2**level for level, bit in zip(LEVELS, bits, strict=True) if bit == "1")


@pytest.mark.parametrize("delay", [0.0, 0.001, 0.063, 0.064, 0.5, 1.0, 2.0, 3600.0, 86400 * 30])
def test_the_levels_hold_a_message_no_longer_than_its_delay_and_the_rest_waits_locally(
    delay: float,
) -> None:
    r = route(TOPO, delay)
    assert held_ms(r.routing_key) == r.broker_ms <= delay * 1000
    assert 0 <= r.local < BASE_MS / 1000
    assert r.broker_ms / 1000 + r.local == pytest.approx(delay)
    assert r.more == 0
    assert r.routing_key.endswith(".orders")


def test_a_message_starts_at_its_highest_set_bit_or_goes_straight_to_the_ready_queue() -> None:
    assert route(TOPO, 0.031).exchange == ""  # the default exchange: the queue by name
    assert route(TOPO, 0.031).routing_key == TOPO.ready_queue
    assert route(TOPO, 0.032).routing_key.startswith("0.") and ready_key(TOPO).startswith("0.")
    three_and_a_half = route(TOPO, 3.5)  # 3500 ms = 2048 + 1024 + 256 + 128 + 32, then 12 ms
    assert three_and_a_half.exchange == TOPO.level_exchange(11)
    assert three_and_a_half.broker_ms == 3488
    assert three_and_a_half.local == pytest.approx(0.012)


def test_the_worker_waits_out_at_most_32_ms_of_any_delay() -> None:
    assert BASE_MS == 32
    assert max(route(TOPO, d / 1000).local for d in range(0, 5000, 7)) < 0.032


def test_queue_names_can_never_stand_for_another_queues_dead_letters() -> None:
    orders, orders_dead = Topology("orders"), Topology("orders.dead")
    names = {orders.ready_queue, orders.dead_queue, orders_dead.ready_queue, orders_dead.dead_queue}
    assert len(names) == 4


def test_a_delay_longer_than_one_pass_carries_the_rest_for_another_pass() -> None:
    r = route(TOPO, LEG + 3600)
    assert r.broker_ms == pytest.approx(LEG * 1000)
    assert r.local == 0 and r.more == pytest.approx(3600, abs=0.1)


@pytest.mark.parametrize("delay", [-5.0, -math.inf])
def test_a_negative_delay_is_due_now(delay: float) -> None:
    if math.isinf(delay):
        with pytest.raises(InvalidDelay):
            route(TOPO, delay)
    else:
        assert route(TOPO, delay).broker_ms == 0


@pytest.mark.parametrize("delay", [math.nan, math.inf, MAX_DELAY * 2])
def test_a_delay_that_is_not_finite_or_beyond_a_thousand_years_is_rejected(delay: float) -> None:
    with pytest.raises(InvalidDelay, match="delay"):
        route(TOPO, delay)


def test_url_options_are_read_and_kept_out_of_the_pika_url() -> None:
    s = Settings.parse(
        "amqp://u:secret@h:5673/v%2Fx?queue=a.b&queue_type=classic&heartbeat=10"
        "&allow_at_most_once=true"
    )
    assert (s.queue, s.queue_type, s.vhost, s.prefetch) == ("a.b", "classic", "v/x", 32)
    assert "queue=" not in s.pika_url and "heartbeat=10" in s.pika_url
    assert "secret" not in s.url and "u:***@h:5673" in s.url
    assert mask("amqp://h/") == "amqp://h/"


@pytest.mark.parametrize(
    ("url", "options"),
    [("amqp://h/", {"queue": "a*b"}), ("amqp://h/", {"queue": ""}), ("amqp://h/?queue=x.#", {})],
)
def test_bad_queue_names_are_invalid_options(url: str, options: dict[str, object]) -> None:
    with pytest.raises(InvalidOption, match="queue must be"):
        Settings.parse(url, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("redis://h/0", {}, "amqp://"),
        ("amqp://h/", {"queue_type": "stream"}, "queue_type"),
        ("amqp://h/?prefetch=0", {}, "prefetch"),
        ("amqp://h/", {"prefetch": True}, "prefetch"),
        ("amqp://h/", {"queue_type": "classic"}, "at most once"),
        ("amqp://h/?max_returns=0", {}, "max_returns"),
        ("amqp://h/?confirm_timeout=0", {}, "confirm_timeout"),
        ("amqp://h/?declare=never", {}, "declare"),
    ],
)
def test_bad_options_are_configuration_errors(
    url: str, options: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Settings.parse(url, **options)  # type: ignore[arg-type]

"""The Redis backend's key layout: every key of a queue lives in one cluster slot."""

from __future__ import annotations

from importlib import resources

import pytest
from redis.crc import key_slot

from delayq.backends.redis import SCRIPT_NAMES, mask, queue_keys, split_url
from delayq.backends.redis._connection import SCRIPTS
from delayq.errors import ConfigurationError


def crc16_xmodem(data: bytes) -> int:
    """CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses for key slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def cluster_slot(key: str) -> int:
    """The slot of ``key``: CRC16 of its hash tag (the first non-empty ``{...}``) mod 16384."""
    raw = key.encode()
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16_xmodem(raw) % 16384


def test_crc16_matches_the_redis_cluster_reference_value() -> None:
    # From the Redis Cluster specification: CRC16("123456789") == 0x31C3.
    assert crc16_xmodem(b"123456789") == 0x31C3


@pytest.mark.parametrize("queue", ["default", "orders", "emails.high", "ünïcode"])
def test_every_key_of_a_queue_maps_to_one_cluster_slot(queue: str) -> None:
    keys = queue_keys("delayq", queue)
    concrete = [
        *(v for k, v in keys.items() if not k.endswith(":")),
        keys["job:"] + "order-42",
        keys["job:"] + "{tricky}",
        keys["wake:"] + "0f3c",
        keys["shadow:"] + "order-42",
    ]
    slots = {cluster_slot(k) for k in concrete}
    assert len(slots) == 1
    assert slots == {key_slot(k.encode()) for k in concrete}


def test_two_queues_use_different_hash_tags() -> None:
    a = queue_keys("delayq", "a")["due"]
    b = queue_keys("delayq", "b")["due"]
    assert "{a}" in a and "{b}" in b


def test_the_prefix_comes_before_the_hash_tag() -> None:
    assert queue_keys("myapp", "orders")["due"] == "myapp:{orders}:due"


@pytest.mark.parametrize("name", ["_lib", "_flow", *SCRIPT_NAMES])
def test_every_script_starts_with_its_keys_and_argv(name: str) -> None:
    text = (resources.files("delayq.backends.redis") / "lua" / f"{name}.lua").read_text()
    header = text.split("\n\n", 1)[0]
    assert header.startswith("-- ")
    assert "KEYS[1" in header and "ARGV[1" in header


def test_the_flow_helpers_are_spliced_in_before_the_helpers_that_use_them() -> None:
    claim = SCRIPTS["claim"]
    assert "-- (the flow-control helpers" not in claim
    assert claim.index("local function schedule") < claim.index("local function flow_admit")
    assert claim.index("local function free_slot") < claim.index("local function leave_running")
    assert "flow_pick" not in SCRIPTS["extend"]  # only the helpers a script uses


def test_queue_and_prefix_can_come_from_the_url_query() -> None:
    url, options = split_url("redis://h:6379/2?queue=orders&prefix=shop&socket_timeout=3")
    assert options == {"queue": "orders", "prefix": "shop"}
    assert url == "redis://h:6379/2?socket_timeout=3"  # the rest is redis-py's


def test_expiry_events_and_result_ttl_are_parsed_from_the_url() -> None:
    _, options = split_url("redis://h/0?expiry_events=true&result_ttl=60")
    assert options == {"expiry_events": True, "result_ttl": 60.0}


def test_a_bad_url_option_names_itself() -> None:
    with pytest.raises(ConfigurationError, match="result_ttl"):
        split_url("redis://h/0?result_ttl=soon")


def test_the_password_is_masked_in_the_reported_url() -> None:
    assert mask("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert mask("redis://h:6379/0") == "redis://h:6379/0"


def test_a_password_in_the_query_is_masked_too() -> None:
    masked = mask("redis://h:6379/0?password=s3cret&queue=q&sentinel_password=x2")
    assert "s3cret" not in masked and "x2" not in masked
    assert "password=***" in masked and "queue=q" in masked


def test_redis_calls_are_bounded_by_a_socket_timeout_unless_the_url_sets_one() -> None:
    from delayq.backends.redis._connection import CALL_TIMEOUT, Connection  # noqa: PLC0415

    plain = Connection("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", {}, anchor="k")
    kwargs = plain.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == CALL_TIMEOUT < 30.0 / 3  # under a third of the lease
    assert kwargs["socket_connect_timeout"] == CALL_TIMEOUT
    own = Connection(
        "redis://127.0.0.1:6379/0?socket_timeout=2", "redis://127.0.0.1:6379/0", {}, anchor="k"
    )
    assert own.client.connection_pool.connection_kwargs["socket_timeout"] == 2.0


def test_the_scripts_bury_after_as_many_unstarted_expiries_as_the_other_stores() -> None:
    from delayq.backends._common import MAX_UNSTARTED  # noqa: PLC0415

    lib = resources.files("delayq.backends.redis").joinpath("lua", "_lib.lua").read_text()
    assert f"local MAX_UNSTARTED = {MAX_UNSTARTED}\n" in lib

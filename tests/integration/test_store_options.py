"""One rule on every store: URL options against keywords, and queue names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from delayq.backends import Backend, open_backend
from delayq.backends._common import check_queue_name
from delayq.errors import InvalidOption
from tests.postgres_support import POSTGRES_URL, app_name, pg_schema
from tests.rabbitmq_support import AMQP_URL, delete_queues, unique_queue, vhost_url
from tests.redis_support import REDIS_URL, redis_prefix

# store -> (URL with the option set, option, its URL value, another value)
DISAGREE = {
    "memory": ("memory://?result_ttl=60", "result_ttl", 60.0, 30.0),
    "sqlite": ("sqlite:///:memory:?result_ttl=60", "result_ttl", 60.0, 30.0),
    "redis": (f"{REDIS_URL}?queue=orders", "queue", "orders", "invoices"),
    "postgres": (f"{POSTGRES_URL}?queue=orders", "queue", "orders", "invoices"),
    "rabbitmq": (f"{AMQP_URL}?queue=orders", "queue", "orders", "invoices"),
}


@pytest.mark.parametrize("store", sorted(DISAGREE))
def test_a_keyword_and_a_url_option_that_disagree_are_refused_naming_both(store: str) -> None:
    url, option, from_url, keyword = DISAGREE[store]
    # Refused before the store connects: no server needed.
    with pytest.raises(InvalidOption, match="set twice") as info:
        open_backend(url, **{option: keyword})
    message = str(info.value)
    assert f"{option}={keyword!r}" in message and f"{option}={from_url!r}" in message


@contextmanager
def _memory() -> Iterator[Backend]:
    backend = open_backend("memory://?result_ttl=60", result_ttl=60)
    yield backend
    backend.close()


@contextmanager
def _sqlite(tmp_path: Path) -> Iterator[Backend]:
    backend = open_backend(f"sqlite:///{tmp_path}/q.db?result_ttl=60", result_ttl=60.0)
    yield backend
    backend.close()


@contextmanager
def _redis() -> Iterator[Backend]:
    with redis_prefix() as prefix:
        backend = open_backend(f"{REDIS_URL}?queue=orders&prefix={prefix}", queue="orders")
        yield backend
        backend.close()


@contextmanager
def _postgres() -> Iterator[Backend]:
    with pg_schema() as schema:
        backend = open_backend(
            f"{POSTGRES_URL}?queue=orders&schema={schema}",
            queue="orders",
            schema=schema,
            pool_size=2,
            application_name=app_name(schema),
        )
        yield backend
        backend.close()


@contextmanager
def _rabbitmq() -> Iterator[Backend]:
    queue = unique_queue()
    backend = open_backend(vhost_url(queue=queue), queue=queue)
    try:
        yield backend
    finally:
        backend.close()
        delete_queues(queue)


AGREE: dict[str, Callable[[Path], AbstractContextManager[Backend]]] = {
    "memory": lambda _: _memory(),
    "sqlite": _sqlite,
    "redis": lambda _: _redis(),
    "postgres": lambda _: _postgres(),
    "rabbitmq": lambda _: _rabbitmq(),
}


@pytest.mark.parametrize(
    "store",
    [
        "memory",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ],
)
def test_a_keyword_and_a_url_option_that_agree_open_the_store(store: str, tmp_path: Path) -> None:
    with AGREE[store](tmp_path) as backend:
        assert backend.url


@pytest.mark.parametrize("store", ["redis", "postgres", "rabbitmq"])
@pytest.mark.parametrize(
    "queue", ["", "a b", "a..b", ".a", "a.", "{q}", "a*b", "x.#", "é", "q" * 201, 7]
)
def test_every_store_with_queues_refuses_the_same_bad_names(store: str, queue: object) -> None:
    url = DISAGREE[store][0].split("?")[0]
    with pytest.raises(InvalidOption, match="queue must be"):
        open_backend(url, queue=queue)


@pytest.mark.parametrize("queue", ["default", "orders.eu-west:2", "A_b-c", "q" * 200])
def test_a_queue_name_every_store_keeps(queue: str) -> None:
    assert check_queue_name(queue) == queue

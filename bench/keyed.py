"""Keyed calls: how fast a producer debounces and appends, and that no appended event is lost.

::

    python -m bench.keyed                 # 1,000 keys, 20,000 calls per mode per store
    python -m bench.keyed --keys 100 --calls 2000

Per store (memory; SQLite ``synchronous=normal`` in a temporary file; Redis at
``DELAYQ_REDIS_URL``, default ``redis://127.0.0.1:6379/0``, under a prefix of its
own that is deleted afterwards; PostgreSQL at ``DELAYQ_POSTGRES_URL`` in a schema of its
own, dropped afterwards; each skipped when no server answers): one
producer thread makes ``--calls`` keyed calls spread over ``--keys`` keys, first
``debounce`` (delay 5 s, max_wait 60 s), then ``append`` (max_items 100), on
the store's own clock. It reports calls/s per mode, then claims every batch
(after moving past the due times with a fake clock) and checks that each
appended event was delivered exactly once. ``--stores`` picks the stores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis

from delayq.backends.base import Backend
from delayq.backends.memory import MemoryBackend
from delayq.backends.redis import RedisBackend
from delayq.backends.sqlite import SQLiteBackend
from delayq.job import JobSpec
from delayq.keyed import KeyPolicy
from delayq.testing import FakeClock


def _run(store: Backend, clock: FakeClock, keys: int, calls: int) -> dict[str, float]:
    debounce = KeyPolicy.build("debounce", max_wait=60)
    append = KeyPolicy.build("append", max_items=100)
    assert debounce is not None and append is not None
    rates: dict[str, float] = {}
    for mode, policy in (("debounce", debounce), ("append", append)):
        start = time.perf_counter()
        for n in range(calls):
            spec = JobSpec(
                id=f"{mode}:{n % keys}", name="x", payload=json.dumps(n), run_at=0.0, delay=5.0
            )
            store.enqueue_keyed(spec, policy)  # type: ignore[attr-defined]
            if n % 100 == 0:
                clock.advance(0.05)
        rates[mode] = calls / (time.perf_counter() - start)
    clock.advance(120)
    delivered: list[int] = []
    while batch := store.claim(limit=1000, lease=60):
        for claim in batch:
            if claim.job.id.startswith("append:"):
                delivered.extend(claim.job.payload)
            store.ack(claim)
    rates["lost_or_duplicated"] = float(len(set(range(calls)) ^ set(delivered)))
    rates["delivered"] = float(len(delivered))
    return rates


@contextlib.contextmanager
def _open(name: str, tmp: str, clock: FakeClock) -> Iterator[Backend | None]:
    if name == "memory":
        yield MemoryBackend(clock=clock)
    elif name == "sqlite-normal":
        yield SQLiteBackend(str(Path(tmp) / "k.db"), clock=clock, synchronous="normal")
    elif name == "postgres":
        yield from _postgres(clock)
    else:
        url = os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:6379/0")
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        except redis.RedisError as exc:
            print(f"{name:14s} skipped: {url}: {exc}")
            yield None
            return
        prefix = f"delayqbench:{uuid.uuid4().hex[:12]}"
        try:
            yield RedisBackend.from_url(url, prefix=prefix, clock=clock)
        finally:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
            client.close()


def _postgres(clock: FakeClock) -> Iterator[Backend | None]:
    import psycopg  # noqa: PLC0415

    from delayq.backends.postgres import PostgresBackend  # noqa: PLC0415

    url = os.environ.get("DELAYQ_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"delayqbench_{uuid.uuid4().hex[:12]}"
    try:
        backend = PostgresBackend(url, schema=schema, clock=clock)
    except Exception as exc:  # a missing server is a skipped row
        print(f"{'postgres':14s} skipped: {url}: {exc}")
        yield None
        return
    try:
        yield backend
    finally:
        backend.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--stores", default="memory,sqlite-normal,redis,postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.stores.split(","):
            clock = FakeClock()
            with _open(name, tmp, clock) as store:
                if store is None:
                    continue
                try:
                    r = _run(store, clock, args.keys, args.calls)
                finally:
                    store.close()
            print(
                f"{name:14s} debounce {r['debounce']:8.0f} calls/s  append {r['append']:8.0f} "
                f"calls/s  delivered {r['delivered']:.0f}, "
                f"lost or twice {r['lost_or_duplicated']:.0f}"
            )


if __name__ == "__main__":
    main()

"""Keyed calls: how fast a producer debounces and appends, and that no appended event is lost.

::

    python -m bench.keyed                 # 1,000 keys, 20,000 calls per mode per store
    python -m bench.keyed --keys 100 --calls 2000

Per store (memory; SQLite ``synchronous=normal`` in a temporary file): one
producer thread makes ``--calls`` keyed calls spread over ``--keys`` keys, first
``debounce`` (delay 5 s, max_wait 60 s), then ``append`` (max_items 100), on
the store's own clock. It reports calls/s per mode, then claims every batch
(after moving past the due times with a fake clock) and checks that each
appended event was delivered exactly once.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from delayq.backends.base import Backend
from delayq.backends.memory import MemoryBackend
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("memory", "sqlite-normal"):
            clock = FakeClock()
            store: Backend = (
                MemoryBackend(clock=clock)
                if name == "memory"
                else SQLiteBackend(str(Path(tmp) / "k.db"), clock=clock, synchronous="normal")
            )
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

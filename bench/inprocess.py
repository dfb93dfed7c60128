"""In-process delay structures side by side: throughput and lateness.

    python -m bench.inprocess            # full run (about a minute)
    python -m bench.inprocess --quick    # smoke run (a few seconds)

Peers, all measured in the same run on the same inputs:

* ``DelayQueue`` (threads) and ``AsyncDelayQueue`` (asyncio tasks);
* a bare ``heapq`` + ``threading.Condition`` loop: the floor, the least code
  that is still correct (every consumer waits timed for the head, every put
  notifies);
* ``queue.PriorityQueue`` with a sleeping consumer (get the earliest item,
  ``time.sleep`` until it is due; an earlier item arriving meanwhile waits);
* ``sched.scheduler`` (one thread runs it: it has no consumer threads);
* asyncio ``loop.call_at`` (one event loop).

Columns:

* put+take, 1 thread: N already-due items put, then N taken, items/s (median of
  5 rounds, the peers interleaved in each round);
* put+take, 4P+4C: 4 producer threads put N/4 each while 4 consumers take,
  items/s (median, as above); tasks instead of threads for ``AsyncDelayQueue``;
* lateness p50/p99/max: 100,000 items due uniformly over 5 s (starting 1 s
  after the first put), 4 consumers; lateness = time the consumer got the item
  minus its deadline, in milliseconds.

Targets: DelayQueue throughput >= 0.7x the floor; lateness p99 <= 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import itertools
import os
import platform
import queue
import random
import sched
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from delayq import AsyncDelayQueue, DelayedItem, DelayQueue, QueueClosed

Items = list[DelayedItem[int]]
monotonic = time.monotonic
perf_counter = time.perf_counter

PRODUCERS = 4
CONSUMERS = 4


@dataclass(frozen=True, slots=True)
class Config:
    throughput_items: int
    lateness_items: int
    lateness_span: float
    lateness_lead: float
    repeats: int


FULL = Config(200_000, 100_000, 5.0, 1.0, 5)
QUICK = Config(20_000, 10_000, 1.0, 0.5, 1)


# -- the floor: bare heapq + Condition ----------------------------------------
class BareHeap:
    """The least code that is still a correct blocking delay queue."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, DelayedItem[int]]] = []
        self.cond = threading.Condition(threading.Lock())
        self.seq = itertools.count()
        self.closed = False

    def put(self, item: DelayedItem[int]) -> None:
        with self.cond:
            heapq.heappush(self.heap, (item.deadline, next(self.seq), item))
            self.cond.notify()

    def take(self) -> DelayedItem[int] | None:
        """The earliest item once due; None when closed and nothing is due."""
        heap = self.heap
        cond = self.cond
        with cond:
            while True:
                if heap:
                    delay = heap[0][0] - monotonic()
                    if delay <= 0:
                        return heapq.heappop(heap)[2]
                    if self.closed:
                        return None
                    cond.wait(delay)
                elif self.closed:
                    return None
                else:
                    cond.wait()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


# -- PriorityQueue with a sleeping consumer ---------------------------------------
_STOP = DelayedItem(-1, float("inf"))


class SleepingPriorityQueue:
    def __init__(self) -> None:
        self.q: queue.PriorityQueue[tuple[float, int, DelayedItem[int]]] = queue.PriorityQueue()
        self.seq = itertools.count()

    def put(self, item: DelayedItem[int]) -> None:
        self.q.put((item.deadline, next(self.seq), item))

    def take(self) -> DelayedItem[int] | None:
        deadline, _, item = self.q.get()
        if item is _STOP:
            return None
        delay = deadline - monotonic()
        if delay > 0:
            time.sleep(delay)
        return item

    def close(self) -> None:
        for _ in range(CONSUMERS):
            self.put(_STOP)


class DelayQueueAdapter:
    def __init__(self) -> None:
        self.q: DelayQueue[DelayedItem[int]] = DelayQueue()
        self.put = self.q.put
        self.close = self.q.close

    def take(self) -> DelayedItem[int] | None:
        try:
            return self.q.take()
        except QueueClosed:
            return None


ThreadQueue = BareHeap | SleepingPriorityQueue | DelayQueueAdapter


# -- thread-based measurements ----------------------------------------------------------
def thread_throughput_1(make: Callable[[], ThreadQueue], items: Items) -> float:
    q = make()
    put, take = q.put, q.take
    n = len(items)
    start = perf_counter()
    for item in items:
        put(item)
    for _ in range(n):
        take()
    return n / (perf_counter() - start)


def thread_throughput_4x4(make: Callable[[], ThreadQueue], items: Items) -> float:
    q = make()
    slices = [items[i::PRODUCERS] for i in range(PRODUCERS)]
    go = threading.Barrier(PRODUCERS + CONSUMERS + 1)

    def produce(part: Items) -> None:
        put = q.put
        go.wait()
        for item in part:
            put(item)

    def consume() -> None:
        take = q.take
        go.wait()
        while take() is not None:
            pass

    producers = [threading.Thread(target=produce, args=(s,)) for s in slices]
    consumers = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    for t in producers + consumers:
        t.start()
    go.wait()
    start = perf_counter()
    for t in producers:
        t.join()
    q.close()  # consumers take every due item, then stop
    for t in consumers:
        t.join()
    return len(items) / (perf_counter() - start)


def thread_lateness(make: Callable[[], ThreadQueue], items: Items) -> list[float]:
    q = make()
    results: list[list[float]] = [[] for _ in range(CONSUMERS)]

    def consume(out: list[float]) -> None:
        take = q.take
        append = out.append
        while (item := take()) is not None:
            append(monotonic() - item.deadline)

    consumers = [threading.Thread(target=consume, args=(r,)) for r in results]
    for t in consumers:
        t.start()
    for item in items:
        q.put(item)
    _wait_for(lambda: sum(map(len, results)) >= len(items), items)
    q.close()
    for t in consumers:
        t.join()
    return [x for r in results for x in r]


def _wait_for(done: Callable[[], bool], items: Items) -> None:
    last = max(i.deadline for i in items)
    while not done():
        time.sleep(min(0.05, max(0.001, last - monotonic())))


# -- sched.scheduler ----------------------------------------------------------------------
def sched_throughput_1(items: Items) -> float:
    s = sched.scheduler(monotonic, time.sleep)
    n = len(items)
    noop = _noop
    start = perf_counter()
    for item in items:
        s.enterabs(item.deadline, 0, noop)
    s.run()
    return n / (perf_counter() - start)


def _noop() -> None:
    pass


def sched_lateness(items: Items) -> list[float]:
    s = sched.scheduler(monotonic, time.sleep)
    out: list[float] = []
    append = out.append
    for item in items:
        deadline = item.deadline
        s.enterabs(deadline, 0, lambda d=deadline: append(monotonic() - d))
    s.run()
    return out


# -- asyncio: loop.call_at and AsyncDelayQueue -----------------------------------------
def call_at_throughput_1(items: Items) -> float:
    async def body() -> float:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        n = len(items)
        count = [0]

        def tick() -> None:
            count[0] += 1
            if count[0] == n:
                done.set_result(None)

        start = perf_counter()
        call_at = loop.call_at
        for item in items:
            call_at(item.deadline, tick)
        await done
        return n / (perf_counter() - start)

    return asyncio.run(body())


def call_at_lateness(items: Items) -> list[float]:
    async def body() -> list[float]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        out: list[float] = []
        n = len(items)

        def fire(deadline: float) -> None:
            out.append(monotonic() - deadline)
            if len(out) == n:
                done.set_result(None)

        for item in items:
            loop.call_at(item.deadline, fire, item.deadline)
        await done
        return out

    return asyncio.run(body())


def async_queue_throughput_1(items: Items) -> float:
    async def body() -> float:
        q: AsyncDelayQueue[DelayedItem[int]] = AsyncDelayQueue()
        put, take = q.put, q.take
        n = len(items)
        start = perf_counter()
        for item in items:
            put(item)
        for _ in range(n):
            await take()
        return n / (perf_counter() - start)

    return asyncio.run(body())


async def _async_consume(q: AsyncDelayQueue[DelayedItem[int]], out: list[float] | None) -> None:
    take = q.take
    while True:
        try:
            item = await take()
        except QueueClosed:
            return
        if out is not None:
            out.append(monotonic() - item.deadline)


def async_queue_throughput_4x4(items: Items) -> float:
    async def body() -> float:
        q: AsyncDelayQueue[DelayedItem[int]] = AsyncDelayQueue()

        async def produce(part: Items) -> None:
            put = q.put
            for i, item in enumerate(part):
                put(item)
                if i % 64 == 63:
                    await asyncio.sleep(0)  # let consumers interleave

        start = perf_counter()
        consumers = [asyncio.create_task(_async_consume(q, None)) for _ in range(CONSUMERS)]
        await asyncio.gather(*(produce(items[i::PRODUCERS]) for i in range(PRODUCERS)))
        q.close()
        await asyncio.gather(*consumers)
        return len(items) / (perf_counter() - start)

    return asyncio.run(body())


def async_queue_lateness(items: Items) -> list[float]:
    async def body() -> list[float]:
        q: AsyncDelayQueue[DelayedItem[int]] = AsyncDelayQueue()
        results: list[list[float]] = [[] for _ in range(CONSUMERS)]
        consumers = [asyncio.create_task(_async_consume(q, r)) for r in results]
        for item in items:
            q.put(item)
        last = max(i.deadline for i in items)
        while sum(map(len, results)) < len(items):
            await asyncio.sleep(min(0.05, max(0.001, last - monotonic())))
        q.close()
        await asyncio.gather(*consumers)
        return [x for r in results for x in r]

    return asyncio.run(body())


# -- the run --------------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    tp1: float | None = None
    tp44: float | None = None
    late: list[float] | None = None


def due_items(n: int, seed: int) -> Items:
    """``n`` items already due, in random deadline order."""
    rng = random.Random(seed)
    now = monotonic()
    return [DelayedItem(i, now - 1.0 - rng.random()) for i in range(n)]


def future_items(cfg: Config, seed: int) -> Items:
    rng = random.Random(seed)
    start = monotonic() + cfg.lateness_lead
    return [
        DelayedItem(i, start + rng.uniform(0, cfg.lateness_span)) for i in range(cfg.lateness_items)
    ]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or model
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{model}, nproc={cpus}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.system()} {platform.release()}"
    )


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    tp1: Callable[[Items], float]
    tp44: Callable[[Items], float] | None
    lateness: Callable[[Items], list[float]]


def _thread_peer(name: str, make: Callable[[], ThreadQueue]) -> Peer:
    return Peer(
        name,
        lambda items: thread_throughput_1(make, items),
        lambda items: thread_throughput_4x4(make, items),
        lambda items: thread_lateness(make, items),
    )


PEERS = [
    _thread_peer("DelayQueue", DelayQueueAdapter),
    Peer(
        "AsyncDelayQueue",
        async_queue_throughput_1,
        async_queue_throughput_4x4,
        async_queue_lateness,
    ),
    _thread_peer("heapq + Condition (floor)", BareHeap),
    _thread_peer("queue.PriorityQueue + sleep", SleepingPriorityQueue),
    Peer("sched.scheduler", sched_throughput_1, None, sched_lateness),
    Peer("asyncio loop.call_at", call_at_throughput_1, None, call_at_lateness),
]


def run(cfg: Config, out: Callable[[str], object] = print) -> list[Row]:
    """Measure every peer; throughput rounds are interleaved across peers, so
    a burst of load from elsewhere on the machine hits all of them alike, and
    the median round is reported."""
    tp_items = due_items(cfg.throughput_items, 1)
    tp1: dict[str, list[float]] = {p.name: [] for p in PEERS}
    tp44: dict[str, list[float]] = {p.name: [] for p in PEERS}
    for round_no in range(cfg.repeats):
        out(f"  throughput round {round_no + 1}/{cfg.repeats} ...")
        for peer in PEERS:
            gc.collect()
            tp1[peer.name].append(peer.tp1(tp_items))
            if peer.tp44 is not None:
                gc.collect()
                tp44[peer.name].append(peer.tp44(tp_items))
    rows = []
    for peer in PEERS:
        out(f"  lateness of {peer.name} ...")
        gc.collect()
        late = sorted(peer.lateness(future_items(cfg, 2)))
        rows.append(
            Row(
                peer.name,
                statistics.median(tp1[peer.name]),
                statistics.median(tp44[peer.name]) if tp44[peer.name] else None,
                late,
            )
        )
    return rows


def render(rows: list[Row], cfg: Config) -> str:
    def rate(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    floor = next(r for r in rows if r.name.endswith("(floor)"))
    lines = [
        f"Machine: {machine()}",
        f"put+take: {cfg.throughput_items:,} items, median of {cfg.repeats} interleaved rounds; "
        f"lateness: "
        f"{cfg.lateness_items:,} items due uniformly over {cfg.lateness_span:g} s, "
        f"{CONSUMERS} consumers",
        "",
        "| peer | put+take 1 thread (items/s) | put+take 4P+4C (items/s) "
        "| lateness p50 (ms) | p99 (ms) | max (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        late = r.late or [0.0]
        lines.append(
            f"| {r.name} | {rate(r.tp1)} | {rate(r.tp44)} "
            f"| {percentile(late, 0.5) * 1e3:.3f} | {percentile(late, 0.99) * 1e3:.3f} "
            f"| {late[-1] * 1e3:.3f} |"
        )
    lines.append("")
    lines.append(
        "n/a: sched.scheduler and loop.call_at run callbacks on one thread / one event "
        "loop; they have no separate consumers."
    )
    dq = rows[0]
    assert dq.tp1 and dq.tp44 and floor.tp1 and floor.tp44 and dq.late
    ratio1, ratio44 = dq.tp1 / floor.tp1, dq.tp44 / floor.tp44
    p99 = percentile(dq.late, 0.99) * 1e3
    lines.append(
        f"DelayQueue vs floor: {ratio1:.2f}x (1 thread), {ratio44:.2f}x (4P+4C); "
        f"target >= 0.70x: {'met' if min(ratio1, ratio44) >= 0.7 else 'MISSED'}"
    )
    lines.append(
        f"DelayQueue lateness p99 {p99:.3f} ms; target <= 2 ms: {'met' if p99 <= 2.0 else 'MISSED'}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    print("In-process delay structures" + (" (quick)" if args.quick else ""))
    rows = run(cfg, out=lambda s: print(s, file=sys.stderr))
    print(render(rows, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())

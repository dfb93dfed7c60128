"""In-process delay queues as users call them: put_after/put_at, take/poll, lateness.

    python -m bench.inprocess            # 10k, 200k and 1M items (a few minutes)
    python -m bench.inprocess --quick    # 10k and 50k items (seconds)

Peers, all measured in the same run on the same inputs, rounds interleaved:

* ``DelayQueue`` (threads) and ``AsyncDelayQueue`` (asyncio tasks), through
  the calls a user makes: ``put_after(value, delay)`` / ``put_at(value,
  deadline)``, then ``take()`` / ``poll()``;
* a bare ``heapq`` + ``threading.Condition`` loop: the floor, the least code
  that is still correct (``put_after`` computes the deadline, pushes
  ``(deadline, seq, value)`` and notifies; every consumer waits timed for the
  head);
* ``queue.PriorityQueue`` with a sleeping consumer (get the earliest item,
  ``time.sleep`` until it is due; an earlier item arriving meanwhile waits);
* ``sched.scheduler`` (one thread runs it: it has no consumer threads);
* asyncio ``loop.call_later`` (one event loop).

Columns:

* put_after+take, 1 thread: N values put with delay 0, then N taken, items
  per CPU second of the calling thread (``time.thread_time``: on a shared,
  loaded machine wall time mostly measures the neighbours), at N = 10k, 200k
  and 1M (so N pending at the peak; 10k is repeated 20 times per round); the
  median of interleaved rounds (5, or 3 at 1M). ``sched`` and ``call_later``
  enter N and run them;
* put_at+poll, 1 thread, N = 200k: deadlines already passed, then ``poll()``
  N times (``get_nowait`` / the same loop for the floor), per CPU second;
* put_after+take, 4P+4C, N = 200k: 4 producer threads put N/4 each while 4
  consumers take (tasks instead of threads for ``AsyncDelayQueue``), items per
  wall-clock second (hand-offs between threads are the point here);
* lateness p50/p99/max: 100,000 items due uniformly over 5 s (starting 1 s
  after the first put), 4 consumers; lateness = time the consumer got the item
  minus its deadline, in milliseconds.

The garbage collector stays enabled, as in real use. Targets: DelayQueue
put_after+take >= 1.0x the floor, 1 thread and 4P+4C; lateness p99 <= 2 ms.
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
from dataclasses import dataclass, field

from delayq import AsyncDelayQueue, DelayQueue, QueueClosed

monotonic = time.monotonic
perf_counter = time.perf_counter
thread_cpu = time.thread_time  # one-thread columns: CPU seconds of the calling thread

PRODUCERS = 4
CONSUMERS = 4
BIG = 500_000  # sizes from here on get at most three rounds (each takes seconds)


@dataclass(frozen=True, slots=True)
class Config:
    sizes: tuple[int, ...]
    other_items: int  # put_at+poll and 4P+4C
    lateness_items: int
    lateness_span: float
    lateness_lead: float
    repeats: int


FULL = Config((10_000, 200_000, 1_000_000), 200_000, 100_000, 5.0, 1.0, 5)
QUICK = Config((10_000, 50_000), 20_000, 10_000, 1.0, 0.5, 1)


# -- the floor: bare heapq + Condition ----------------------------------------
class BareHeap:
    """The least code that is still a correct blocking delay queue."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []
        self.cond = threading.Condition(threading.Lock())
        self.seq = itertools.count()
        self.closed = False

    def put_after(self, value: int, delay: float) -> None:
        deadline = monotonic() + delay
        with self.cond:
            heapq.heappush(self.heap, (deadline, next(self.seq), value))
            self.cond.notify()

    def put_at(self, value: int, deadline: float) -> None:
        with self.cond:
            heapq.heappush(self.heap, (deadline, next(self.seq), value))
            self.cond.notify()

    def take(self) -> int | None:
        """The earliest value once due; None when closed and nothing is due."""
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

    def poll(self) -> int | None:
        with self.cond:
            if self.heap and self.heap[0][0] <= monotonic():
                return heapq.heappop(self.heap)[2]
            return None

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def consume(self, record: Callable[[int], object] | None) -> None:
        take = self.take
        while (value := take()) is not None:
            if record is not None:
                record(value)


# -- PriorityQueue with a sleeping consumer ---------------------------------------
_STOP = -1


class SleepingPriorityQueue:
    def __init__(self) -> None:
        self.q: queue.PriorityQueue[tuple[float, int, int]] = queue.PriorityQueue()
        self.seq = itertools.count()

    def put_after(self, value: int, delay: float) -> None:
        self.q.put((monotonic() + delay, next(self.seq), value))

    def put_at(self, value: int, deadline: float) -> None:
        self.q.put((deadline, next(self.seq), value))

    def take(self) -> int | None:
        deadline, _, value = self.q.get()
        if value == _STOP:
            return None
        delay = deadline - monotonic()
        if delay > 0:
            time.sleep(delay)
        return value

    def poll(self) -> int | None:
        try:
            deadline, seq, value = self.q.get_nowait()
        except queue.Empty:
            return None
        if deadline > monotonic():
            self.q.put((deadline, seq, value))
            return None
        return value

    def close(self) -> None:
        for _ in range(CONSUMERS):
            self.q.put((float("inf"), next(self.seq), _STOP))

    def consume(self, record: Callable[[int], object] | None) -> None:
        take = self.take
        while (value := take()) is not None:
            if record is not None:
                record(value)


class DelayQueueAdapter:
    """``DelayQueue`` as users call it (its own methods, nothing wrapped)."""

    def __init__(self) -> None:
        self.q: DelayQueue[object] = DelayQueue()
        self.put_after = self.q.put_after
        self.put_at = self.q.put_at
        self.take = self.q.take
        self.poll = self.q.poll
        self.close = self.q.close

    def consume(self, record: Callable[[int], object] | None) -> None:
        take = self.take
        try:
            while True:
                item = take()
                if record is not None:
                    record(item.value)  # type: ignore[attr-defined]
        except QueueClosed:
            return


ThreadQueue = BareHeap | SleepingPriorityQueue | DelayQueueAdapter


# -- thread-based measurements ----------------------------------------------------------
def thread_put_after_take(make: Callable[[], ThreadQueue], n: int) -> float:
    q = make()
    put_after, take = q.put_after, q.take
    start = thread_cpu()
    for value in range(n):
        put_after(value, 0)
    for _ in range(n):
        take()
    return n / (thread_cpu() - start)


def thread_put_at_poll(make: Callable[[], ThreadQueue], n: int) -> float:
    q = make()
    put_at, poll = q.put_at, q.poll
    due = monotonic() - 1.0
    start = thread_cpu()
    for value in range(n):
        put_at(value, due)
    for _ in range(n):
        poll()
    return n / (thread_cpu() - start)


def thread_4x4(make: Callable[[], ThreadQueue], n: int) -> float:
    q = make()
    go = threading.Barrier(PRODUCERS + CONSUMERS + 1)

    def produce(part: range) -> None:
        put_after = q.put_after
        go.wait()
        for value in part:
            put_after(value, 0)

    def consume() -> None:
        go.wait()
        q.consume(None)

    producers = [
        threading.Thread(target=produce, args=(range(i, n, PRODUCERS),)) for i in range(PRODUCERS)
    ]
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
    return n / (perf_counter() - start)


def thread_lateness(make: Callable[[], ThreadQueue], deadlines: list[float]) -> list[float]:
    q = make()
    got = [0.0] * len(deadlines)
    count = [0]

    def record(value: int) -> None:
        got[value] = monotonic()
        count[0] += 1

    consumers = [threading.Thread(target=q.consume, args=(record,)) for _ in range(CONSUMERS)]
    for t in consumers:
        t.start()
    put_at = q.put_at
    for value, deadline in enumerate(deadlines):
        put_at(value, deadline)
    _wait_for(lambda: count[0] >= len(deadlines), deadlines)
    q.close()
    for t in consumers:
        t.join()
    return [g - d for g, d in zip(got, deadlines, strict=True)]


def _wait_for(done: Callable[[], bool], deadlines: list[float]) -> None:
    last = max(deadlines)
    while not done():
        time.sleep(min(0.05, max(0.001, last - monotonic())))


# -- sched.scheduler ----------------------------------------------------------------------
def _noop() -> None:
    pass


def sched_put_take(n: int) -> float:
    s = sched.scheduler(monotonic, time.sleep)
    enter = s.enter
    start = thread_cpu()
    for _ in range(n):
        enter(0, 0, _noop)
    s.run()
    return n / (thread_cpu() - start)


def sched_lateness(deadlines: list[float]) -> list[float]:
    s = sched.scheduler(monotonic, time.sleep)
    out: list[float] = []
    append = out.append
    for deadline in deadlines:
        s.enterabs(deadline, 0, lambda d=deadline: append(monotonic() - d))
    s.run()
    return out


# -- asyncio: loop.call_later and AsyncDelayQueue -----------------------------------------
def call_later_put_take(n: int) -> float:
    async def body() -> float:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        count = [0]

        def tick() -> None:
            count[0] += 1
            if count[0] == n:
                done.set_result(None)

        start = thread_cpu()
        call_later = loop.call_later
        for _ in range(n):
            call_later(0, tick)
        await done
        return n / (thread_cpu() - start)

    return asyncio.run(body())


def call_at_lateness(deadlines: list[float]) -> list[float]:
    async def body() -> list[float]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        out: list[float] = []
        n = len(deadlines)

        def fire(deadline: float) -> None:
            out.append(monotonic() - deadline)
            if len(out) == n:
                done.set_result(None)

        for deadline in deadlines:
            loop.call_at(deadline, fire, deadline)
        await done
        return out

    return asyncio.run(body())


def async_put_after_take(n: int) -> float:
    async def body() -> float:
        q: AsyncDelayQueue[object] = AsyncDelayQueue()
        put_after, take = q.put_after, q.take
        start = thread_cpu()
        for value in range(n):
            put_after(value, 0)
        for _ in range(n):
            await take()
        return n / (thread_cpu() - start)

    return asyncio.run(body())


def async_put_at_poll(n: int) -> float:
    async def body() -> float:
        q: AsyncDelayQueue[object] = AsyncDelayQueue()
        put_at, poll = q.put_at, q.poll
        due = monotonic() - 1.0
        start = thread_cpu()
        for value in range(n):
            put_at(value, due)
        for _ in range(n):
            poll()
        return n / (thread_cpu() - start)

    return asyncio.run(body())


async def _async_consume(
    q: AsyncDelayQueue[object], record: Callable[[int], object] | None
) -> None:
    take = q.take
    while True:
        try:
            item = await take()
        except QueueClosed:
            return
        if record is not None:
            record(item.value)  # type: ignore[attr-defined]


def async_4x4(n: int) -> float:
    async def body() -> float:
        q: AsyncDelayQueue[object] = AsyncDelayQueue()

        async def produce(part: range) -> None:
            put_after = q.put_after
            for i, value in enumerate(part):
                put_after(value, 0)
                if i % 64 == 63:
                    await asyncio.sleep(0)  # let consumers interleave

        start = perf_counter()
        consumers = [asyncio.create_task(_async_consume(q, None)) for _ in range(CONSUMERS)]
        await asyncio.gather(*(produce(range(i, n, PRODUCERS)) for i in range(PRODUCERS)))
        q.close()
        await asyncio.gather(*consumers)
        return n / (perf_counter() - start)

    return asyncio.run(body())


def async_lateness(deadlines: list[float]) -> list[float]:
    async def body() -> list[float]:
        q: AsyncDelayQueue[object] = AsyncDelayQueue()
        got = [0.0] * len(deadlines)
        count = [0]

        def record(value: int) -> None:
            got[value] = monotonic()
            count[0] += 1

        consumers = [asyncio.create_task(_async_consume(q, record)) for _ in range(CONSUMERS)]
        for value, deadline in enumerate(deadlines):
            q.put_at(value, deadline)
        last = max(deadlines)
        while count[0] < len(deadlines):
            await asyncio.sleep(min(0.05, max(0.001, last - monotonic())))
        q.close()
        await asyncio.gather(*consumers)
        return [g - d for g, d in zip(got, deadlines, strict=True)]

    return asyncio.run(body())


# -- the run --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    put_take: Callable[[int], float]
    put_at_poll: Callable[[int], float] | None
    four_by_four: Callable[[int], float] | None
    lateness: Callable[[list[float]], list[float]]
    max_items: int | None = None  # larger sizes are skipped (too slow to repeat)


def _thread_peer(name: str, make: Callable[[], ThreadQueue]) -> Peer:
    return Peer(
        name,
        lambda n: thread_put_after_take(make, n),
        lambda n: thread_put_at_poll(make, n),
        lambda n: thread_4x4(make, n),
        lambda deadlines: thread_lateness(make, deadlines),
    )


FLOOR = "heapq + Condition (floor)"
PEERS = [
    _thread_peer("DelayQueue", DelayQueueAdapter),
    Peer("AsyncDelayQueue", async_put_after_take, async_put_at_poll, async_4x4, async_lateness),
    _thread_peer(FLOOR, BareHeap),
    _thread_peer("queue.PriorityQueue + sleep", SleepingPriorityQueue),
    # sched.run sleeps (time.sleep(0)) after every event: ~10k events/s here.
    Peer("sched.scheduler", sched_put_take, None, None, sched_lateness, max_items=200_000),
    Peer("asyncio loop.call_later", call_later_put_take, None, None, call_at_lateness),
]


@dataclass
class Row:
    name: str
    put_take: dict[int, list[float]] = field(default_factory=dict)
    put_at_poll: list[float] = field(default_factory=list)
    four_by_four: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)


MIN_ITEMS = 200_000  # a smaller size is repeated up to this many items per round


def _repeated(measure: Callable[[int], float], n: int) -> float:
    """Items/s over ``MIN_ITEMS // n`` runs of ``measure(n)``: a run of 10k is too short to time."""
    runs = max(1, MIN_ITEMS // n)
    seconds = sum(n / measure(n) for _ in range(runs))
    return n * runs / seconds


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run(cfg: Config, out: Callable[[str], object] = print) -> list[Row]:
    """Measure every peer; rounds are interleaved across peers, so a burst of
    load from elsewhere on the machine hits all of them alike, and the median
    round is reported."""
    rows = {p.name: Row(p.name) for p in PEERS}
    for size in cfg.sizes:
        rounds = cfg.repeats if size < BIG else min(cfg.repeats, 3)
        for round_no in range(rounds):
            out(f"  put_after+take, {size:,} items: round {round_no + 1}/{rounds} ...")
            for peer in PEERS:
                if peer.max_items is not None and size > peer.max_items:
                    continue
                gc.collect()
                rows[peer.name].put_take.setdefault(size, []).append(_repeated(peer.put_take, size))
    for round_no in range(cfg.repeats):
        out(f"  put_at+poll and 4P+4C: round {round_no + 1}/{cfg.repeats} ...")
        for peer in PEERS:
            if peer.put_at_poll is not None:
                gc.collect()
                rows[peer.name].put_at_poll.append(peer.put_at_poll(cfg.other_items))
            if peer.four_by_four is not None:
                gc.collect()
                rows[peer.name].four_by_four.append(peer.four_by_four(cfg.other_items))
    rng = random.Random(2)
    for peer in PEERS:
        out(f"  lateness of {peer.name} ...")
        start = monotonic() + cfg.lateness_lead
        deadlines = [start + rng.uniform(0, cfg.lateness_span) for _ in range(cfg.lateness_items)]
        gc.collect()
        rows[peer.name].late = sorted(peer.lateness(deadlines))
    return list(rows.values())


def percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def machine(load: tuple[float, float]) -> str:
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
        f"({platform.python_implementation()}), {platform.system()} {platform.release()}; "
        f"1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end"
    )


def render(rows: list[Row], cfg: Config, load: tuple[float, float]) -> str:
    def rate(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    sizes = cfg.sizes
    lines = [
        f"Machine: {machine(load)}",
        f"items/s: 1 thread per CPU second of that thread, 4P+4C per wall-clock second; "
        f"median of {cfg.repeats} interleaved rounds (3 at 1M); "
        f"put_at+poll and 4P+4C: {cfg.other_items:,} items; lateness: "
        f"{cfg.lateness_items:,} items due uniformly over {cfg.lateness_span:g} s, "
        f"{CONSUMERS} consumers",
        "",
        "| peer | "
        + " | ".join(f"put_after+take {n:,}" for n in sizes)
        + " | put_at+poll | put_after+take 4P+4C | lateness p50 (ms) | p99 (ms) | max (ms) |",
        "| --- | " + " | ".join("---:" for _ in sizes) + " | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        late = r.late or [0.0]
        lines.append(
            f"| {r.name} | "
            + " | ".join(rate(_median(r.put_take.get(n, []))) for n in sizes)
            + f" | {rate(_median(r.put_at_poll))} | {rate(_median(r.four_by_four))} "
            f"| {percentile(late, 0.5) * 1e3:.3f} | {percentile(late, 0.99) * 1e3:.3f} "
            f"| {late[-1] * 1e3:.3f} |"
        )
    lines.append("")
    lines.append(
        "n/a: sched.scheduler and loop.call_later run callbacks on one thread / one event "
        "loop; they have no separate consumers (their put_after+take column enters N "
        "callbacks due now and runs them); sched.scheduler sleeps after every event, "
        "so it is not run at 1M."
    )
    by_name = {r.name: r for r in rows}
    dq, floor = by_name["DelayQueue"], by_name[FLOOR]
    ratios = [(f"put_after+take {n:,}", dq.put_take[n], floor.put_take[n]) for n in sizes] + [
        ("put_at+poll", dq.put_at_poll, floor.put_at_poll),
        ("4P+4C", dq.four_by_four, floor.four_by_four),
    ]
    parts = []
    worst = float("inf")
    for label, ours, theirs in ratios:
        ratio = statistics.median(ours) / statistics.median(theirs)
        worst = min(worst, ratio)
        parts.append(f"{ratio:.2f}x ({label})")
    lines.append(
        "DelayQueue vs floor: "
        + ", ".join(parts)
        + f"; target >= 1.0x: {'met' if worst >= 1.0 else 'MISSED'}"
    )
    p99 = percentile(dq.late, 0.99) * 1e3
    lines.append(
        f"DelayQueue lateness p99 {p99:.3f} ms; target <= 2 ms: {'met' if p99 <= 2.0 else 'MISSED'}"
    )
    return "\n".join(lines)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        return float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    print("In-process delay structures" + (" (quick)" if args.quick else ""))
    load_start = _load()
    rows = run(cfg, out=lambda s: print(s, file=sys.stderr))
    print(render(rows, cfg, (load_start, _load())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

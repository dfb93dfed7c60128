"""In-process timers as users call them: schedule and cancel on a running timer, memory, lateness.

    python -m bench.timers            # 10k, 200k and 1M pending; 100,000 due over 5 s
    python -m bench.timers --quick    # 10k and 50k pending; 10,000 due over 1 s

Peers, measured in the same run, on the same random delays, rounds interleaved:

* ``TimingWheel`` (Kafka's hierarchical wheel; defaults: 1 ms tick, 20 slots),
* ``HashedWheelTimer`` (defaults: 10 ms tick, 512 slots),
* ``DelayQueueTimer`` (a heap: ``DelayQueue``),
* asyncio ``loop.call_later`` / ``loop.call_at`` and ``TimerHandle.cancel``,
  inside a running event loop,
* the PyPI ``timingwheel`` package, when it imports (it is never a delayq
  dependency; its row says why it is skipped).

Schedule + cancel table: each delayq timer is started as a context manager
(real clock, driver thread alive, default thread pool, its lock taken by every
call), then ``schedule_after(d, fn)`` is called for N delays uniform in
[10, 70) s, and ``cancel()`` on every other handle; the same with
``schedule_at(now + d, fn)``. asyncio does the same with ``call_later`` /
``call_at`` inside ``asyncio.run``. Rates are per CPU second of the whole
process (``time.process_time``: the drivers' own work counts, and other
processes on a shared machine count less than in wall time), the median of
interleaved rounds. "vs asyncio" compares the time of N schedules plus N/2
cancels with asyncio's. The garbage collector stays enabled, as in real use.
The delays start at 10 s so that nothing fires while a million schedules
run: asyncio's loop cannot run callbacks during a synchronous loop, while a
wheel's driver and pool would (their cost is the lateness table's).

Memory: tracemalloc growth while N = 200,000 timers scheduled with
``schedule_after`` are pending, divided by N: the handle, its deadline float
and the timer's own structure (the caller's list of handles is allocated
before the measurement and not counted).

Lateness table (real time): 100,000 timers due uniformly over 5 s, starting
1 s after the first is scheduled; lateness = when the callback ran minus its
deadline. delayq timers use their default thread pool; asyncio runs the loop.

Targets: TimingWheel and HashedWheelTimer schedule+cancel >= 2x asyncio at
200k and 1M pending; <= 100 bytes per pending timer; lateness p99 <= tick + 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq import DelayQueueTimer, HashedWheelTimer, TimingWheel

cpu_time = time.process_time
monotonic = time.monotonic


@dataclass(frozen=True, slots=True)
class Config:
    sizes: tuple[int, ...]
    rounds: int
    memory_timers: int
    lateness_timers: int
    lateness_span: float
    lateness_lead: float


FULL = Config((10_000, 200_000, 1_000_000), 5, 200_000, 100_000, 5.0, 1.0)
QUICK = Config((10_000, 50_000), 1, 20_000, 10_000, 1.0, 0.5)
BIG = 500_000  # sizes from here on get fewer rounds (three at most): each takes seconds

TIMERS: dict[str, Callable[[], Any]] = {
    "TimingWheel (1 ms, 20 slots)": TimingWheel,
    "HashedWheelTimer (10 ms, 512 slots)": HashedWheelTimer,
    "DelayQueueTimer (heap)": DelayQueueTimer,
}
ASYNCIO = "asyncio call_later / call_at"
TARGETS = ("TimingWheel (1 ms, 20 slots)", "HashedWheelTimer (10 ms, 512 slots)")


def _noop() -> None:
    pass


@dataclass(slots=True)
class Sample:
    """CPU seconds of one round: N schedules (after / at) and N/2 cancels (of each)."""

    after: float
    at: float
    cancel: float


@dataclass(slots=True)
class Result:
    name: str
    size: int
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)


# -- schedule + cancel on a running timer ------------------------------------------------
def delayq_round(make: Callable[[], Any], delays: list[float]) -> Sample:
    with make() as timer:
        schedule_after = timer.schedule_after
        gc.collect()
        t = cpu_time()
        handles = [schedule_after(d, _noop) for d in delays]
        after = cpu_time() - t
        t = cpu_time()
        for handle in handles[::2]:
            handle.cancel()
        cancel = cpu_time() - t
        timer.stop(wait=False)
    del handles
    with make() as timer:
        schedule_at = timer.schedule_at
        now = monotonic()
        deadlines = [now + d for d in delays]
        gc.collect()
        t = cpu_time()
        handles = [schedule_at(d, _noop) for d in deadlines]
        at = cpu_time() - t
        assert len(handles) == len(deadlines)
        timer.stop(wait=False)
    return Sample(after, at, cancel)


def asyncio_round(delays: list[float]) -> Sample:
    async def body() -> Sample:
        loop = asyncio.get_running_loop()
        call_later = loop.call_later
        gc.collect()
        t = cpu_time()
        handles = [call_later(d, _noop) for d in delays]
        after = cpu_time() - t
        t = cpu_time()
        for handle in handles[::2]:
            handle.cancel()
        cancel = cpu_time() - t
        for handle in handles:
            handle.cancel()
        del handles
        call_at = loop.call_at
        now = loop.time()
        deadlines = [now + d for d in delays]
        gc.collect()
        t = cpu_time()
        handles = [call_at(d, _noop) for d in deadlines]
        at = cpu_time() - t
        for handle in handles:
            handle.cancel()
        return Sample(after, at, cancel)

    return asyncio.run(body())


def run_schedule_cancel(cfg: Config, log: Callable[[str], None]) -> list[Result]:
    results: list[Result] = []
    for size in cfg.sizes:
        rng = random.Random(size)
        delays = [rng.uniform(10.0, 70.0) for _ in range(size)]
        by_name = {name: Result(name, size) for name in (*TIMERS, ASYNCIO)}
        rounds = cfg.rounds if size < BIG else min(cfg.rounds, 3)
        for round_no in range(rounds):
            log(f"schedule+cancel: {size:,} pending, round {round_no + 1}/{rounds}")
            for name, make in TIMERS.items():
                by_name[name].samples.append(delayq_round(make, delays))
            by_name[ASYNCIO].samples.append(asyncio_round(delays))
        results.extend(by_name.values())
    return results


# -- memory -------------------------------------------------------------------------------
def delayq_memory(make: Callable[[], Any], delays: list[float]) -> float:
    handles: list[Any] = [None] * len(delays)
    with make() as timer:
        schedule_after = timer.schedule_after
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for i, d in enumerate(delays):
            handles[i] = schedule_after(d, _noop)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        timer.stop(wait=False)
    return used / len(delays)


def asyncio_memory(delays: list[float]) -> float:
    async def body() -> float:
        loop = asyncio.get_running_loop()
        handles: list[Any] = [None] * len(delays)
        call_later = loop.call_later
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for i, d in enumerate(delays):
            handles[i] = call_later(d, _noop)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        for handle in handles:
            handle.cancel()
        return used / len(delays)

    return asyncio.run(body())


def run_memory(cfg: Config, log: Callable[[str], None]) -> dict[str, float]:
    rng = random.Random(3)
    delays = [rng.uniform(10.0, 70.0) for _ in range(cfg.memory_timers)]
    out: dict[str, float] = {}
    for name, make in TIMERS.items():
        log(f"memory: {name}")
        out[name] = delayq_memory(make, delays)
    log("memory: asyncio")
    out[ASYNCIO] = asyncio_memory(delays)
    return out


def timingwheel_note() -> str:
    try:
        import timingwheel  # type: ignore[import-not-found]  # noqa: F401, PLC0415
    except Exception as exc:  # ImportError, or the package's own import-time failure
        return (
            f"PyPI timingwheel: skipped, cannot import it ({type(exc).__name__}: {exc}); "
            "version 0.4 (2016) also fails to build on Python 3.11 (its setup.py imports "
            "the package: circular import of BaseWheel)"
        )
    return "PyPI timingwheel: skipped, installed, but it has no documented schedule/cancel API"


# -- lateness, real time ---------------------------------------------------------------------
def _wait(predicate: Callable[[], bool], timeout: float) -> None:
    end = monotonic() + timeout
    while not predicate():
        if monotonic() > end:
            raise TimeoutError("the timer did not catch up")
        time.sleep(0.001)


def delayq_lateness(make: Callable[[], Any], cfg: Config, seed: int) -> list[float]:
    rng = random.Random(seed)
    n = cfg.lateness_timers
    ran = [0.0] * n
    deadlines = [0.0] * n

    def fire(index: int) -> None:
        ran[index] = monotonic()

    with make() as timer:
        begin = monotonic() + cfg.lateness_lead
        offsets = [rng.uniform(0, cfg.lateness_span) for _ in range(n)]
        for i, offset in enumerate(offsets):
            deadlines[i] = begin + offset
            timer.schedule_at(deadlines[i], fire, i)
        _wait(lambda: timer.pending() == 0, timeout=cfg.lateness_lead + cfg.lateness_span + 60)
    # stop() waited for the pool: every callback has run.
    return [(r - d) * 1000.0 for r, d in zip(ran, deadlines, strict=True)]


def asyncio_lateness(cfg: Config, seed: int) -> list[float]:
    rng = random.Random(seed)
    n = cfg.lateness_timers

    async def body() -> list[float]:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        late: list[float] = []

        def fire(deadline: float) -> None:
            late.append((monotonic() - deadline) * 1000.0)
            if len(late) == n:
                done.set()

        begin = monotonic() + cfg.lateness_lead
        for _ in range(n):
            deadline = begin + rng.uniform(0, cfg.lateness_span)
            loop.call_at(deadline, fire, deadline)
        await done.wait()
        return late

    return asyncio.run(body())


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_lateness(cfg: Config, log: Callable[[str], None]) -> list[tuple[str, float, list[float]]]:
    out: list[tuple[str, float, list[float]]] = []
    for name, make, tick in (
        ("TimingWheel (1 ms, 20 slots)", TimingWheel, 0.001),
        ("HashedWheelTimer (10 ms, 512 slots)", HashedWheelTimer, 0.010),
        ("HashedWheelTimer (1 ms, 512 slots)", lambda: HashedWheelTimer(tick=0.001), 0.001),
        ("DelayQueueTimer (heap)", DelayQueueTimer, 0.0),
    ):
        log(f"lateness: {name}")
        gc.collect()
        out.append((name, tick, delayq_lateness(make, cfg, seed=7)))
    log("lateness: asyncio")
    gc.collect()
    out.append(("asyncio call_at", 0.0, asyncio_lateness(cfg, seed=7)))
    return out


# -- rendering ------------------------------------------------------------------------------
def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds / 1e6:.2f} M/s"


def render(
    results: list[Result],
    memory: dict[str, float],
    lateness: list[tuple[str, float, list[float]]],
    cfg: Config,
    load: tuple[float, float],
) -> str:
    lines = [
        "Schedule + cancel on a running timer: N delays in [10, 70) s, then cancel() on every "
        "other handle; rates per CPU second, median of interleaved rounds "
        f"({cfg.rounds} rounds, 3 at 1M)",
        "",
        "| pending | timer | schedule_after | schedule_at | cancel "
        "| after+cancel vs asyncio | at+cancel vs asyncio |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts: list[str] = []
    for size in cfg.sizes:
        rows = [r for r in results if r.size == size]
        base = next(r for r in rows if r.name == ASYNCIO)
        base_after = base.median("after") + base.median("cancel")
        base_at = base.median("at") + base.median("cancel")
        for r in rows:
            after = r.median("after")
            at = r.median("at")
            cancel = r.median("cancel")
            ratio_after = base_after / (after + cancel)
            ratio_at = base_at / (at + cancel)
            lines.append(
                f"| {size:,} | {r.name} | {_rate(size, after)} | {_rate(size, at)} "
                f"| {_rate(size // 2, cancel)} | {ratio_after:.2f}x | {ratio_at:.2f}x |"
            )
            if r.name in TARGETS and size >= 200_000:
                ok = min(ratio_after, ratio_at) >= 2.0
                verdicts.append(
                    f"{r.name} at {size:,}: {min(ratio_after, ratio_at):.2f}x asyncio, "
                    f"target >= 2x {'met' if ok else 'MISSED'}"
                )
    lines += [
        "",
        f"Memory: bytes per pending timer, {cfg.memory_timers:,} scheduled with schedule_after "
        "(handle, deadline and the timer's structure; the caller's list not counted)",
        "",
        "| timer | bytes / pending timer |",
        "| --- | ---: |",
    ]
    for name, used in memory.items():
        lines.append(f"| {name} | {used:.0f} |")
        if name in TARGETS:
            verdicts.append(
                f"{name}: {used:.0f} bytes per pending timer, target <= 100 "
                f"{'met' if used <= 100 else 'MISSED'}"
            )
    lines += [
        "",
        f"Lateness: {cfg.lateness_timers:,} timers due uniformly over {cfg.lateness_span:g} s "
        "(real time), milliseconds after the deadline",
        "",
        "| timer | p50 | p99 | max | min | p99 target (tick + 2 ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, tick, late in lateness:
        p99 = percentile(late, 0.99)
        lines.append(
            f"| {name} | {percentile(late, 0.5):.2f} | {p99:.2f} "
            f"| {max(late):.2f} | {min(late):.3f} | {tick * 1000 + 2:.0f} |"
        )
        if name in TARGETS or name.startswith("HashedWheelTimer (1 ms"):
            target = tick * 1000 + 2
            verdicts.append(
                f"{name}: lateness p99 {p99:.2f} ms, target <= {target:.0f} ms "
                f"{'met' if p99 <= target else 'MISSED'}"
            )
    lines += ["", timingwheel_note(), "", *verdicts, "", machine(load)]
    return "\n".join(lines)


def machine(load: tuple[float, float]) -> str:
    return (
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; 1-minute load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end"
    )


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        return float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print("In-process timers" + (" (quick)" if args.quick else ""))
    load_start = _load()
    results = run_schedule_cancel(cfg, log)
    memory = run_memory(cfg, log)
    lateness = run_lateness(cfg, log)
    print(render(results, memory, lateness, cfg, (load_start, _load())))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())

"""In-process timers side by side: schedule, cancel, expire, memory, lateness.

    python -m bench.timers            # 1,000,000 timers; 100,000 due over 5 s
    python -m bench.timers --quick    # 50,000 timers; 10,000 due over 1 s

Peers, measured in the same run on the same random delays:

* ``HashedWheelTimer`` (defaults: 10 ms tick, 512 slots),
* ``TimingWheel`` (Kafka's hierarchical wheel; defaults: 1 ms tick, 20 slots),
* ``DelayQueueTimer`` (a heap: ``DelayQueue``),
* asyncio ``loop.call_at`` / ``TimerHandle.cancel``,
* the PyPI ``timingwheel`` package, when it imports (it is never a delayq
  dependency; install it into the benchmark's own virtualenv,
  ``.venv-bench/bin/pip install timingwheel``, or its row says why it is skipped).

Throughput table (fake time, nothing sleeps): N timers with delays uniform in
[0, 60) s are scheduled (the Timer API, lock included), every other one is
cancelled, then time is advanced in 1 s steps to 61 s so the other half
expire. delayq timers run on a :class:`~delayq.testing.FakeClock` with their
real driver threads, handing due callbacks to a counting executor (so
"expire" includes the driver's wake-up and hand-off, not the callbacks);
asyncio runs on an event loop whose ``time()`` is faked, through its own
``_run_once`` (so its column includes calling the no-op callbacks).
Schedule and cancel rates are per CPU second (``time.process_time``), expire
per wall-clock second. "bytes/timer" is the tracemalloc peak while N timers are pending, divided by
N (the caller's list of handles included, for every peer). GC stays enabled.

Lateness table (real time): 100,000 timers due uniformly over 5 s, starting
1 s after the first is scheduled; lateness = when the callback ran minus its
deadline. delayq timers use their default thread pool; asyncio runs the loop.

Targets: schedule+cancel >= 2x asyncio's at 1M pending; <= 200 bytes per
pending timer; lateness p99 <= tick + 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from delayq import DelayQueueTimer, HashedWheelTimer, TimingWheel
from delayq.testing import FakeClock

perf_counter = time.perf_counter
cpu_time = time.process_time  # schedule/cancel: CPU seconds, less noisy on a shared machine
monotonic = time.monotonic

START = 1_000.0


@dataclass(frozen=True, slots=True)
class Config:
    timers: int
    lateness_timers: int
    lateness_span: float
    lateness_lead: float
    repeats: int


FULL = Config(1_000_000, 100_000, 5.0, 1.0, 2)
QUICK = Config(50_000, 10_000, 1.0, 0.5, 1)


@dataclass(slots=True)
class Row:
    name: str
    schedule: float = 0.0  # ops/s
    cancel: float = 0.0
    expire: float = 0.0
    bytes_per_timer: float = 0.0
    note: str = ""


def _noop() -> None:
    pass


class CountingExecutor(Executor):
    """Counts hand-offs instead of running them: "expire" measures the timer, not callbacks."""

    def __init__(self) -> None:
        self.count = 0
        self._done: Future[Any] = Future()
        self._done.set_result(None)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.count += 1
        return self._done


# -- delayq timers on fake time -------------------------------------------------------
TIMERS: dict[str, Callable[..., Any]] = {
    "HashedWheelTimer (10 ms, 512 slots)": HashedWheelTimer,
    "TimingWheel (1 ms, 20 slots)": TimingWheel,
    "DelayQueueTimer (heap)": DelayQueueTimer,
}


def _wait(predicate: Callable[[], bool], timeout: float = 600.0) -> None:
    end = monotonic() + timeout
    while not predicate():
        if monotonic() > end:
            raise TimeoutError("the timer did not catch up")
        time.sleep(0.0002)


def delayq_throughput(make: Callable[..., Any], deadlines: list[float]) -> tuple[float, ...]:
    clock = FakeClock(monotonic_start=START)
    executor = CountingExecutor()
    timer = make(clock=clock, executor=executor)
    try:
        gc.collect()
        schedule = timer.schedule_at
        t = cpu_time()
        handles = [schedule(d, _noop) for d in deadlines]
        scheduled = cpu_time() - t
        cancelled = handles[::2]
        t = cpu_time()
        for handle in cancelled:
            handle.cancel()
        cancel = cpu_time() - t
        live = sorted(handles[1::2], key=lambda h: h.deadline)
        expected = len(live)
        t = perf_counter()
        index = 0
        for step in range(1, 62):
            # No need to wait for the driver to be asleep: it waits until
            # absolute deadlines (Clock.wait_until), so advancing while it
            # works cannot make it oversleep.
            clock.advance_to(START + step)
            now = START + step
            while index < expected and live[index].deadline <= now - 0.011:
                index += 1
            target = index  # everything 11 ms (> one tick) before now has fired
            _wait(lambda target=target: executor.count >= target)
        _wait(lambda: executor.count == expected)
        expire = perf_counter() - t
    finally:
        timer.stop()
    n = len(deadlines)
    return n / scheduled, len(cancelled) / cancel, expected / expire


def delayq_memory(make: Callable[..., Any], deadlines: list[float]) -> float:
    clock = FakeClock(monotonic_start=START)
    timer = make(clock=clock, executor=CountingExecutor())
    try:
        schedule = timer.schedule_at
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        handles = [schedule(d, _noop) for d in deadlines]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(handles) == len(deadlines)
    finally:
        timer.stop()
    return (peak - base) / len(deadlines)


# -- asyncio call_at on fake time --------------------------------------------------------
class FakeTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is set by the benchmark."""

    fake_now = START

    def time(self) -> float:
        return self.fake_now


def asyncio_throughput(deadlines: list[float]) -> tuple[float, ...]:
    loop = FakeTimeLoop()
    fired = [0]

    def count() -> None:
        fired[0] += 1

    try:
        gc.collect()
        call_at = loop.call_at
        t = cpu_time()
        handles = [call_at(d, count) for d in deadlines]
        schedule_time = cpu_time() - t
        cancelled = handles[::2]
        t = cpu_time()
        for handle in cancelled:
            handle.cancel()
        cancel = cpu_time() - t
        expected = len(deadlines) - len(cancelled)
        t = perf_counter()
        scheduled = loop._scheduled  # type: ignore[attr-defined]
        for step in range(1, 62):
            loop.fake_now = START + step
            # _run_once pops due timers and runs them; a ready no-op keeps its
            # select() from blocking for real when the head is not due.
            while scheduled and scheduled[0].when() <= loop.fake_now:
                loop.call_soon(_noop)
                loop._run_once()  # type: ignore[attr-defined]
                scheduled = loop._scheduled  # type: ignore[attr-defined]  # may be rebuilt
        expire = perf_counter() - t
        assert fired[0] == expected, (fired[0], expected)
    finally:
        loop.close()
    return len(deadlines) / schedule_time, len(cancelled) / cancel, expected / expire


def asyncio_memory(deadlines: list[float]) -> float:
    loop = FakeTimeLoop()
    try:
        call_at = loop.call_at
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        handles = [call_at(d, _noop) for d in deadlines]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(handles) == len(deadlines)
    finally:
        loop.close()
    return (peak - base) / len(deadlines)


def timingwheel_row() -> Row:
    name = "PyPI timingwheel"
    try:
        import timingwheel  # type: ignore[import-not-found]  # noqa: F401, PLC0415
    except Exception as exc:  # ImportError, or the package's own import-time failure
        return Row(
            name,
            note=(
                f"skipped: cannot import timingwheel ({type(exc).__name__}: {exc}); "
                "version 0.4 (2016) also fails to build on Python 3.11 (its setup.py "
                "imports the package: circular import of BaseWheel)"
            ),
        )
    return Row(name, note="skipped: installed, but it has no documented schedule/cancel API")


# -- lateness, real time ---------------------------------------------------------------------
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


# -- running and rendering ------------------------------------------------------------------
def best(results: list[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(max(column) for column in zip(*results, strict=True))


def run_throughput(cfg: Config, log: Callable[[str], None]) -> list[Row]:
    rng = random.Random(42)
    deadlines = [START + rng.uniform(0, 60.0) for _ in range(cfg.timers)]
    rows: list[Row] = []
    for name, make in TIMERS.items():
        log(f"throughput: {name}")
        sched, cancel, expire = best(
            [delayq_throughput(make, deadlines) for _ in range(cfg.repeats)]
        )
        log(f"memory: {name}")
        rows.append(Row(name, sched, cancel, expire, delayq_memory(make, deadlines)))
    log("throughput: asyncio")
    sched, cancel, expire = best([asyncio_throughput(deadlines) for _ in range(cfg.repeats)])
    rows.append(Row("asyncio call_at/cancel", sched, cancel, expire, asyncio_memory(deadlines)))
    rows.append(timingwheel_row())
    return rows


def run_lateness(cfg: Config, log: Callable[[str], None]) -> list[tuple[str, float, list[float]]]:
    out: list[tuple[str, float, list[float]]] = []
    for name, make, tick in (
        ("HashedWheelTimer (10 ms, 512 slots)", HashedWheelTimer, 0.010),
        ("HashedWheelTimer (1 ms, 512 slots)", lambda: HashedWheelTimer(tick=0.001), 0.001),
        ("TimingWheel (1 ms, 20 slots)", TimingWheel, 0.001),
        ("DelayQueueTimer (heap)", DelayQueueTimer, 0.0),
    ):
        log(f"lateness: {name}")
        out.append((name, tick, delayq_lateness(make, cfg, seed=7)))
    log("lateness: asyncio")
    out.append(("asyncio call_at", 0.0, asyncio_lateness(cfg, seed=7)))
    return out


def _rate(value: float) -> str:
    return f"{value / 1e6:.2f} M/s" if value else "-"


def render(rows: list[Row], lateness: list[tuple[str, float, list[float]]], cfg: Config) -> str:
    asyncio_row = next(r for r in rows if r.name.startswith("asyncio"))
    base = 1.0 / asyncio_row.schedule + 1.0 / asyncio_row.cancel
    lines = [
        f"Timers: {cfg.timers:,} scheduled with delays in [0, 60) s, every other one "
        f"cancelled, the rest expired by advancing fake time in 1 s steps "
        f"(best of {cfg.repeats})",
        "",
        "| timer | schedule | cancel | expire | schedule+cancel vs asyncio | bytes/timer |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.note:
            lines.append(f"| {r.name} | {r.note} | | | | |")
            continue
        ratio = base / (1.0 / r.schedule + 1.0 / r.cancel)
        lines.append(
            f"| {r.name} | {_rate(r.schedule)} | {_rate(r.cancel)} | {_rate(r.expire)} "
            f"| {ratio:.2f}x | {r.bytes_per_timer:.0f} |"
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
        lines.append(
            f"| {name} | {percentile(late, 0.5):.2f} | {percentile(late, 0.99):.2f} "
            f"| {max(late):.2f} | {min(late):.3f} | {tick * 1000 + 2:.0f} |"
        )
    lines += ["", machine()]
    return "\n".join(lines)


def machine() -> str:
    return (
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print("In-process timers" + (" (quick)" if args.quick else ""))
    rows = run_throughput(cfg, log)
    lateness = run_lateness(cfg, log)
    print(render(rows, lateness, cfg))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())

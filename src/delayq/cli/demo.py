"""The order story (``delayq demo`` / ``make demo``), on SQLite, in about a minute.

A shop's delayed work, with time compressed:

* every order schedules ``order.cancel`` for "30 minutes" later (20 s);
* about a third of the orders are paid: their cancel job is cancelled, and a
  ``webhook.send`` job notifies a partner; the partner endpoint is flaky (it
  fails at random, and one partner is down for good), so the webhook is retried
  at "2s, 5s, 10s, 20s" and dead-lettered after its 5th failure;
* paid orders are delivered, and delivery schedules ``review.default``, an
  automatic good review "24 hours" later (25 s), unless the customer writes
  their own review first (that cancels the job).

A worker runs in the same process; live progress is shown while the story
runs, then a summary: scheduled, cancelled, fired, retried, dead-lettered and
lateness p50/p99/max. ``speed`` multiplies the pace (``speed=6`` finishes in
about 10 s). The same cases, one per file and readable, are in ``examples/``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from delayq.app import DelayQ
from delayq.cli._common import _BadInput, _console, _errors, _fail
from delayq.cli.experiments import EXPERIMENTS
from delayq.clock import SYSTEM_CLOCK
from delayq.job import CancelOutcome, JobContext, JobState
from delayq.worker import JobResult, Worker

__all__ = ["DemoConfig", "DemoSummary", "demo", "experiment", "run_demo"]

# The story at speed 1, in demo seconds (what each stands for, in the shop's time).
CANCEL_AFTER = 20.0  # "30 minutes" without payment
REVIEW_AFTER = 25.0  # "24 hours" after delivery
ORDER_WINDOW = 15.0  # orders arrive during the first 15 s
PAY_WITHIN = (1.0, 10.0)  # a paying customer pays this long after ordering
DELIVER_AFTER = (1.0, 4.0)  # after payment
WEBHOOK_BACKOFF = (2.0, 5.0, 10.0, 20.0)  # "2s, 5s, 10s, 20s", at speed 1 as is
WEBHOOK_ATTEMPTS = 5
STORY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """How the story runs: ``speed`` (1 = about a minute), ``orders``, ``seed``,
    and the share of paying customers, failing webhooks and own reviews."""

    speed: float = 1.0
    orders: int = 90
    seed: int = 7
    paid_share: float = 1 / 3
    webhook_failure_rate: float = 0.4
    down_partner_share: float = 0.15  # webhooks to a partner that never answers
    own_review_share: float = 0.25

    @staticmethod
    def story_seconds() -> float:
        """Wall-clock seconds the story takes at speed 1."""
        return STORY_SECONDS

    def seconds(self, story: float) -> float:
        """Demo seconds for ``story`` seconds at speed 1."""
        return story / self.speed


@dataclass(slots=True)
class DemoSummary:
    """What happened, for the summary table (and the tests)."""

    orders: int = 0
    paid: int = 0
    delivered: int = 0
    scheduled: Counter[str] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)  # by handler name
    fired: Counter[str] = field(default_factory=Counter)  # succeeded, by handler name
    retried: int = 0
    dead: int = 0
    wrongly_cancelled: int = 0  # paid orders whose cancel job still fired
    unfinished: int = 0
    lateness: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # p50, p99, max (s)
    elapsed: float = 0.0
    db: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lateness_ms(self) -> tuple[float, float, float]:
        p50, p99, worst = self.lateness
        return (p50 * 1000, p99 * 1000, worst * 1000)


@dataclass(order=True, slots=True)
class _Event:
    at: float
    kind: str = field(compare=False)  # order, pay, deliver, own_review
    order: int = field(compare=False)


class _Shop:
    """The shop's own state, shared by the producer and the handlers.

    ``lock`` guards every field; handlers only hold it briefly.
    """

    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.paid: set[int] = set()
        self.cancelled_orders: set[int] = set()
        self.reviewed: set[int] = set()
        self.log: deque[str] = deque(maxlen=8)
        self.summary = DemoSummary()

    def note(self, line: str) -> None:
        with self.lock:
            self.log.append(line)


def _timeline(config: DemoConfig) -> list[_Event]:
    rng = random.Random(config.seed)
    events: list[_Event] = []
    for n in range(1, config.orders + 1):
        t = ORDER_WINDOW * (n - 1) / max(1, config.orders - 1)
        events.append(_Event(t, "order", n))
        if rng.random() < config.paid_share:
            t_pay = t + rng.uniform(*PAY_WITHIN)
            events.append(_Event(t_pay, "pay", n))
            t_deliver = t_pay + rng.uniform(*DELIVER_AFTER)
            events.append(_Event(t_deliver, "deliver", n))
            if rng.random() < config.own_review_share:
                events.append(_Event(t_deliver + rng.uniform(2, REVIEW_AFTER - 2), "own_review", n))
    events.sort()
    return events


def _register_handlers(app: DelayQ, shop: _Shop) -> None:
    config = shop.config

    @app.handler("order.cancel")
    def cancel_unpaid_order(payload: dict[str, Any]) -> None:
        order = payload["order"]
        with shop.lock:
            if order in shop.paid:
                shop.summary.wrongly_cancelled += 1
            shop.cancelled_orders.add(order)
        shop.note(f"order #{order}: not paid in 30 minutes, cancelled")

    @app.handler("review.default")
    def post_default_review(payload: dict[str, Any]) -> None:
        shop.note(f"order #{payload['order']}: no review in 24 hours, posted 5 stars")

    @app.handler("webhook.send")
    def send_webhook(payload: dict[str, Any], ctx: JobContext) -> None:
        # Deterministic "randomness" per attempt, so a seed replays the same story.
        rng = random.Random(f"{config.seed}:{ctx.id}:{ctx.attempt}")
        if payload["partner"] == "legacy-erp":
            raise ConnectionError("legacy-erp.example: connection refused")
        if rng.random() < config.webhook_failure_rate:
            raise TimeoutError(f"{payload['partner']}.example: no answer within 3s")
        shop.note(f"order #{payload['order']}: webhook delivered (attempt {ctx.attempt})")


def _producer(
    app: DelayQ, shop: _Shop, events: list[_Event], start: float, stop: threading.Event
) -> None:
    config = shop.config
    rng = random.Random(config.seed + 1)
    backoff = [config.seconds(d) for d in WEBHOOK_BACKOFF]
    summary = shop.summary
    for event in events:
        wait = start + config.seconds(event.at) - SYSTEM_CLOCK.monotonic()
        if wait > 0 and stop.wait(wait):
            return
        n = event.order
        if event.kind == "order":
            app.schedule(
                "order.cancel",
                {"order": n},
                delay=config.seconds(CANCEL_AFTER),
                job_id=f"cancel-order-{n}",
            )
            with shop.lock:
                summary.orders += 1
                summary.scheduled["order.cancel"] += 1
        elif event.kind == "pay":
            outcome = app.cancel(f"cancel-order-{n}")
            down = rng.random() < config.down_partner_share
            app.schedule(
                "webhook.send",
                {"order": n, "event": "order.paid", "partner": "legacy-erp" if down else "crm"},
                delay=0,
                job_id=f"webhook-paid-{n}",
                backoff=backoff,
                max_attempts=WEBHOOK_ATTEMPTS,
            )
            with shop.lock:
                shop.paid.add(n)
                summary.paid += 1
                summary.scheduled["webhook.send"] += 1
                if outcome is CancelOutcome.CANCELLED:
                    summary.cancelled["order.cancel"] += 1
            shop.note(f"order #{n}: paid, its cancel job {outcome.value}")
        elif event.kind == "deliver":
            app.schedule(
                "review.default",
                {"order": n},
                delay=config.seconds(REVIEW_AFTER),
                job_id=f"review-{n}",
            )
            with shop.lock:
                summary.delivered += 1
                summary.scheduled["review.default"] += 1
        elif event.kind == "own_review":
            outcome = app.cancel(f"review-{n}")
            if outcome is CancelOutcome.CANCELLED:
                with shop.lock:
                    summary.cancelled["review.default"] += 1
                shop.note(f"order #{n}: customer reviewed, default review cancelled")


def _progress(shop: _Shop, app: DelayQ, elapsed: float, total: float) -> Group:
    s = shop.summary
    stats = app.stats()
    table = Table(title=f"delayq demo: {elapsed:5.1f}s of about {total:.0f}s", title_justify="left")
    for column in ("orders", "paid", "scheduled", "cancelled", "fired", "retried", "dead"):
        table.add_column(column, justify="right")
    table.add_column("waiting", justify="right")
    with shop.lock:
        table.add_row(
            str(s.orders),
            str(s.paid),
            str(sum(s.scheduled.values())),
            str(sum(s.cancelled.values())),
            str(sum(s.fired.values())),
            str(s.retried),
            str(s.dead),
            str(stats.scheduled + stats.running),
        )
        lines = list(shop.log)
    return Group(table, Text("\n".join(lines), style="dim"))


def _summary_table(s: DemoSummary) -> Table:
    p50, p99, worst = s.lateness_ms()
    table = Table(title=f"delayq demo summary ({s.elapsed:.1f}s)", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    names = ("order.cancel", "webhook.send", "review.default")
    rows: list[tuple[str, str]] = [
        ("orders placed / paid / delivered", f"{s.orders} / {s.paid} / {s.delivered}"),
        ("jobs scheduled", str(sum(s.scheduled.values()))),
        *((f"  {n}", str(s.scheduled[n])) for n in names),
        ("jobs cancelled before they ran", str(sum(s.cancelled.values()))),
        ("  order.cancel (order paid)", str(s.cancelled["order.cancel"])),
        ("  review.default (customer reviewed)", str(s.cancelled["review.default"])),
        ("jobs fired (handler succeeded)", str(sum(s.fired.values()))),
        *((f"  {n}", str(s.fired[n])) for n in names),
        ("webhook attempts failed and retried", str(s.retried)),
        ("dead-lettered (after 2s,5s,10s,20s)", str(s.dead)),
        ("lateness p50 / p99 / max", f"{p50:.1f} / {p99:.1f} / {worst:.1f} ms"),
        ("paid orders wrongly cancelled", str(s.wrongly_cancelled)),
        ("jobs left unfinished", str(s.unfinished)),
    ]
    for what, count in rows:
        table.add_row(what, count)
    return table


def run_demo(
    config: DemoConfig | None = None,
    *,
    db_path: str | Path | None = None,
    url: str | None = None,
    console: Console | None = None,
) -> DemoSummary:
    """Run the story and return its summary (also printed on ``console``).

    The store is ``url`` if given, else the SQLite file ``db_path`` (which must
    not exist yet), else a fresh file in a temporary directory.
    """
    config = config or DemoConfig()
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="delayq-demo-") as tmp:
        if url is None:
            path = Path(db_path) if db_path is not None else Path(tmp) / "demo.db"
            if path.exists():
                raise FileExistsError(f"{path} exists; give the demo a new file (--db)")
            url = f"sqlite:///{path}"
        with DelayQ(url) as app:
            return _run(app, config, console)


def _run(app: DelayQ, config: DemoConfig, console: Console) -> DemoSummary:
    shop = _Shop(config)
    summary = shop.summary
    summary.db = app.url
    _register_handlers(app, shop)
    events = _timeline(config)

    def on_result(result: JobResult) -> None:
        with shop.lock:
            if result.outcome == "succeeded":
                summary.fired[result.name] += 1
            elif result.outcome == "retried":
                summary.retried += 1
            elif result.outcome == "dead":
                summary.dead += 1
        if result.outcome == "dead":
            shop.note(f"{result.job_id}: failed {result.attempt} times, dead-lettered")

    console.print(
        f"[bold]delayq demo[/] on {app.url}: {config.orders} orders; "
        f'"30 minutes" = {config.seconds(CANCEL_AFTER):.1f}s, '
        f'"24 hours" = {config.seconds(REVIEW_AFTER):.1f}s, webhook retries at '
        + ", ".join(f"{config.seconds(d):g}s" for d in WEBHOOK_BACKOFF)
    )
    worker = Worker(app, concurrency=8, lease=10.0, grace=5.0, on_result=on_result)
    stop = threading.Event()
    start = SYSTEM_CLOCK.monotonic()
    producer = threading.Thread(
        target=_producer, args=(app, shop, events, start, stop), name="demo-shop", daemon=True
    )
    total = config.seconds(STORY_SECONDS)
    deadline = start + 2 * total + 10
    refresh = 0.25
    # Dead letters are part of the story (shown live); keep worker warnings quiet.
    worker_log = logging.getLogger("delayq.worker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    worker.start()
    producer.start()
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                now = SYSTEM_CLOCK.monotonic()
                live.update(_progress(shop, app, now - start, total))
                if not producer.is_alive():
                    stats = app.stats()
                    if stats.scheduled == 0 and stats.running == 0:
                        break
                if now > deadline:
                    break
                stop.wait(refresh)
    finally:
        stop.set()
        producer.join()
        worker.stop(grace=5.0)
        worker_log.setLevel(level)
    console.print()
    summary.elapsed = SYSTEM_CLOCK.monotonic() - start
    worker_stats = worker.stats()
    summary.lateness = (
        worker_stats.lateness_p50,
        worker_stats.lateness_p99,
        worker_stats.lateness_max,
    )
    stats = app.stats()
    summary.unfinished = stats.scheduled + stats.running
    _check(summary, app)
    console.print(_summary_table(summary))
    console.print(f"[dim]store: {summary.db}[/]")
    for problem in summary.problems:
        console.print(f"[red]problem:[/] {problem}")
    return summary


def _check(s: DemoSummary, app: DelayQ) -> None:
    """What must hold at the end of the story."""
    expect: list[tuple[str, Callable[[], bool]]] = [
        ("paid orders had their cancel job fire", lambda: s.wrongly_cancelled == 0),
        ("jobs were left unfinished", lambda: s.unfinished == 0),
        (
            "unpaid orders were not all cancelled",
            lambda: s.fired["order.cancel"] == s.orders - s.cancelled["order.cancel"],
        ),
        (
            "webhooks neither delivered nor dead-lettered",
            lambda: s.fired["webhook.send"] + s.dead == s.scheduled["webhook.send"],
        ),
        (
            "the dead-letter set disagrees with the worker",
            lambda: len(app.dead_letters(limit=10_000)) == s.dead,
        ),
        (
            "jobs did not all end in a final state",
            lambda: sum(1 for _ in app.list_jobs(state=JobState.RUNNING)) == 0,
        ),
    ]
    for message, holds in expect:
        if not holds():
            s.problems.append(message)


# -- the commands ------------------------------------------------------------
@click.command()
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Wall-clock seconds the story takes (default 60). Sets --speed.",
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="Time factor.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="SQLite file to use (default: a fresh file in a temporary directory).",
)
@click.option("--orders", type=int, default=None, help="How many orders (default 90).")
@click.option("--seed", type=int, default=7, show_default=True)
def demo(
    *, duration: float | None, speed: float, db: str | None, orders: int | None, seed: int
) -> None:
    """The order story on SQLite, time compressed to about a minute.

    Unpaid orders are cancelled after "30 minutes", paid ones get their cancel
    job cancelled, delivered orders get an automatic review "24 hours" later,
    and a flaky webhook is retried at "2s, 5s, 10s, 20s" before dead-lettering.
    """
    if duration is not None:
        if not duration > 0:
            raise _BadInput(f"--duration must be > 0 seconds, got {duration}")
        speed = DemoConfig.story_seconds() / duration
    if not (speed > 0 and math.isfinite(speed)):
        raise _BadInput(f"--speed must be a positive number, got {speed}")
    if db is not None and os.path.exists(db):
        raise _BadInput(f"--db {db} exists; the demo needs a new file (or none: a temp file)")
    config = DemoConfig(speed=speed, seed=seed)
    if orders is not None:
        if orders < 1:
            raise _BadInput(f"--orders must be >= 1, got {orders}")
        config = DemoConfig(speed=speed, seed=seed, orders=orders)
    with _errors():
        summary = run_demo(config, db_path=db, console=_console())
    if not summary.ok:
        _fail("the demo found a problem: " + "; ".join(summary.problems))


@click.command()
@click.argument("name")
def experiment(name: str) -> None:
    """Run a seed experiment: retry (backoff on a DelayQueue) or precision (wheels vs queue)."""
    entry = EXPERIMENTS.get(name)
    if entry is None:
        raise _BadInput(f"unknown experiment {name!r}; choose one of: {', '.join(EXPERIMENTS)}")
    entry(sys.stdout)

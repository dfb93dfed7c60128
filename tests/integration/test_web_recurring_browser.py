"""The dashboard's recurring schedules in a real browser (Debian's chromium, Playwright).

The store is in memory on a fake clock, so the history the page shows is made
here, exactly: occurrences that succeeded, one that failed, one skipped.
``DELAYQ_SCREENSHOTS=1`` writes ``docs/dashboard-recurring.png``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("playwright")
pytest.importorskip("uvicorn")

import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright

from delayq.app import DelayQ
from delayq.job import JobState
from delayq.recurring import TICK_HANDLER, occurrence_id
from delayq.testing import FakeClock
from delayq.web import create_app
from tests.integration import test_web_browser as web
from tests.recurring_support import LEASE, context

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
TOKEN = web.TOKEN

T0 = datetime(2026, 3, 2, 6, 0, tzinfo=UTC).timestamp()  # a Monday


@dataclass
class Site:
    url: str
    app: DelayQ
    clock: FakeClock

    def page(self, browser: Browser, *, login: bool = True) -> Page:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(20_000)
        if login:
            page.goto(f"{self.url}/?token={TOKEN}")
        return page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium as the dashboard's other browser tests launch it (installed when missing)."""
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=web._ensure_chromium(), args=web.ARGS)
        try:
            yield b
        finally:
            b.close()


def run_until(app: DelayQ, clock: FakeClock, until: float, outcomes: dict[str, str]) -> None:
    """Run what is due up to ``until`` as a worker would: ticks, and occurrences
    that succeed unless ``outcomes`` says ``dead: <error>`` or ``skipped``."""
    backend = app.backend
    while (head := backend.next_due()) is not None and head <= until:
        clock.advance(max(0.0, head - clock.time()))
        for claim in backend.claim(limit=100, lease=LEASE, now=clock.time()):
            job = claim.job
            outcome = outcomes.get(job.id, "")
            if job.name == TICK_HANDLER:
                handler = app.get_handler(TICK_HANDLER)
                assert handler is not None
                handler.call(job.payload, context(claim))
                backend.ack(claim)
            elif outcome.startswith("dead: "):
                backend.bury(claim, outcome.removeprefix("dead: "))
            elif outcome == "skipped":
                backend.ack(claim, state=JobState.SKIPPED, outcome="skipped: 4.2s late")
            else:
                backend.ack(claim)
    clock.advance(max(0.0, until - clock.time()))


@pytest.fixture
def site() -> Iterator[Site]:
    clock = FakeClock(T0)
    with DelayQ("memory://", clock=clock, rng=random.Random(5)) as app:
        app.recurring("report.daily", cron="0 3 * * 1-5", tz="Europe/Berlin", payload={"to": "ops"})
        app.recurring(
            "cache.warm",
            every=300,
            handler="cache.refresh",
            payload={"region": "eu-west"},
            misfire=60,
            overlap="skip",
        )
        app.recurring("invoices.sweep", cron="@hourly", handler="invoices")
        app.pause_recurring("invoices.sweep")
        warm = {
            occurrence_id("cache.warm", T0 + 1500): "dead: TimeoutError: cache node 10.0.3.7 "
            "did not answer in 5s",
            occurrence_id("cache.warm", T0 + 2100): "skipped",
        }
        run_until(app, clock, T0 + 3100, warm)
        config = uvicorn.Config(
            create_app(app, token=TOKEN),
            host="127.0.0.1",
            port=web._free_port(),
            log_level="warning",
            ws="none",
            lifespan="on",
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            threading.Event().wait(0.02)
        try:
            yield Site(f"http://127.0.0.1:{config.port}", app, clock)
        finally:
            server.should_exit = True
            thread.join(30)


def test_a_schedules_page_shows_its_next_runs_last_run_and_history(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    page = site.page(browser)
    page.goto(f"{site.url}/recurring")
    rows = page.locator("tr.schedule-row")
    assert [rows.nth(i).get_attribute("data-name") for i in range(rows.count())] == [
        "cache.warm",
        "invoices.sweep",
        "report.daily",
    ]
    assert "paused" in page.inner_text("tr[data-name='invoices.sweep']")
    assert "2026-03-03 03:00:00 CET" in page.inner_text("tr[data-name='report.daily']")
    page.click("a[href='/recurring/cache.warm']")
    assert page.inner_text("#schedule-state") == "active"
    assert page.inner_text("#schedule-timing") == "every 300s"
    assert page.locator("tr.next-run").count() == 10
    assert page.locator("tr.next-run").first.inner_text().startswith("2026-03-02 06:55:00 UTC")
    assert occurrence_id("cache.warm", T0 + 3000) in page.inner_text("#last-run")
    history = page.locator("tr.occurrence")
    assert history.count() == 10
    states = [history.nth(i).inner_text() for i in range(history.count())]
    assert "dead" in states[5] and "TimeoutError" in states[5]
    assert "skipped" in states[3]
    web.shot(page, tmp_path, "dashboard-recurring.png")


def test_run_now_pause_and_resume_from_the_schedules_page(browser: Browser, site: Site) -> None:
    page = site.page(browser)
    page.goto(f"{site.url}/recurring/report.daily")
    page.click("#run-now")
    assert page.inner_text("#outcome").startswith("Outcome: enqueued")
    job_id = occurrence_id("report.daily", site.clock.time())
    assert page.inner_text("#outcome-job") == job_id
    page.click("#outcome-job")
    assert page.inner_text("#job-state") == "scheduled"
    assert page.inner_text("#job-name") == "report.daily"
    page.goto(f"{site.url}/recurring/report.daily")
    page.click("#pause")
    assert page.inner_text("#outcome") == "Outcome: paused"
    assert page.inner_text("#schedule-state") == "paused"
    assert page.locator("tr.next-run").count() == 0
    page.click("#resume")
    assert page.inner_text("#outcome") == "Outcome: resumed"
    assert page.inner_text("#schedule-state") == "active"
    schedule = site.app.get_recurring("report.daily")
    assert schedule is not None and not schedule.paused
    anonymous = site.page(browser, login=False)
    anonymous.goto(f"{site.url}/recurring/report.daily")
    assert anonymous.locator("#run-now").count() == 0

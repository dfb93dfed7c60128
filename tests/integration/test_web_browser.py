"""The dashboard in a real browser: Debian's chromium driven by Playwright.

The session fixture installs chromium with apt when it is missing (as root);
otherwise the tests skip with the reason, or fail under
``DELAYQ_REQUIRE_SERVICES=1``. The server is uvicorn in a thread on a free port,
serving a SQLite store in the test's directory.

``DELAYQ_SCREENSHOTS=1`` also writes the screenshots the README shows to ``docs/``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright")
pytest.importorskip("uvicorn")

import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright

from delayq.app import DelayQ
from delayq.observe.metrics import LatenessSeries
from delayq.web import create_app, pages
from delayq.worker._decide import format_error
from tests._util import wait_until
from tests.conftest import service_missing

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "browser-test-token"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _ensure_chromium() -> str:
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0:
        service_missing("chromium", f"{CHROMIUM} is missing; install it: apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        # Wait for the dpkg lock: another apt (or a second test process) may hold it.
        command = ["apt-get", "-o", "DPkg::Lock::Timeout=600", *args]
        return subprocess.run(
            command, check=False, env=env, capture_output=True, text=True, timeout=900
        )

    done = apt("install", "-y", "-q", "chromium")
    if done.returncode != 0:  # a fresh machine may need the package lists first
        apt("update", "-q")
        done = apt("install", "-y", "-q", "chromium")
    if done.returncode != 0 or not os.path.exists(CHROMIUM):
        service_missing("chromium", f"apt-get install chromium failed: {done.stderr[-500:]}")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser binary, installed once per test session when missing."""
    return _ensure_chromium()


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    # Module scope, not session: Playwright's sync API keeps an event loop set in
    # this thread while it runs, which would break later tests calling asyncio.run.
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Site:
    url: str
    app: DelayQ

    def page(self, browser: Browser, *, login: bool = True) -> Page:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(20_000)
        if login:
            page.goto(f"{self.url}/?token={TOKEN}")
        return page


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    series = LatenessSeries(slot_seconds=60)
    now = time.time()
    for minute in range(30):  # a recorded half hour for the chart
        for i in range(40):
            series.add(
                0.002 + 0.0005 * (i % 7) + (0.3 if i == 39 and minute % 9 == 0 else 0),
                at=now - (30 - minute) * 60,
            )
    with DelayQ(f"sqlite:///{tmp_path / 'web.db'}") as app:
        config = uvicorn.Config(
            create_app(app, token=TOKEN, series=series),
            host="127.0.0.1",
            port=_free_port(),
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
            yield Site(f"http://127.0.0.1:{config.port}", app)
        finally:
            server.should_exit = True
            thread.join(30)


def bury(app: DelayQ, job_id: str, error: str) -> None:
    """Dead-letter ``job_id``, the only due job."""
    (claim,) = app.backend.claim(limit=1000, lease=30)
    assert claim.job.id == job_id
    app.backend.bury(claim, error)


def shot(page: Page, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    if os.environ.get("DELAYQ_SCREENSHOTS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(path, DOCS / name)


def test_the_overview_renders_counts_and_the_lateness_chart(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    app = site.app
    for i in range(6):
        app.schedule("order.cancel", {"order": i}, delay=1800 + i)
    app.schedule("webhook.send", {"url": "https://example.com/hook"}, job_id="hook-1")
    bury(app, "hook-1", "ConnectionError: 503 from https://example.com/hook")
    app.schedule("review.post", {"order": 7}, job_id="overdue-review")
    page = site.page(browser)
    page.goto(f"{site.url}/")
    assert page.inner_text("#count-scheduled") == "7"
    assert page.inner_text("#count-dead") == "1"
    assert "overdue-review" in page.inner_text("#oldest-overdue")
    assert page.locator("svg.chart polyline").count() == 2
    shot(page, tmp_path, "dashboard-overview.png")


def test_jobs_filter_by_name_and_page_forward(browser: Browser, site: Site) -> None:
    app = site.app
    app.schedule_many(
        [
            {"name": "mail" if i % 2 else "sms", "delay": 60 + i, "job_id": f"m{i:02}"}
            for i in range(23)
        ]
    )
    page = site.page(browser, login=False)
    page.goto(f"{site.url}/jobs")
    page.fill("#f-name", "mail")
    page.fill("#f-limit", "5")
    page.click("#f-apply")
    seen: list[str] = []
    pages = 0
    while True:
        rows = page.locator("tr.job-row")
        seen.extend(rows.nth(i).get_attribute("data-id") or "" for i in range(rows.count()))
        pages += 1
        if page.locator("#next-page").count() == 0:
            break
        page.click("#next-page")
    assert seen == [f"m{i:02}" for i in range(23) if i % 2]
    assert pages == 3  # 11 jobs, 5 a page


def test_jobs_search_by_payload_substring_and_json_path(browser: Browser, site: Site) -> None:
    app = site.app
    app.schedule("mail", {"to": "ann@example.com", "order": {"id": 42}}, delay=60, job_id="ann")
    app.schedule("mail", {"to": "bob@example.com", "order": {"id": "42"}}, delay=61, job_id="bob")
    app.schedule("mail", {"to": "cy@example.com", "order": {"id": 7}}, delay=62, job_id="cy")
    page = site.page(browser, login=False)
    page.goto(f"{site.url}/jobs")

    def shown() -> list[str]:
        rows = page.locator("tr.job-row")
        return [rows.nth(i).get_attribute("data-id") or "" for i in range(rows.count())]

    page.fill("#f-payload-contains", "example.com")
    page.click("#f-apply")
    assert shown() == ["ann", "bob", "cy"]
    page.fill("#f-payload-path", "order.id")
    page.fill("#f-payload-value", "42")
    page.click("#f-apply")
    assert shown() == ["ann"]  # the number 42, not the string "42"
    assert page.input_value("#f-payload-path") == "order.id"  # the form keeps the search
    page.fill("#f-payload-value", '"42"')
    page.click("#f-apply")
    assert shown() == ["bob"]


def test_cancel_a_job_and_see_its_new_state(browser: Browser, site: Site, tmp_path: Path) -> None:
    job_id = site.app.schedule("order.cancel", {"order": 42, "note": "unpaid"}, delay=1800)
    page = site.page(browser)
    page.goto(f"{site.url}/jobs/{job_id}")
    assert page.inner_text("#job-state") == "scheduled"
    page.click("#cancel")
    assert page.inner_text("#outcome") == "Outcome: cancelled"
    assert page.inner_text("#job-state") == "cancelled"
    job = site.app.get(job_id)
    assert job is not None and job.state.value == "cancelled"
    page.reload()  # Post/Redirect/Get: reloading does not cancel again
    assert page.inner_text("#outcome") == "Outcome: cancelled"


def test_requeue_a_dead_letter(browser: Browser, site: Site) -> None:
    site.app.schedule("webhook.send", {"n": 1}, job_id="dead-1")
    bury(site.app, "dead-1", "TimeoutError: gave up after 5 attempts")
    page = site.page(browser)
    page.goto(f"{site.url}/dead")
    page.locator("tr[data-id='dead-1'] button.requeue").click()
    assert page.inner_text("#outcome") == "dead-1: requeued"
    assert page.locator("tr.job-row").count() == 0
    job = site.app.get("dead-1")
    assert job is not None and job.state.value == "scheduled" and job.attempts == 0


def test_requests_without_the_token_or_the_csrf_value_are_refused(
    browser: Browser, site: Site
) -> None:
    job_id = site.app.schedule("order.cancel", delay=1800)
    anonymous = site.page(browser, login=False)
    anonymous.goto(f"{site.url}/jobs/{job_id}")
    assert anonymous.locator("#cancel").count() == 0  # no token: no action forms
    refused = anonymous.request.post(f"{site.url}/jobs/{job_id}/cancel", form={"csrf": "x"})
    assert refused.status == 401
    signed_in = site.page(browser)
    no_csrf = signed_in.request.post(f"{site.url}/jobs/{job_id}/cancel", form={"csrf": ""})
    assert no_csrf.status == 403
    api = signed_in.request.post(f"{site.url}/api/jobs/{job_id}/cancel")
    assert api.status == 403
    job = site.app.get(job_id)
    assert job is not None and job.state.value == "scheduled"


def test_a_script_in_a_payload_or_error_is_shown_as_text_and_never_runs(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    attack = "<script>window.__pwned = 1; alert('pwned')</script>"
    site.app.schedule("webhook.send", {"body": attack}, job_id="xss")
    bury(site.app, "xss", f'ValueError: {attack}\n<img src=x onerror="window.__pwned=2">')
    page = site.page(browser)
    dialogs: list[Any] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    for path in ("/jobs/xss", "/dead", "/jobs?state=dead"):
        page.goto(f"{site.url}{path}")
        assert page.evaluate("window.__pwned") is None
    page.goto(f"{site.url}/jobs/xss")
    assert attack in page.inner_text("#payload")
    assert attack in page.inner_text("#last-error")
    assert dialogs == []
    shot(page, tmp_path, "dashboard-job.png")


# -- live refresh, stuck work, bulk recovery, layouts ---------------------------------


def _wait_text(page: Page, selector: str, text: str) -> None:
    """Wait (up to the page's timeout) until ``selector``'s text is ``text``, no reload."""
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); "
        "return e && e.innerText.trim() === t; }",
        arg=[selector, text],
        timeout=30_000,
    )


def test_the_overview_refreshes_itself_under_the_csp_and_pauses(
    browser: Browser, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "REFRESH_SECONDS", 1)
    errors: list[str] = []
    page = site.page(browser)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    site.app.schedule("mail", delay=600)
    page.goto(f"{site.url}/")
    assert page.inner_text("#count-scheduled") == "1"
    site.app.schedule("mail", delay=600)
    _wait_text(page, "#count-scheduled", "2")  # the live script swapped the counts in
    page.click("#live-toggle")
    assert page.inner_text("#live-status") == "paused"
    assert page.inner_text("#live-toggle") == "Resume live refresh"
    site.app.schedule("mail", delay=600)
    page.wait_for_timeout(3_000)  # three refresh periods: paused means no fetch
    assert page.inner_text("#count-scheduled") == "2"
    page.reload()  # the choice survives a reload
    assert page.inner_text("#live-status") == "paused"
    page.click("#live-toggle")
    site.app.schedule("mail", delay=600)
    _wait_text(page, "#count-scheduled", "4")
    assert errors == []  # no CSP violation, no script error


def test_stuck_and_retrying_work_and_the_real_exception_are_on_the_overview_and_lists(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    app = site.app
    now = time.time()
    for i in range(4):
        app.schedule("order.cancel", {"order": i, "note": "x" * 400}, delay=1800 + i)
    try:
        raise ConnectionError("503 from https://hooks.example.com/0")
    except ConnectionError as exc:
        stored = format_error(exc)  # what the worker stores
    app.schedule("webhook.send", {"url": "https://hooks.example.com/0"}, job_id="hook-dead")
    bury(app, "hook-dead", stored)
    app.schedule("report.build", {"month": "2026-11"}, at=now - 120, job_id="report-stuck")
    (claim,) = app.backend.claim(limit=1, lease=1)  # then its worker dies
    assert claim.job.id == "report-stuck"
    assert wait_until(lambda: claim.lease_until < time.time() - 0.5, timeout=30)
    page = site.page(browser)
    page.goto(f"{site.url}/")
    assert page.inner_text("#expired-leases") == "1"
    assert "report-stuck" in page.inner_text("#stuck") and "lease expired" in page.inner_text(
        "#stuck"
    )
    shot(page, tmp_path, "dashboard-overview.png")
    page.goto(f"{site.url}/jobs?state=running")
    assert "lease expired" in page.inner_text("tr[data-id='report-stuck']")
    page.goto(f"{site.url}/dead")
    row = page.inner_text("tr[data-id='hook-dead']")
    assert "ConnectionError: 503 from https://hooks.example.com/0" in row
    assert "Traceback" not in row
    shot(page, tmp_path, "dashboard-dead.png")
    page.goto(f"{site.url}/jobs")
    shot(page, tmp_path, "dashboard-jobs.png")
    page.goto(f"{site.url}/handlers")
    assert "1" in page.inner_text("tr[data-name='webhook.send'] td:nth-child(6)")  # dead
    shot(page, tmp_path, "dashboard-handlers.png")


def test_bulk_requeue_counts_and_asks_before_it_acts(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    app = site.app
    for i in range(3):
        app.schedule("webhook.send", {"n": i}, job_id=f"hook-{i}")
        bury(app, f"hook-{i}", "TimeoutError: gave up")
    page = site.page(browser)
    page.goto(f"{site.url}/dead")
    # purge-all leads to a confirmation page, never one click
    assert page.get_attribute("#purge-all", "href") == "/bulk?action=purge"
    page.click("#requeue-all")
    assert "3 dead job(s) match" in page.inner_text("#matched")
    assert len(app.dead_letters()) == 3  # counting acts on nothing
    shot(page, tmp_path, "dashboard-bulk.png")
    page.click("#confirm")
    assert page.inner_text("#outcome") == "bulk requeue: 3 requeued"
    assert app.dead_letters() == []
    page.goto(f"{site.url}/bulk?action=purge")
    assert "0 dead job(s) match" in page.inner_text("#matched")
    assert page.locator("#confirm").count() == 0


def test_dark_mode_and_a_narrow_screen(browser: Browser, site: Site, tmp_path: Path) -> None:
    for i in range(5):
        site.app.schedule("order.cancel", {"order": i, "blob": "y" * 300}, delay=60 + i)
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, color_scheme="dark", device_scale_factor=1
    )
    page = context.new_page()
    page.goto(f"{site.url}/?token={TOKEN}")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 24, 29)"
    page.goto(f"{site.url}/jobs")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0  # the table fits or scrolls inside its own box
    shot(page, tmp_path, "dashboard-dark-narrow.png")
    context.close()


def test_the_workers_page_lists_live_and_gone_workers(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    from delayq.observe.workers import Heartbeat  # noqa: PLC0415
    from delayq.worker import Worker  # noqa: PLC0415

    backend: Any = site.app.backend
    worker = Worker(site.app, concurrency=4, name="billing-1")
    beat = Heartbeat(site.app, worker, every=0.2).start()
    gone = {"host": "old-host", "pid": 4242, "concurrency": 8, "in_flight": 3, "lease": 0.5}
    backend.beat_worker("old-host:4242:ab", json.dumps({**gone, "started": time.time() - 3600}))
    try:
        assert wait_until(lambda: time.time() - backend.list_workers()[-1].seen > 1, timeout=30)
        page = site.page(browser)
        page.goto(f"{site.url}/workers")
        alive = page.inner_text(f"tr[data-id='{beat.worker_id}']")
        assert "billing-1" in alive and "alive" in alive and "0 / 4" in alive
        assert "gone: not seen for" in page.inner_text("tr[data-id='old-host:4242:ab']")
        shot(page, tmp_path, "dashboard-workers.png")
    finally:
        beat.stop()


def test_the_limits_page_sets_and_removes_a_limit_through_its_form(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    site.app.limit("tenant:*", concurrency=2)
    page = site.page(browser)
    page.goto(f"{site.url}/limits")
    page.fill("#limit-pattern", "stripe:*")
    page.fill("#limit-rate", "100/s")
    page.fill("#limit-burst", "20")
    page.click("#set-limit-button")
    page.wait_for_selector("#outcome")
    assert "set" in page.inner_text("#outcome")
    assert "100/s" in page.inner_text("tr[data-pattern='stripe:*']")
    assert {lim.pattern for lim in site.app.limits()} == {"tenant:*", "stripe:*"}
    shot(page, tmp_path, "dashboard-limits.png")
    page.click("tr[data-pattern='tenant:*'] button.remove-limit")
    page.wait_for_selector("#outcome")
    assert "removed" in page.inner_text("#outcome")
    assert [lim.pattern for lim in site.app.limits()] == ["stripe:*"]


def test_times_show_in_the_browsers_zone_after_the_toggle_and_stay_so(
    browser: Browser, site: Site
) -> None:
    at = 1_798_761_600.0  # 2027-01-01T00:00:00Z
    job_id = site.app.schedule("t", at=at)
    context = browser.new_context(timezone_id="Asia/Tokyo")  # UTC+9, no summer time
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{site.url}/?token={TOKEN}")
    page.goto(f"{site.url}/jobs/{job_id}")
    due = "#timeline tr:nth-child(2) time"
    assert page.inner_text(due) == "2027-01-01T00:00:00.000+00:00"
    assert page.inner_text("#times-toggle") == "Times: UTC"
    page.click("#times-toggle")
    assert page.inner_text(due) == "2027-01-01 09:00:00 Asia/Tokyo"
    assert page.inner_text("#times-toggle") == "Times: Asia/Tokyo"
    page.goto(f"{site.url}/jobs/{job_id}")  # the choice is kept
    assert page.inner_text(due) == "2027-01-01 09:00:00 Asia/Tokyo"
    page.click("#times-toggle")
    assert page.inner_text(due) == "2027-01-01T00:00:00.000+00:00"
    context.close()

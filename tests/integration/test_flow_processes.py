"""Flow-control limits hold across processes: three processes claim from one
store; a key's concurrency limit bounds the leases of all of them together, and
a rate limit bounds their starts together."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.app import DelayQ
from tests.conftest import service_missing
from tests.postgres_support import POSTGRES_URL, app_name, pg_schema
from tests.redis_support import REDIS_URL, redis_prefix

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
    elif request.param == "redis":
        with redis_prefix() as prefix:
            yield f"{REDIS_URL}?prefix={prefix}"
    elif request.param == "postgres":
        with pg_schema() as schema:
            yield f"{POSTGRES_URL}?schema={schema}&application_name={app_name(schema)}"
    else:  # pragma: no cover - every store with flow control gets a branch here
        service_missing(request.param, "no such store")


def _run_claimers(url: str, out: Path, hold: float) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration.flow_claimer_proc", url, str(out), str(hold)],
            cwd=ROOT,
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.wait(timeout=240) == 0


def _intervals(out: Path) -> list[tuple[str, float, float, float]]:
    """(job id, start, end, claimed_at on the store's clock) per run."""
    rows = []
    for line in out.read_text().splitlines():
        job_id, start, end, claimed_at = line.split()
        rows.append((job_id, float(start), float(end), float(claimed_at)))
    return rows


@pytest.mark.slow
def test_a_concurrency_limit_holds_across_processes(store_url: str, tmp_path: Path) -> None:
    app = DelayQ(store_url)
    try:
        app.limit("tenant:*", concurrency=2)
        app.schedule_many([{"name": "x", "key": "tenant:a"} for _ in range(40)])
        app.schedule_many([{"name": "x", "key": "tenant:b"} for _ in range(10)])
    finally:
        app.close()
    out = tmp_path / "runs.log"
    _run_claimers(store_url, out, hold=0.02)
    runs = _intervals(out)
    assert len(runs) == 50 and len({r[0] for r in runs}) == 50
    # the live leases of each key at any moment (the log names jobs; their keys are read back)
    check = DelayQ(store_url)
    try:
        keys = {job_id: check.get(job_id).key for job_id, _s, _e, _c in runs}  # type: ignore[union-attr]
    finally:
        check.close()
    for key in ("tenant:a", "tenant:b"):
        edges = sorted(
            (t, step)
            for job_id, start, end, _c in runs
            if keys[job_id] == key
            for t, step in ((end, -1), (start, +1))
        )
        live = most = 0
        for _t, step in edges:
            live += step
            most = max(most, live)
        assert most <= 2, (key, most)


@pytest.mark.slow
def test_a_rate_limit_holds_across_processes(store_url: str, tmp_path: Path) -> None:
    app = DelayQ(store_url)
    try:
        app.limit("api", rate="20/s", burst=2)
        app.schedule_many([{"name": "x", "key": "api"} for _ in range(40)])
    finally:
        app.close()
    out = tmp_path / "runs.log"
    _run_claimers(store_url, out, hold=0.0)
    starts = sorted(claimed_at for _j, _s, _e, claimed_at in _intervals(out))
    assert len(starts) == 40
    for i, first in enumerate(starts):  # at most 20 + 2 starts in any second of the store's clock
        in_window = [t for t in starts[i:] if t < first + 1.0]
        assert len(in_window) <= 22, (first, len(in_window))

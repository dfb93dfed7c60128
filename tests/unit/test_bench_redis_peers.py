"""The Redis peers benchmark's bookkeeping: plan, percentiles, table, skips, cleanup.

The measurements themselves need the peers (installed only in the benchmark's own
virtualenv) and take minutes; these tests cover the parts that decide what the table says.
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import pytest
from bench import redis_peers
from bench.redis_peers import Peer, Plan, Row, format_table, read_results

from tests.conftest import service_missing


def _row(lateness: tuple[float, ...], n_jobs: int, cutoff_s: float = 30.0) -> Row:
    return Row("x 1.0", 1000.0, tuple(sorted(lateness)), n_jobs, cutoff_s, "defaults")


def test_plan_spreads_due_times_uniformly_over_the_span_after_the_lead() -> None:
    plan = Plan(n_jobs=4, span_s=2.0, lead_s=10.0, drain_s=5.0)

    jobs = plan.jobs(start=100.0)

    assert jobs == [(0, 110.0), (1, 110.5), (2, 111.0), (3, 111.5)]


def test_lead_grows_for_a_system_whose_probes_enqueued_slowly() -> None:
    plan = Plan(n_jobs=20_000, span_s=10.0, lead_s=12.0, drain_s=60.0)

    assert plan.probes == 200
    assert plan.lead_for(probe_enqueue_s=0.04) == 12.0  # 5,000 jobs/s: 4 s, default lead
    assert plan.lead_for(probe_enqueue_s=0.25) == 51.0  # 800 jobs/s: 25 s, twice plus 1


def test_full_and_quick_plans_match_the_documented_sizes() -> None:
    assert (redis_peers.FULL.n_jobs, redis_peers.FULL.span_s) == (20_000, 10.0)
    assert (redis_peers.QUICK.n_jobs, redis_peers.QUICK.span_s) == (2_000, 3.0)


def test_percentiles_are_nearest_rank_over_all_jobs() -> None:
    row = _row(tuple(i / 1000 for i in range(1, 101)), n_jobs=100)

    assert row.percentile(0.5) == pytest.approx(0.050)
    assert row.percentile(0.99) == pytest.approx(0.099)
    assert row.percentile(1.0) == pytest.approx(0.100)


def test_a_job_that_never_ran_counts_as_later_than_every_job_that_did() -> None:
    row = _row((0.001,) * 98, n_jobs=100)

    assert row.percentile(0.5) == pytest.approx(0.001)
    assert math.isinf(row.percentile(0.99))
    assert row.completed == 98


def test_table_shows_jobs_that_never_ran_as_beyond_the_drain_deadline() -> None:
    table = format_table([_row((0.0123,) * 98, n_jobs=100, cutoff_s=30.0)])

    assert "| x 1.0 | 1,000 | 12.3 / >30,000 / >30,000 | 98 / 100 | defaults |" in table


def test_table_shows_a_skipped_system_with_its_reason_and_no_numbers() -> None:
    table = format_table([Row("huey", None, (), 0, 0.0, "skipped: not installed")])

    assert table.splitlines()[-1] == "| huey | - | - | - | skipped: not installed |"


def test_read_results_keeps_every_run_so_that_duplicates_show(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.write_text("-1 0.5\n0 0.010\n1 0.020\n1 0.030\ngarbage\n")

    runs = read_results(out)

    assert runs == {-1: [0.5], 0: [0.010], 1: [0.020, 0.030]}


def test_a_peer_that_cannot_be_imported_is_reported_instead_of_failing() -> None:
    peer = Peer(
        name="ghost",
        distribution="ghost",
        modules=("json", "no_such_module_for_the_benchmark"),
        defaults="",
        key_patterns=("ghost:*",),
        worker_argv=lambda: [],
        enqueue=lambda url, jobs: None,
    )

    reason = redis_peers._missing(peer)

    assert reason is not None
    assert "no_such_module_for_the_benchmark" in reason


@pytest.mark.redis
def test_cleanup_deletes_only_the_benchmarked_systems_key_families() -> None:
    redis = pytest.importorskip("redis")
    base = "redis://127.0.0.1:6379"
    try:
        redis.Redis.from_url(base).ping()
    except redis.RedisError as exc:
        service_missing("redis", f"no Redis at {base}: {exc}")
    url = redis_peers.claim_database(base, None)
    client = redis.Redis.from_url(url)
    tag = uuid.uuid4().hex
    try:
        client.set(f"arq:job:{tag}", 1)
        client.set(f"other:{tag}", 1)

        deleted = redis_peers.delete_keys(url, ["arq:*"])

        assert deleted == 1
        assert client.exists(f"other:{tag}") == 1
        assert client.get(redis_peers.CLAIM_KEY) == str(os.getpid()).encode()
    finally:
        client.delete(f"arq:job:{tag}", f"other:{tag}", redis_peers.CLAIM_KEY)
        client.close()


def test_a_system_that_keeps_up_gets_no_fell_behind_note() -> None:
    plan = Plan(n_jobs=4, span_s=2.0, lead_s=1.0, drain_s=5.0)
    jobs = plan.jobs(start=0.0)

    note = redis_peers._fell_behind(plan, jobs, {i: [0.005] for i in range(4)})

    assert note is None


def test_a_system_that_falls_behind_is_told_how_fast_it_ran() -> None:
    plan = Plan(n_jobs=4, span_s=0.004, lead_s=1.0, drain_s=5.0)
    jobs = plan.jobs(start=0.0)  # due 1 ms apart from 1.0 s on: 1,000 jobs/s
    starts = [1.0, 3.0, 5.0, 7.0]  # one job every 2 s

    runs = {i: [starts[i] - jobs[i][1]] for i in range(4)}
    note = redis_peers._fell_behind(plan, jobs, runs)

    assert note == "fell behind: ran 0.5 jobs/s while 1,000/s came due"

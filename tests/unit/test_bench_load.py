"""The live-load benchmark's bookkeeping: pacing, percentiles over missing jobs, the table.

The measurement itself runs worker and producer processes for minutes (``make bench``);
these tests cover the parts that decide what the table says.
"""

from __future__ import annotations

import math
from pathlib import Path

from bench.load import PacedJobs, Result, Workload, format_table, read_runs


def _workload(rate: int = 1000, seconds: float = 0.01, producers: int = 2) -> Workload:
    return Workload(rate=rate, seconds=seconds, horizon=5.0, drain=1.0, producers=producers)


def test_producers_share_the_jobs_without_overlap_and_due_times_follow_the_send() -> None:
    workload = _workload(rate=100_000, seconds=0.001, producers=3)  # 100 jobs, no waiting
    seen: list[int] = []
    for k in range(3):
        jobs = PacedJobs(workload, k, start=0.0, seed=k)
        for index, due in jobs:
            seen.append(index)
            assert jobs.last is not None
            assert jobs.last <= due <= jobs.last + workload.horizon
        assert jobs.sent == len(range(k, workload.n_jobs, 3))

    assert sorted(seen) == list(range(workload.n_jobs))


def test_a_job_that_never_ran_counts_as_later_than_any_that_did() -> None:
    result = Result("x", _workload(), scheduled=4, lateness=[0.001, 0.002, 0.003])

    assert result.missing == 1
    assert result.percentile(0.5) == 0.002
    assert math.isinf(result.percentile(1.0))
    assert ">1,500" in format_table([_cut(result)])


def _cut(result: Result) -> Result:
    result.cutoff_s = 1.5
    return result


def test_early_runs_and_duplicates_are_counted(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.write_text("0 0.010 0.004\n1 -0.002 -0.003\n0 0.500 0.499\n-1 0.1 0.1\nbroken\n")

    runs, claims = read_runs(out)

    assert runs == {0: [0.010, 0.500], 1: [-0.002], -1: [0.1]}
    assert claims == {0: 0.004, 1: -0.003, -1: 0.1}
    result = Result("x", _workload(), scheduled=2, lateness=sorted([0.010, -0.002]))
    assert result.early == 1
    row = format_table([result]).splitlines()[-1]
    assert "| 0 | 1 |" in row  # missing 0, early 1


def test_a_failed_system_keeps_its_row_with_the_reason() -> None:
    table = format_table([Result("peer 1.0", _workload(), failed="skipped: not installed")])

    assert "| peer 1.0 | - | skipped: not installed |" in table

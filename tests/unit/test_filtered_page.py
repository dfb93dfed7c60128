"""_common.filtered_page: name filter and keyset cursor over a store's plain listing."""

from __future__ import annotations

from delayq.backends._common import filtered_page
from delayq.job import Job, JobState

T0 = 1_700_000_000.0


def job(i: int, run_at: float, name: str) -> Job:
    return Job(f"j{i:04}", name, None, run_at, JobState.SCHEDULED, 0, 5, {}, "run", T0, T0)


def test_pages_walk_a_long_run_of_ties_with_a_rare_name_without_gaps() -> None:
    # 700 jobs due at three instants; one in 50 has the rare name.
    rows = [job(i, T0 + i // 300, "rare" if i % 50 == 0 else "common") for i in range(700)]
    reads: list[int] = []

    def read(start: float | None, n: int) -> list[Job]:
        reads.append(n)
        return [r for r in rows if start is None or r.run_at >= start][:n]

    seen: list[str] = []
    after = None
    while True:
        page = filtered_page(read, due_after=None, limit=3, name="rare", after=after)
        seen.extend(j.id for j in page)
        if len(page) < 3:
            break
        after = (page[-1].run_at, page[-1].id)
    assert seen == [f"j{i:04}" for i in range(0, 700, 50)]
    assert max(reads) < 4 * 700  # windows grow geometrically, bounded by what exists


def test_a_gone_cursor_job_repeats_its_ties_rather_than_skipping_them() -> None:
    rows = [job(i, T0, "x") for i in range(5)]
    page = filtered_page(
        lambda start, n: rows[:n], due_after=None, limit=10, name=None, after=(T0, "gone")
    )
    assert [j.id for j in page] == [r.id for r in rows]

"""Contract: ``list_jobs`` filters by handler name and pages with a keyset cursor."""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.errors import InvalidOption
from delayq.job import Job, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec

pytestmark = pytest.mark.backend_features("inspect")


def cursor(job: Job) -> tuple[float, str]:
    return (job.run_at, job.id)


def test_list_jobs_filters_by_handler_name(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue(
        [
            spec("a", t0 + 1, name="mail"),
            spec("b", t0 + 2, name="sms"),
            spec("c", t0 + 3, name="mail"),
        ]
    )
    assert [j.id for j in backend.list_jobs(name="mail")] == ["a", "c"]
    assert [j.id for j in backend.list_jobs(name="sms", state=JobState.SCHEDULED)] == ["b"]
    assert backend.list_jobs(name="push") == []


def test_pages_follow_each_other_without_gaps_or_repeats_also_on_ties(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    # Seven jobs, three of them due at one instant (ties go in enqueue order).
    backend.enqueue([spec(f"j{i}", t0 + (1 if 2 <= i <= 4 else i)) for i in range(7)])
    expected = [j.id for j in backend.list_jobs()]
    seen: list[str] = []
    page = backend.list_jobs(limit=2)
    while page:
        seen.extend(j.id for j in page)
        page = backend.list_jobs(limit=2, after=cursor(page[-1]))
    assert seen == expected
    assert len(set(seen)) == 7


def test_a_cursor_combines_with_the_state_name_and_window_filters(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(
        [spec(f"j{i}", t0 + i, name="even" if i % 2 == 0 else "odd") for i in range(10)]
    )
    first = backend.list_jobs(name="even", state=JobState.SCHEDULED, due_before=t0 + 8, limit=2)
    assert [j.id for j in first] == ["j0", "j2"]
    rest = backend.list_jobs(
        name="even", state=JobState.SCHEDULED, due_before=t0 + 8, after=cursor(first[-1])
    )
    assert [j.id for j in rest] == ["j4", "j6"]


def test_a_cursor_whose_job_is_gone_repeats_rather_than_skips(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0 + 1), spec("b", t0 + 1), spec("c", t0 + 2)])
    assert [j.id for j in backend.list_jobs(after=(t0 + 1, "gone"))] == ["a", "b", "c"]


def test_a_malformed_cursor_is_refused(backend: Backend) -> None:
    with pytest.raises(InvalidOption, match="after must be"):
        backend.list_jobs(after=("x",))  # type: ignore[arg-type]

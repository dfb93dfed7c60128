"""The RabbitMQ store's log, folded (``_log.View``): the first record in the stream wins."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pika")

from delayq.backends.rabbitmq._log import View, enqueued, record
from delayq.backends.rabbitmq._message import JobMessage
from delayq.job import CancelOutcome, JobState, RescheduleOutcome

T0 = 1_700_000_000.0


def message(job_id: str = "j", ver: str = "v1", max_attempts: int = 3) -> JobMessage:
    return JobMessage(job_id, "h", "{}", T0, max_attempts, {}, "run", T0, ver=ver)


class Log:
    """A view fed records as a stream would deliver them."""

    def __init__(self, result_ttl: float = 3600.0) -> None:
        self.view = View(result_ttl)

    def put(self, kind: str, **fields: Any) -> Any:
        return self.view.apply(record(kind, "t", **fields))[1]

    def enqueue(self, *messages: JobMessage, at: float = T0) -> None:
        self.put("E", m=[enqueued(m) for m in messages], at=at)

    def start(
        self, sid: str, *, ver: str = "v1", attempt: int = 1, returns: int = 0, at: float = T0
    ) -> bool:
        [won] = self.put("S", s=[["j", ver, attempt, returns, at + 30, sid]], at=at)
        return bool(won)

    def finish(self, sid: str, state: str, note: str | None = None, at: float = T0) -> None:
        self.put("F", f=[["j", "v1", sid, state, at, note]], at=at)

    def cancel(self, at: float = T0) -> CancelOutcome:
        return CancelOutcome(self.put("C", id="j", at=at))

    def state(self, at: float = T0) -> JobState | None:
        entry = self.view.snapshot("j")
        job = None if entry is None else entry.job(at)
        return None if job is None else job.state


def test_a_cancel_before_the_start_wins_and_the_start_loses() -> None:
    log = Log()
    log.enqueue(message())
    assert log.cancel() is CancelOutcome.CANCELLED
    assert log.start("a") is False
    assert log.state() is JobState.CANCELLED


def test_a_start_before_the_cancel_wins_and_the_cancel_says_running() -> None:
    log = Log()
    log.enqueue(message())
    assert log.start("a") is True
    assert log.cancel() is CancelOutcome.RUNNING
    log.finish("a", "succeeded", "ok")
    assert log.cancel() is CancelOutcome.FINISHED
    assert log.state() is JobState.SUCCEEDED


def test_a_second_copy_of_a_running_attempt_loses_and_a_returned_one_wins() -> None:
    log = Log()
    log.enqueue(message())
    assert log.start("a") is True
    assert log.start("b") is False  # the same delivery twice (at least once)
    assert log.start("c", returns=1) is True  # its holder died: the broker returned it
    log.finish("a", "succeeded")  # the first holder's late finish no longer applies
    assert log.state() is JobState.RUNNING


def test_a_release_gives_the_attempt_back_and_the_same_attempt_starts_again() -> None:
    log = Log()
    log.enqueue(message())
    assert log.start("a") is True
    log.finish("a", "released")
    assert log.cancel() is CancelOutcome.CANCELLED  # no attempt had started


def test_a_lapsed_lease_lets_a_cancel_take_effect_or_is_dead_on_its_last_attempt() -> None:
    log = Log()
    log.enqueue(message(max_attempts=2))
    assert log.start("a") is True
    assert log.cancel(at=T0 + 31) is CancelOutcome.RUNNING  # within the clock skew
    assert log.cancel(at=T0 + 33) is CancelOutcome.CANCELLED_AFTER_ATTEMPT
    last = Log()
    last.enqueue(message(max_attempts=1))
    assert last.start("a") is True
    assert last.cancel(at=T0 + 33) is CancelOutcome.FINISHED
    assert last.state(T0 + 33) is JobState.DEAD


def test_a_rescheduled_job_drops_copies_of_its_old_version() -> None:
    log = Log()
    log.enqueue(message())
    entry = log.view.snapshot("j")
    assert entry is not None
    answer = log.put("R", id="j", ver="v2", run_at=T0 + 60, base=entry.seq, at=T0)
    assert answer is RescheduleOutcome.RESCHEDULED
    assert log.start("a", ver="v1") is False
    assert log.start("b", ver="v2") is True


def test_a_reschedule_that_read_an_older_entry_loses_and_changes_nothing() -> None:
    log = Log()
    log.enqueue(message())
    entry = log.view.snapshot("j")
    assert entry is not None
    assert log.start("a") is True  # between the read and the reschedule record
    assert log.put("R", id="j", ver="v2", run_at=T0 + 60, base=entry.seq, at=T0) is None
    assert log.start("b", ver="v2") is False


def test_finished_entries_are_forgotten_after_result_ttl() -> None:
    log = Log(result_ttl=60)
    log.enqueue(message())
    assert log.cancel() is CancelOutcome.CANCELLED
    assert log.cancel(at=T0 + 59) is CancelOutcome.FINISHED
    assert log.cancel(at=T0 + 61) is CancelOutcome.NOT_FOUND


def test_a_start_whose_enqueue_record_is_missing_wins() -> None:
    log = Log()
    assert log.start("a") is True  # never lose a job the log does not know
    log.enqueue(message())  # its enqueue record came after its start
    assert log.state() is JobState.RUNNING


# -- on_conflict, decided by the enqueue record that comes first ---------------------------


def enqueue_as(log: Log, on_conflict: str | None, *messages: JobMessage, at: float = T0) -> Any:
    fields: dict[str, Any] = {"m": [enqueued(m) for m in messages], "at": at}
    if on_conflict is not None:
        fields["c"] = on_conflict
    return log.put("E", **fields)


def starts(log: Log, job_id: str, ver: str) -> bool:
    [won] = log.put("S", s=[[job_id, ver, 1, 0, T0 + 30, f"s-{ver}"]], at=T0)
    return bool(won)


def test_a_second_enqueue_of_a_taken_id_is_refused_whole_and_its_copies_never_start() -> None:
    log = Log()
    assert enqueue_as(log, "reject", message()) == ["created"]
    answer = enqueue_as(log, "reject", message("new", "v2"), message("j", "v3"))
    assert answer[0] == "conflict" and "'j' already exists (scheduled)" in answer[1]
    assert log.view.snapshot("new") is None  # nothing of the refused record is stored
    assert starts(log, "new", "v2") is False and log.view.snapshot("new") is None
    assert starts(log, "j", "v3") is False
    assert starts(log, "j", "v1") is True  # the first job is untouched


def test_keep_leaves_the_first_job_and_its_copy_never_starts() -> None:
    log = Log()
    enqueue_as(log, "reject", message())
    assert enqueue_as(log, "keep", message("j", "v2"), message("k", "v3")) == ["kept", "created"]
    assert starts(log, "j", "v2") is False
    assert starts(log, "k", "v3") is True


def test_replace_takes_a_scheduled_job_over_and_refuses_a_running_one() -> None:
    log = Log()
    enqueue_as(log, "reject", message())
    assert enqueue_as(log, "replace", message("j", "v2")) == ["replaced"]
    assert starts(log, "j", "v1") is False  # the old version's copy
    assert starts(log, "j", "v2") is True
    answer = enqueue_as(log, "replace", message("j", "v3"))
    assert answer[0] == "conflict" and "'j' is running" in answer[1]


def test_a_repeated_id_in_one_record_meets_itself_and_a_record_sent_again_is_the_same_job() -> None:
    log = Log()
    assert enqueue_as(log, "reject", message("j", "v1"), message("j", "v2"))[0] == "conflict"
    assert enqueue_as(log, "keep", message("j", "v1"), message("j", "v2")) == ["created", "kept"]
    assert enqueue_as(log, "keep", message("j", "v1")) == ["created"]  # resent after a blip


def test_an_enqueue_record_without_on_conflict_replaces_as_older_writers_did() -> None:
    log = Log()
    enqueue_as(log, None, message())
    assert enqueue_as(log, None, message("j", "v2")) == ["replaced"]


def test_a_view_that_keeps_no_messages_keeps_where_each_one_is_and_still_decides() -> None:
    view = View(3600.0, keep_messages=False)
    record_body = record("E", "t", m=[enqueued(message(max_attempts=1))], at=T0, c="reject")
    assert view.apply(record_body, offset=7)[1] == ["created"]
    entry = view.snapshot("j")
    assert entry is not None and entry.unread and entry.where == (7, 0)
    assert entry.body is None and entry.max_attempts == 1
    [won] = view.apply(record("S", "t", s=[["j", "v1", 1, 0, T0 + 30, "a"]], at=T0))[1]
    assert won
    # Its lease ran out on its last attempt: dead, judged without the message.
    assert view.apply(record("C", "t", id="j", at=T0 + 60))[1] == CancelOutcome.FINISHED
    view.apply(record("E", "t", m=[enqueued(message("k"))], at=T0), offset=8)
    base = view.entries["k"].seq
    moved = record("R", "t", id="k", ver="v2", run_at=T0 + 5, base=base, at=T0)
    assert view.apply(moved)[1] == RescheduleOutcome.RESCHEDULED
    kept = view.snapshot("k")
    assert kept is not None and kept.where == (8, 0) and kept.run_at == T0 + 5

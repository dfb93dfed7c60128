"""Job results: kept with the finished record, waited for through a handle or by id."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from delayq import DelayQ
from delayq.codec import DEFAULT_MAX_RESULT_BYTES, encode_result
from delayq.errors import (
    InvalidOption,
    InvalidResult,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobSkipped,
    ResultTimeout,
    ResultTooLarge,
    Unsupported,
)
from delayq.job import JobState
from delayq.results import JobHandle, poll_pauses
from tests.unit._worker_harness import Harness


@dataclasses.dataclass
class Receipt:
    order: int
    total: float


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(concurrency=2)
    try:
        yield harness
    finally:
        harness.stop()
        harness.app.close()


def test_a_handler_storing_its_result_keeps_it_with_the_finished_record(h: Harness) -> None:
    @h.app.handler("sum", store_result=True)
    def total(payload: list[int]) -> dict[str, int]:
        return {"total": sum(payload)}

    @h.app.handler("plain")
    def plain(payload: Any) -> str:
        return "not kept"

    h.start()
    kept = h.app.schedule("sum", [1, 2, 3])
    dropped = h.app.schedule("plain")
    assert {h.next_result().outcome, h.next_result().outcome} == {"succeeded"}
    assert h.job(kept).result == '{"total":6}'
    assert h.app.result(kept, timeout=0) == {"total": 6}
    assert h.job(dropped).result is None
    assert h.app.result(dropped, timeout=0) is None


def test_a_task_returns_a_handle_that_is_its_id_and_waits_for_the_typed_result(
    h: Harness,
) -> None:
    @h.app.task(name="receipt", store_result=True)
    def receipt(order: int) -> Receipt:
        return Receipt(order, 9.5)

    h.start()
    handle = receipt.schedule(42)
    assert isinstance(handle, str) and isinstance(handle, JobHandle)
    assert handle == handle.id and type(handle.id) is str
    assert h.app.get(handle) is not None  # usable wherever the id was
    assert h.next_result().outcome == "succeeded"
    assert handle.result() == Receipt(42, 9.5)
    assert receipt.result(handle, timeout=0) == Receipt(42, 9.5)
    assert h.app.result(handle, timeout=0) == {"order": 42, "total": 9.5}  # the stored JSON
    assert pickle.loads(pickle.dumps(handle)) == handle.id


def test_an_async_handler_s_result_is_kept_and_awaited(h: Harness) -> None:
    @h.app.task(name="doubled", store_result=True)
    async def doubled(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    h.start()
    handle = doubled.schedule(21)
    assert h.next_result().outcome == "succeeded"

    async def main() -> tuple[int, int]:
        return await handle, await handle.aresult(timeout=0)

    assert asyncio.run(main()) == (42, 42)


def test_a_result_that_is_not_json_data_or_too_big_is_dead_lettered_at_once(
    h: Harness,
) -> None:
    @h.app.handler("set", store_result=True)
    def a_set(payload: Any) -> set[int]:
        return {1}

    @h.app.handler("big", store_result=True)
    def big(payload: Any) -> str:
        return "x" * DEFAULT_MAX_RESULT_BYTES

    h.start()
    bad = h.app.schedule("set", max_attempts=5)
    result = h.next_result()
    assert (result.outcome, result.attempt) == ("dead", 1)  # the body ran: no retry
    with pytest.raises(JobFailed, match=r"InvalidResult: result is a set") as failed:
        h.app.result(bad, timeout=0)
    assert failed.value.error is not None and "Traceback" in failed.value.error
    assert failed.value.job.state is JobState.DEAD
    large = h.app.schedule("big", max_attempts=5)
    assert h.next_result().outcome == "dead"
    with pytest.raises(JobFailed, match="ResultTooLarge: result is 65538 bytes as JSON"):
        h.app.result(large, timeout=0)


def test_a_failed_cancelled_or_skipped_job_raises_its_final_error(h: Harness) -> None:
    @h.app.handler("boom", store_result=True)
    def boom(payload: Any) -> None:
        raise ValueError("no such order")

    h.start()
    dead = h.app.schedule("boom", max_attempts=1)
    assert h.next_result().outcome == "dead"
    with pytest.raises(JobFailed, match=r"failed after 1 attempt\(s\): ValueError: no such order"):
        h.app.result(dead, timeout=0)
    later = h.app.schedule("boom", delay=60)
    h.app.cancel(later)
    with pytest.raises(JobCancelled, match="was cancelled"):
        h.app.result(later, timeout=0)
    skipped = h.app.schedule("boom", delay=1, misfire="skip")
    h.clock.advance(100)
    assert h.next_result().outcome == "skipped"
    with pytest.raises(JobSkipped, match="skipped: "):
        h.app.result(skipped, timeout=0)


def test_a_wait_runs_out_on_the_app_s_clock_and_an_unknown_id_is_not_found(
    h: Harness,
) -> None:
    h.app.register("later", lambda payload: 1, store_result=True)
    job_id = h.app.schedule("later", delay=3600)
    with pytest.raises(ResultTimeout, match="did not finish within 0s") as timed_out:
        h.app.result(job_id, timeout=0)
    assert isinstance(timed_out.value, TimeoutError)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            h.app.result(job_id, timeout=5)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    for _ in range(1000):  # each pause it takes is ended by the next advance
        if not waiter.is_alive():
            break
        if h.clock.wait_for_waiters(1, 0.05):
            h.clock.advance(0.5)
    waiter.join(10)
    assert h.clock.time() - 1_700_000_000.0 >= 5  # it waited its 5 s of the app's clock
    assert [type(e) for e in errors] == [ResultTimeout]
    with pytest.raises(JobNotFound, match="never existed, or its finished record"):
        h.app.result("nope", timeout=0)
    with pytest.raises(InvalidOption, match="timeout"):
        h.app.result(job_id, timeout=-1)


def test_the_pauses_grow_from_10_ms_to_1_s() -> None:
    pauses = poll_pauses()
    first = [next(pauses) for _ in range(14)]
    assert first[0] == 0.01 and first[1] == pytest.approx(0.015)
    assert first == sorted(first) and first[-1] == 1.0


def test_encode_result_names_what_is_not_json() -> None:
    assert encode_result({"a": [1, None]}) == '{"a":[1,null]}'
    with pytest.raises(InvalidResult, match=r"result\['a'\] is nan"):
        encode_result({"a": float("nan")})
    with pytest.raises(ResultTooLarge, match="limit is 8 bytes"):
        encode_result("0123456789", max_bytes=8)


class _NoResults:
    """A store without the ``results`` feature (as RabbitMQ is)."""

    features = frozenset({"shared"})
    url = "amqp://broker/"


def test_a_store_without_results_refuses_them_clearly() -> None:
    app = DelayQ("memory://")
    app._backend = _NoResults()  # type: ignore[assignment]
    with pytest.raises(Unsupported, match="amqp://broker/ keeps no finished records"):
        app.register("x", lambda p: None, store_result=True)
    with pytest.raises(Unsupported, match="cannot keep results"):
        app.result("j1")
    app.register("y", lambda p: None)  # without results: fine


def test_the_json_views_and_the_async_api_show_a_kept_result(h: Harness) -> None:
    from delayq._present import job_dict  # noqa: PLC0415
    from delayq.aio import AsyncDelayQ  # noqa: PLC0415

    h.app.register("sum", lambda payload: {"total": sum(payload)}, store_result=True)
    h.start()
    job_id = h.app.schedule("sum", [2, 3])
    assert h.next_result().outcome == "succeeded"
    assert job_dict(h.job(job_id))["result"] == {"total": 5}
    other = h.app.schedule("sum", delay=60)
    assert "result" not in job_dict(h.job(other))
    assert asyncio.run(AsyncDelayQ(app=h.app).result(job_id, timeout=0)) == {"total": 5}

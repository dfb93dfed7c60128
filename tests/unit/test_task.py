"""Typed tasks: scheduling checks the arguments; the worker side rebuilds them."""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TypedDict

import pytest

from delayq import DelayQ
from delayq.errors import InvalidPayload
from delayq.job import CancelOutcome
from delayq.task import Task
from delayq.testing import FakeClock

from ._worker_harness import Harness


@dataclasses.dataclass
class Address:
    city: str
    zip: str


@pytest.fixture
def app() -> DelayQ:
    return DelayQ("memory://", clock=FakeClock(1_000_000.0))


def test_plain_call_runs_the_function(app: DelayQ) -> None:
    @app.task()
    def add(a: int, b: int = 1) -> int:
        return a + b

    assert isinstance(add, Task)
    assert add(2, b=3) == 5
    assert add.name == f"{__name__}.test_plain_call_runs_the_function.<locals>.add"
    assert add.name in app.handlers


def test_schedule_stores_json_and_the_worker_rebuilds_it(app: DelayQ) -> None:
    seen: list[tuple[int, Address, str]] = []

    @app.task(name="order.ship", max_attempts=5)
    def ship(order_id: int, to: Address, *, reason: str = "paid") -> None:
        seen.append((order_id, to, reason))

    job_id = ship.options(delay=1800, job_id="ship-42").schedule(
        42, Address("Oslo", "0150"), reason="manual"
    )
    assert job_id == "ship-42"
    job = app.get(job_id)
    assert job is not None
    assert job.name == "order.ship"
    assert job.max_attempts == 5
    assert job.payload == {
        "args": [42, {"city": "Oslo", "zip": "0150"}],
        "kwargs": {"reason": "manual"},
    }
    handler = app.get_handler("order.ship")
    assert handler is not None
    handler.fn(job.payload)
    assert seen == [(42, Address("Oslo", "0150"), "manual")]


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [((), {}, "order_id"), ((1,), {"reasn": "x"}, "reasn"), ((1, 2), {}, "positional")],
)
def test_wrong_arguments_are_rejected_and_nothing_stored(
    app: DelayQ, args: tuple[object, ...], kwargs: dict[str, object], named: str
) -> None:
    @app.task(name="order.cancel")
    def cancel_order(order_id: int, *, reason: str = "unpaid") -> None: ...

    with pytest.raises(InvalidPayload, match=named):
        cancel_order.schedule(*args, **kwargs)  # type: ignore[arg-type]
    assert app.list_jobs() == []


def test_cancel(app: DelayQ) -> None:
    @app.task(name="order.cancel")
    def cancel_order(order_id: int) -> None: ...

    cancel_order.options(delay=60, job_id="c-1").schedule(1)
    assert cancel_order.cancel("c-1") is CancelOutcome.CANCELLED


@pytest.mark.slow
def test_mypy_strict_checks_the_call_site(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        from delayq import DelayQ

        app = DelayQ("memory://")

        @app.task()
        def cancel_order(order_id: int, *, reason: str = "unpaid") -> None: ...

        cancel_order.options(delay=1800, job_id="cancel-42").schedule(42)
        cancel_order.schedule(42, reason="fraud")
        {bad}
        """
    )
    good = tmp_path / "good.py"
    good.write_text(source.format(bad=""))
    bad = tmp_path / "bad.py"
    bad.write_text(source.format(bad='cancel_order.schedule("42")'))

    def mypy(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )

    ok = mypy(good)
    assert ok.returncode == 0, ok.stdout
    wrong = mypy(bad)
    assert wrong.returncode == 1
    assert "arg-type" in wrong.stdout


@pytest.mark.parametrize("is_async", [False, True])
def test_a_worker_runs_a_scheduled_task_with_its_arguments_rebuilt(is_async: bool) -> None:
    h = Harness()
    seen: list[tuple[int, Address, str]] = []
    if is_async:

        @h.app.task(name="order.ship")
        async def ship_async(order_id: int, to: Address, *, reason: str = "paid") -> None:
            seen.append((order_id, to, reason))

        job_id = ship_async.options(delay=1800).schedule(7, Address("Bergen", "5003"))
    else:

        @h.app.task(name="order.ship")
        def ship(order_id: int, to: Address, *, reason: str = "paid") -> None:
            seen.append((order_id, to, reason))

        job_id = ship.options(delay=1800).schedule(7, Address("Bergen", "5003"))
    try:
        h.start()
        h.asleep()
        assert seen == []
        h.clock.advance(1800)
        result = h.next_result()
        assert (result.job_id, result.outcome) == (job_id, "succeeded")
        assert seen == [(7, Address("Bergen", "5003"), "paid")]
    finally:
        h.stop()


class Money:
    """Shaped like a pydantic model (model_dump / model_validate), pydantic not needed."""

    def __init__(self, amount: int, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def model_dump(self, *, mode: str) -> dict[str, object]:
        assert mode == "json"
        return {"amount": self.amount, "currency": self.currency}

    @classmethod
    def model_validate(cls, data: dict[str, object]) -> Money:
        amount, currency = data["amount"], data["currency"]
        assert isinstance(amount, int) and isinstance(currency, str)
        return cls(amount, currency)


def test_a_model_argument_is_stored_by_model_dump_and_rebuilt_by_model_validate(
    app: DelayQ,
) -> None:
    seen: list[Money] = []

    @app.task(name="refund")
    def refund(money: Money) -> None:
        seen.append(money)

    job = app.get(refund.schedule(Money(5, "EUR")))
    assert job is not None
    assert job.payload == {"args": [{"amount": 5, "currency": "EUR"}], "kwargs": {}}
    handler = app.get_handler("refund")
    assert handler is not None
    handler.fn(job.payload)
    assert [(m.amount, m.currency) for m in seen] == [(5, "EUR")]


class Parcel(TypedDict):
    weight: float
    fragile: bool


try:  # pydantic comes with FastAPI (the dev extras); delayq itself does not need it
    import pydantic
except ImportError:  # pragma: no cover
    pydantic = None
else:

    class Refund(pydantic.BaseModel):
        order: int
        at: datetime.datetime


@pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")
def test_a_real_pydantic_model_and_a_typed_dict_go_through_json_and_back(app: DelayQ) -> None:
    seen: list[tuple[object, object]] = []

    @app.task(name="ship.refund")
    def refund(money: Refund, parcel: Parcel) -> None:
        seen.append((money, parcel))

    when = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)
    job = app.get(refund.schedule(Refund(order=7, at=when), {"weight": 1.5, "fragile": True}))
    assert job is not None
    assert job.payload == {
        "args": [{"order": 7, "at": "2026-12-03T12:00:00Z"}, {"weight": 1.5, "fragile": True}],
        "kwargs": {},
    }
    handler = app.get_handler("ship.refund")
    assert handler is not None
    handler.fn(job.payload)
    [(money, parcel)] = seen
    assert isinstance(money, Refund) and money == Refund(order=7, at=when)
    assert parcel == {"weight": 1.5, "fragile": True}  # a TypedDict is a dict

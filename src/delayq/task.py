"""Typed tasks: a function registered as a handler, scheduled with its own arguments.

::

    @app.task(max_attempts=5, backoff="2s,5s,10s,20s")
    def cancel_order(order_id: int, *, reason: str = "unpaid") -> None: ...

    cancel_order(42)                                          # runs the function now
    cancel_order.schedule(42)                                 # a job due now
    cancel_order.options(delay=1800, job_id="cancel-42").schedule(42, reason="fraud")
    cancel_order.cancel("cancel-42")

    @app.task(store_result=True)
    def total(order_id: int) -> Receipt: ...

    total.schedule(42).result(timeout=30)                     # a Receipt (see delayq.results)

``schedule`` is typed with the function's ``ParamSpec``, so a type checker
rejects a wrong or missing argument at the call site. Job options cannot sit
in the same call (``ParamSpec`` allows no keywords after ``*args``), hence
``options(...)``, which returns a :class:`TaskCall` carrying them.

The arguments are checked against the signature when the job is scheduled (an
:class:`~delayq.errors.InvalidPayload` naming the argument, nothing stored) and
stored as JSON ``{"args": [...], "kwargs": {...}}``. Dataclass instances and
pydantic models (anything with ``model_dump``) are stored as their JSON
fields and rebuilt in the worker from the parameter's annotation; a
``TypedDict`` is a plain dict and needs nothing. Never pickle.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from delayq._build import BackoffArg, MisfireArg, WhenArg
from delayq.errors import InvalidPayload
from delayq.job import CancelOutcome, OnConflict
from delayq.results import JobHandle

__all__ = ["Task", "TaskCall"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskApp(Protocol):
    """What a task needs of its app (``DelayQ``)."""

    @property
    def register(self) -> Callable[..., object]: ...

    @property
    def schedule(self) -> Callable[..., str]: ...

    @property
    def cancel(self) -> Callable[[str], CancelOutcome]: ...

    def result(self, job_id: str, *, timeout: float | None = ...) -> Any: ...

    async def aresult(self, job_id: str, *, timeout: float | None = ...) -> Any: ...


def _to_json(value: Any) -> Any:
    """Dataclasses and pydantic models as their JSON fields; containers walked."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def _from_json(value: Any, annotation: Any) -> Any:
    """Rebuild a dataclass or pydantic model named by ``annotation`` from its fields."""
    if not isinstance(value, dict) or not isinstance(annotation, type):
        return value
    if dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        return annotation(**{k: _from_json(v, hints.get(k)) for k, v in value.items()})
    validate = getattr(annotation, "model_validate", None)
    if callable(validate):
        return validate(value)
    return value


def _same(value: Any) -> Any:
    return value


class Task(Generic[P, R]):
    """A function registered under ``name``: call it, or schedule it as a job."""

    def __init__(self, app: TaskApp, fn: Callable[P, R], name: str, **job_options: Any) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self._job_options = job_options
        self._signature = inspect.signature(fn)
        self.store_result = bool(job_options.pop("store_result", False))
        functools.update_wrapper(self, fn)
        app.register(
            name,
            self._run_payload(),
            timeout=job_options.pop("timeout", None),
            store_result=self.store_result,
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now (no job)."""
        return self.fn(*args, **kwargs)

    def schedule(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Schedule a job due now running ``fn(*args, **kwargs)``; return its handle
        (a ``str``: the job id; ``.result()`` waits for its return value)."""
        return self.options().schedule(*args, **kwargs)

    def options(
        self,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
        job_id: str | None = None,
        on_conflict: OnConflict = "reject",
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        key: str | None = None,
        priority: int = 0,
        group: str | None = None,
        on_commit: bool = False,
    ) -> TaskCall[P, R]:
        """The job options of one scheduling call (those of :meth:`DelayQ.schedule`)."""
        given = {"max_attempts": max_attempts, "backoff": backoff, "misfire": misfire}
        merged = {**self._job_options, **{k: v for k, v in given.items() if v is not None}}
        merged.update(
            delay=delay,
            at=at,
            job_id=job_id,
            on_conflict=on_conflict,
            key=key,
            priority=priority,
            group=group,
        )
        if on_commit:
            merged["on_commit"] = True
        return TaskCall(self, merged)

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job of this task (see :meth:`DelayQ.cancel`)."""
        return self.app.cancel(job_id)

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The JSON payload a job of these arguments stores (checked against the signature)."""
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidPayload(f"task {self.name!r}: {exc}") from None
        return {"args": _to_json(list(args)), "kwargs": _to_json(kwargs)}

    def result(self, job_id: str, *, timeout: float | None = 30.0) -> R:
        """The return value of this task's job ``job_id`` (see :meth:`JobHandle.result`)."""
        return JobHandle(job_id, self.app, self._decode_result).result(timeout)

    def _decode_result(self, value: Any) -> R:
        """A stored return value rebuilt as the function's return annotation says."""
        hints = typing.get_type_hints(self.fn)
        return _from_json(value, hints.get("return"))  # type: ignore[no-any-return]

    def _run_payload(self) -> Callable[[Any], Any]:
        fn, signature, name = self.fn, self._signature, self.name
        out: Callable[[Any], Any] = _to_json if self.store_result else _same

        def rebuild(payload: Any) -> tuple[list[Any], dict[str, Any]]:
            if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
                raise InvalidPayload(f"task {name!r}: payload is not {{'args', 'kwargs'}}")
            hints = typing.get_type_hints(fn)
            args, kwargs = list(payload.get("args", [])), dict(payload.get("kwargs", {}))
            bound = signature.bind(*args, **kwargs)
            for param, value in bound.arguments.items():
                bound.arguments[param] = _from_json(value, hints.get(param))
            return list(bound.args), dict(bound.kwargs)

        if inspect.iscoroutinefunction(fn):

            async def run_async(payload: Any) -> Any:
                args, kwargs = rebuild(payload)
                return out(await fn(*args, **kwargs))

            return run_async

        def run(payload: Any) -> Any:
            args, kwargs = rebuild(payload)
            return out(fn(*args, **kwargs))

        return run

    def __repr__(self) -> str:
        return f"<Task {self.name!r}>"


class TaskCall(Generic[P, R]):
    """A task with the options of one scheduling call; ``schedule`` takes its arguments."""

    def __init__(self, task: Task[P, R], options: dict[str, Any]) -> None:
        self.task = task
        self._options = options

    def schedule(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Schedule ``task(*args, **kwargs)`` with these options; return the job's
        handle (a ``str``: the job id)."""
        task = self.task
        job_id = task.app.schedule(task.name, task.payload(*args, **kwargs), **self._options)
        return JobHandle(job_id, task.app, task._decode_result)

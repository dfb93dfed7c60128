"""Inspection and dead letters of the Redis store: reads by id, by state and by due time.

A mixin of :class:`~delayq.backends.redis.RedisBackend`: it uses the store's
client, keys and ``_run`` (one script call, driver errors mapped).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from delayq.backends._common import (
    PURGE_BATCH,
    check_limit,
    check_preview,
    check_run_at,
    check_when,
    filtered_page,
    listed_payload,
)
from delayq.backends._workers import check_worker_beat, check_worker_id
from delayq.backends.base import WORKER_FORGET_AFTER, WorkerBeat
from delayq.backends.redis._fields import job_of, optional_float, pairs, when_arg
from delayq.backends.redis._keyed import key_info
from delayq.backends.redis._keys import FINISHED_INDEX
from delayq.clock import SYSTEM_CLOCK
from delayq.job import Job, JobState, Stats

if TYPE_CHECKING:
    from delayq.backends.redis._waiting import Wakeups

__all__ = ["RedisInspection"]


class RedisInspection:
    """``get``, ``list_jobs``, ``stats``, ``next_due``, the dead-letter calls and the
    worker registry (the hash ``workers``: id -> ``{"data", "seen"}``)."""

    if TYPE_CHECKING:
        _redis: Any
        _keys: dict[str, str]
        _wakes: Wakeups

        def _run(
            self,
            name: str,
            args: Sequence[Any] = (),
            *,
            now: float | None = None,
            retry: bool = False,
            keys: Sequence[str] = (),
        ) -> Any: ...

        def _call(self, fn: Callable[[], Any], *, retry: bool = False) -> Any: ...

        def _check_open(self) -> None: ...

    def _members(self, fn: Callable[[], Any]) -> list[str]:
        """Run a read returning ZSET members (retried once), as a list of str."""
        self._check_open()
        return [str(m) for m in self._call(fn, retry=True)]

    def _fetch(self, ids: Sequence[str]) -> list[Job]:
        """The jobs with these ids that still exist, in the given order."""
        jobs: list[Job] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            replies = self._run("get", chunk, retry=True)
            jobs.extend(
                job_of(job_id, pairs(flat))
                for job_id, flat in zip(chunk, replies, strict=True)
                if flat
            )
        return jobs

    def get(self, job_id: str) -> Job | None:
        [flat] = self._run("get", [job_id], retry=True)
        if not flat:
            return None
        fields = pairs(flat)
        return key_info(job_of(job_id, fields), fields)

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties); the window is ``due_after <= run_at < due_before``.

        Scheduled jobs are read from the due index (cost grows with ``limit``);
        the other states are read whole and sorted here, which is fine for an
        inspection call but grows with the number of running/finished records.
        A ``name`` filter or an ``after`` cursor walks that same listing from the
        cursor's due time (``_common.filtered_page``).
        A ``preview`` cuts payloads after they are read (the hash is read whole);
        no payload search (``payload_search``): it would read every payload.
        """
        if check_preview(preview) is not None:
            listed = self.list_jobs(
                state=state,
                due_after=due_after,
                due_before=due_before,
                limit=limit,
                name=name,
                after=after,
            )
            return [replace(j, payload=listed_payload(_text(j.payload), preview)) for j in listed]
        if name is not None or after is not None:
            return filtered_page(
                lambda start, n: self.list_jobs(
                    state=state, due_after=start, due_before=due_before, limit=n
                ),
                due_after=due_after,
                limit=limit,
                name=name,
                after=after,
            )
        limit = check_limit(limit)
        state = None if state is None else JobState(state)
        low = "-inf" if due_after is None else repr(check_run_at(due_after, "due_after") * 1000)
        high = (
            "+inf"
            if due_before is None
            else "(" + repr(check_run_at(due_before, "due_before") * 1000)
        )
        jobs: list[Job] = []
        if state in (None, JobState.SCHEDULED):
            members = self._members(
                lambda: self._redis.zrangebyscore(self._keys["due"], low, high, 0, limit)
            )
            # flow control's ready and parked jobs (lua/_flow.lua) are scheduled too
            members += self._members(
                lambda: self._redis.zrangebyscore(self._keys["held"], low, high, 0, limit)
            )
            jobs += self._fetch([m[16:] for m in members])
        others = [JobState.RUNNING, *FINISHED_INDEX] if state is None else [state]
        for other in others:
            if other is JobState.SCHEDULED:
                continue
            index = self._keys["running" if other is JobState.RUNNING else FINISHED_INDEX[other]]
            ids = self._members(functools.partial(self._redis.zrange, index, 0, -1))
            jobs += [j for j in self._fetch(ids) if j.state is other]
        seq = {j.id: i for i, j in enumerate(jobs)}
        jobs = [
            j
            for j in jobs
            if (due_after is None or j.run_at >= due_after)
            and (due_before is None or j.run_at < due_before)
        ]
        jobs.sort(key=lambda j: (j.run_at, seq[j.id]))
        return jobs[:limit]

    def next_due(self) -> float | None:
        return self.stats().next_due

    def stats(self) -> Stats:
        r = self._run("stats", retry=True)
        # stats.lua replies: scheduled, due, running, succeeded, dead, cancelled, skipped, next
        counts = dict(
            zip(
                ("scheduled", "running", "succeeded", "dead", "cancelled", "skipped"),
                (r[0], *r[2:7]),
                strict=True,
            )
        )
        return Stats.from_counts(counts, due=int(r[1]), next_due=optional_float(r[7]))

    def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        limit = check_limit(limit)
        preview = check_preview(preview)
        self._check_open()
        ids = self._members(lambda: self._redis.zrevrange(self._keys["dead"], 0, limit - 1))
        dead = [j for j in self._fetch(ids) if j.state is JobState.DEAD]
        if preview is None:
            return dead
        return [replace(j, payload=listed_payload(_text(j.payload), preview)) for j in dead]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        reply = self._run("requeue_dead", [job_id, when_arg(*check_when(run_at, delay))])
        if not int(reply[0]):
            return False
        self._wakes.woke(reply[1])
        return True

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``.

        In calls of at most ``PURGE_BATCH`` jobs each, so other clients are never
        held up for long (it is not one transaction: a job buried meanwhile may
        or may not be deleted).
        """
        if job_ids is not None:
            job_ids = list(job_ids)
            if not job_ids:
                return 0
        bound = "" if older_than is None else repr(check_run_at(older_than, "older_than"))
        deleted = 0
        if job_ids is not None:
            for start in range(0, len(job_ids), PURGE_BATCH):
                chunk = job_ids[start : start + PURGE_BATCH]
                deleted += int(self._run("purge_dead", [bound, PURGE_BATCH, *chunk]))
            return deleted
        while True:
            n = int(self._run("purge_dead", [bound, PURGE_BATCH]))
            deleted += n
            if n < PURGE_BATCH:
                return deleted

    # -- the worker registry ---------------------------------------------------------
    def _worker_now(self) -> float:
        clock = getattr(self, "_clock", None)
        return (clock or SYSTEM_CLOCK).time()

    def beat_worker(self, worker_id: str, data: str) -> None:
        worker_id, data = check_worker_beat(worker_id, data)
        record = json.dumps({"data": data, "seen": self._worker_now()})
        self._call(lambda: self._redis.hset(self._keys["workers"], worker_id, record), retry=True)

    def list_workers(self) -> list[WorkerBeat]:
        raw: Any = self._call(lambda: self._redis.hgetall(self._keys["workers"]), retry=True)
        beats, stale = [], []
        cutoff = self._worker_now() - WORKER_FORGET_AFTER
        for key, value in raw.items():
            worker_id = key.decode() if isinstance(key, bytes) else str(key)
            record = json.loads(value)
            if record["seen"] < cutoff:
                stale.append(worker_id)
            else:
                beats.append(WorkerBeat(worker_id, record["data"], float(record["seen"])))
        if stale:
            self._call(lambda: self._redis.hdel(self._keys["workers"], *stale), retry=True)
        return sorted(beats, key=lambda b: -b.seen)

    def forget_worker(self, worker_id: str) -> None:
        worker_id = check_worker_id(worker_id)
        self._call(lambda: self._redis.hdel(self._keys["workers"], worker_id), retry=True)


def _text(payload: Any) -> str:
    """A payload read back as the compact JSON text the codec stored."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))

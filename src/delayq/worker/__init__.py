"""The worker: claims due jobs from a backend and runs their handlers.

:class:`Worker` is the one public class; it is made of named parts, one
module each:

* ``_inflight``: the in-flight table, every claim the worker holds (ready,
  running, or waiting for its result to be recorded) and the one lock and
  conditions its parts share;
* ``_dispatcher``: claims due jobs for free slots, plus a small prefetch while
  a backlog exists (a prefetched claim stuck behind busy slots is handed back);
  between claims it blocks in ``backend.wait_for_due`` (no polling) and retries
  failed commits;
* ``_leases``: the lease keeper, on its own thread, renewing every held claim
  every ``lease / 3`` in one ``extend_many`` call per pass;
* ``_runner``: handler threads, the lease check before a handler starts; its
  parts ``_timeouts`` (the watcher expiring handler timeouts) and ``_async``
  (the event loop of async handlers and its health);
* ``_process`` / ``_inchild`` / ``_child`` / ``_pipe`` / ``_childlog``: the
  process pool (``pool="process"``): the parent's side (children started, tasks
  handed over and queued behind a running one, a timed-out child killed), the
  runner's part that feeds a child, the spawned child's loop, the frames on
  their pipe, and its log records replayed in the parent;
* ``_commit``: the group committer, recording finished attempts in batches (one
  store call each), claiming the next jobs in the same call under a backlog;
* ``_decide``: the pure rules: succeeded, retried (the job's backoff),
  dead-lettered, skipped (misfire), returned;
* ``_stats``: counters and fixed-size histograms behind :meth:`Worker.stats`;
* ``_health``: what :meth:`Worker.health_snapshot` reads and the one rule that
  judges it (:meth:`WorkerHealth.problems`, served as ``/healthz``);
* ``_inline``: :func:`run_due`, the same rules run in the calling thread (tests,
  ``delayq.testing``).

What happens to a claimed job:

* no handler registered under its name: retried by its backoff for
  ``unknown_handler_grace`` (a rolling deploy), then dead-lettered with that reason;
* overdue beyond its misfire policy: finished as SKIPPED with an outcome note;
* its lease ran out before it could start (a paused process): handed back;
* the handler returns: SUCCEEDED;
* the handler raises or runs past its timeout: retried at ``now +
  backoff.delay(attempt)`` (the job's stored backoff) until ``max_attempts``,
  then dead-lettered with the error and traceback.

Stopping (``stop()``, SIGINT or SIGTERM under :meth:`Worker.run`): stop
claiming, hand back at once the claims whose handler has not started
(``release``: SCHEDULED again at their due time, attempt given back), let
in-flight handlers finish within ``grace`` seconds while still renewing their
leases, then return. Handlers still running after the grace period are
abandoned: their claims are released (the attempt given back, so a
``max_attempts=1`` job still gets its run) and results that finished but were
not recorded yet are recorded, in one last store call before the worker
returns; if that call fails, the leases run out and the jobs run again
elsewhere (at-least-once). A second signal stops at once (the same hand-back).
"""

from __future__ import annotations

from delayq.worker._decide import JobResult, Outcome
from delayq.worker._health import WorkerHealth
from delayq.worker._inline import run_due
from delayq.worker._stats import WorkerStats, percentile
from delayq.worker._worker import Worker

__all__ = [
    "JobResult",
    "Outcome",
    "Worker",
    "WorkerHealth",
    "WorkerStats",
    "percentile",
    "run_due",
]

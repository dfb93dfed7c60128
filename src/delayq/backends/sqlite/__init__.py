"""The SQLite backend: durable delayed jobs in one file, the embedded default.

One table, ``delayq_jobs``, holds every job; a job's ``state`` column moves it
through its life. Claiming reads the due-time index ``(state, run_at, seq)``,
so it costs O(log n): the same with 10 jobs pending or 10 million.

Concurrency
-----------
* **Threads.** A backend object owns ONE writer connection, guarded by a lock;
  its threads take turns. Reads run on a read-only connection per thread
  (:mod:`._readers`), so a slow inspection read never holds off a claim.
  Concurrent ``enqueue`` calls (a threaded web app calling ``schedule``) share
  one transaction and one fsync: a group commit, each call failing alone on
  its own conflict, each returning after the commit that stored it.
* **Processes.** Any number of processes may open the same file. Every write
  (claims included) runs in ``BEGIN IMMEDIATE``, which takes the database's
  write lock before reading, so two processes can never both see a job as due
  and claim it: a job is never held by two live leases. Writers take turns
  through kernel locks on ``<db>.lock`` (:mod:`._turns`), so a producer writing
  flat out cannot starve a worker's claims and acks; a wait for the turn is
  bounded by ``busy_timeout``. The database runs in WAL mode, so readers never
  block the writer. A process stopped while it writes (SIGSTOP, a frozen VM)
  holds SQLite's write lock and so stops every writer until it resumes; that
  is inherent to SQLite, which is why write transactions stay short.
* **Fork.** A process forked after the backend was opened gets a fresh
  connection, lock file descriptor and wake socket (none may cross ``fork``).

Durability: ``synchronous="full"`` (the default) or ``"normal"``
------------------------------------------------------------------
With ``"full"`` every producer-side commit (``enqueue``, ``cancel``,
``reschedule``, ``requeue_dead``, ``purge_dead``) is fsynced before it
returns, so a job whose ``enqueue`` returned survives a power cut or an OS
crash: the contract's "nothing lost" holds unconditionally, which is why it
is the default. A worker's claims, acks, retries and lease renewals do not
wait for the disk: a power loss may forget the last of them, and the job then
runs again after its lease (at-least-once); the next fsynced commit makes them
durable too (the WAL is one file, synced up to its end). With ``"normal"``
(in WAL mode) a commit is safe from a crash of the process (SIGKILL
included) and the file never corrupts, but the last transactions before a
power loss or kernel crash may roll back. It is several
times faster for single-job writes; batched writes (``schedule_many``) pay
one fsync per batch either way.

Waking
------
``wait_for_due`` sleeps until the earliest due time or lease expiry. In the
same process an earlier job wakes it at once (a condition variable); other
processes wake it within about a millisecond through unix datagram sockets
next to the database (see :mod:`delayq.backends.sqlite._wake`), never by polling the
table.

Layout: ``_schema`` (tables, named queries, opening a connection), ``_ops``
(what each transaction does to rows), ``_turns`` (writers taking turns),
``_store`` (transactions, group commit, waking, the contract methods),
``_finished`` (telling result waiters in other processes),
``_schedules`` (recurring schedule records, the ``recurring`` feature).
"""

from delayq.backends.sqlite._schema import (
    DEFAULT_BUSY_TIMEOUT,
    FALLBACK_POLL,
    SCHEMA_VERSION,
    Synchronous,
)
from delayq.backends.sqlite._store import SQLiteBackend

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "FALLBACK_POLL",
    "SCHEMA_VERSION",
    "SQLiteBackend",
    "Synchronous",
]

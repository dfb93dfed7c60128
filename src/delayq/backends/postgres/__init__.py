"""The PostgreSQL store: delayed jobs in the application's own database.

``postgresql://user@host:5432/db?queue=orders`` (or ``postgres://``) selects it;
it needs ``pip install 'delayq[postgres]'`` (psycopg 3 and psycopg_pool).

Design
------
* **Schema.** delayq owns one schema (``delayq`` unless ``schema=``), created
  and migrated by delayq with a recorded version under an advisory lock
  (:mod:`._schema`; ``delayq migrate`` runs it by hand). One ``jobs`` table holds
  every queue of the schema.
* **Claims.** One ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)``
  statement takes due jobs in ``(run_at, seq)`` order, sets their lease and a
  fencing token from a sequence: concurrent workers never wait on each other
  and never hold one job under two live leases. Expired leases are returned
  (or buried) by the statement before it, in the same call.
* **Flow control.** Per-key concurrency and rate limits, priorities and fair
  shares (:mod:`._flow`) are decided inside the claim's transaction, with each
  limited key's advisory lock held while its leases and rate state are read and
  written; a queue that never uses them keeps the one-statement claim.
* **One clock.** "Due" is decided by the server's ``statement_timestamp()``, so
  a worker or producer with a skewed clock never runs a job early. ``clock=``
  (tests) and ``claim(now=...)`` replace it.
* **No polling.** Workers sleep until the head of the due set or the next
  lease end; LISTEN/NOTIFY wakes them when an earlier job commits (:mod:`._wake`).
  An idle worker sends one query per wait and nothing while it sleeps.
* **Transactional enqueue.** ``enqueue(..., connection=conn)`` (and
  ``DelayQ.schedule(..., connection=conn)``) writes the job with the caller's
  connection, under a savepoint of its transaction: the job exists if and only
  if that transaction commits. SQLAlchemy ``Connection`` / ``Session`` objects on
  the psycopg driver, and Django's ``django.db.connection`` (psycopg 3), are
  accepted too.
* **asyncio.** ``async_producer()`` (:mod:`._aio`, used by ``AsyncDelayQ``)
  runs enqueue, cancel and get on psycopg's ``AsyncConnectionPool``.
* **Churn.** Finished records are deleted ``result_ttl`` after they finish
  (``result_ttl=0``: in the statement that finishes them) and, when
  ``dead_ttl`` is set, dead letters that long after burial, in batches from
  the claim path that double while they find a backlog; reads already treat
  expired records as gone. ``stats()`` reads counts kept by triggers, never
  the finished rows.
* **Connections.** A pool (``pool_size``) for calls, one more connection for
  LISTEN (``pgbouncer=true`` / ``listen=false``: none, waits poll). A failed
  connection (server restart, ``pg_terminate_backend``) raises
  :class:`~delayq.errors.BackendUnavailable` for that call; a pooled
  connection the server closed is replaced before use. Reads are retried once;
  so are claims (each call carries a request id) and completions: when only
  the first reply was lost, the retry returns that call's claims and answers
  its applied completions as applied (no attempt spent on a claim nobody
  received).
  Completions are fenced by token, so an ack lost with its connection never
  finishes a job that was handed to someone else; tokens stay unique across a
  server crash. Nothing raises after a commit.
"""

from __future__ import annotations

from delayq.backends.postgres._schema import DEFAULT_SCHEMA, SCHEMA_VERSION
from delayq.backends.postgres._store import DEFAULT_QUEUE, PostgresBackend

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "PostgresBackend",
]

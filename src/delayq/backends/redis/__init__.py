"""The Redis backend: delayed jobs on a ZSET, every state change one Lua script.

Many worker processes on many hosts share one Redis. ``redis://host:port/db``
(or ``rediss://``, ``unix://``), ``redis+cluster://`` (Redis Cluster) or
``redis+sentinel://`` (the master Sentinel names) selects it; it needs
``pip install 'delayq[redis]'``.

Key layout (``P`` = ``prefix``, ``Q`` = ``queue``; the hash tag ``{Q}`` puts
every key of a queue in one Redis Cluster slot, so multi-key scripts work
there)::

    P:{Q}:due          ZSET  member "<16-digit seq><job id>", score run_at in ms
    P:{Q}:running      ZSET  member job id, score lease deadline in ms
    P:{Q}:dead         ZSET  member job id, score buried time in ms
    P:{Q}:succeeded    ZSET  member job id, score record expiry in ms (also
    P:{Q}:cancelled          :cancelled and :skipped); the job hash itself has
    P:{Q}:skipped            a PEXPIRE of result_ttl
    P:{Q}:seq          STRING counter: FIFO order of jobs due at the same time
    P:{Q}:token        STRING the last fencing token (tokens are >= the server's
                             time in us, so they stay unique after lost writes)
    P:{Q}:wake         LIST  wake-up token for blocked workers (at most one)
    P:{Q}:job:<id>     HASH  the job (name, payload, run_at, state, attempts ...)
    P:{Q}:wake:<uuid>  LIST  a private wake-up list of one waiting thread
    P:{Q}:shadow:<id>  STRING expiring shadow key (only with ``expiry_events``)
    P:{Q}:claim:<id>   STRING what one claim call took ("<time> <lease end> <first
                             token> <last token>"), kept 2 socket timeouts + 5 s so a
                             retried call whose first reply was lost returns the
                             same claims instead of new ones
    P:{Q}:schedules    HASH  recurring schedule records (``_schedules.py``)
    P:{Q}:limits ...   flow control: limit records, the ready stage (by priority
                             and group), parked jobs, slots and rate state per
                             key (described in ``lua/_flow.lua``)
    P:{Q}:done         CHANNEL pub/sub: the id of each job acked with a result, for
                             result() waiters in other processes (a hint)
    P:{Q}:keyed:<key> HASH keyed calls: the key's record (its current job and
                             counters; ``lua/keyed.lua``), gone with its current job

Finished records are capped per state (``max_finished``) and dead letters
(``max_dead``), the oldest going first, so memory stays bounded by default.

Every state change (enqueue, keyed (one keyed call), claim, ack, retry, bury,
complete (a batch of those three), complete_and_claim, extend, cancel,
reschedule, requeue_dead, purge_dead, put_limit, delete_limit) is one Lua script in this folder, run
with EVALSHA (a script the server no longer knows, after ``SCRIPT FLUSH`` or a
restart, is sent whole). Each declares what it does when Redis is out of memory (``SCRIPT_FLAGS`` in
``_connection.py``).

One clock decides "due": the scripts read Redis ``TIME``, so a worker whose
host clock is skewed never runs a job early. ``claim(now=...)`` and the
``clock=`` option inject a time for tests only.

Waiting without polling: :meth:`RedisBackend.wait_for_due` asks a script how
long until the head of the due set (or the earliest lease expiry) on the
server's clock, then blocks in ``BLPOP`` on the queue's wake list. The enqueue,
retry, reschedule and requeue scripts push a token there only when the head of
the due set changed; a claim that leaves due jobs behind passes one on to the
next worker; a claim whose lease ends before both the head of the due set and
every other lease pushes one too (so a worker asleep toward a far-off job
recovers that lease on time if the claimer dies). Redis fires ``BLPOP``
timeouts on its ~100 ms cron tick, so the precise deadline is kept by the
client: it waits on the socket itself and, when its deadline passes first,
ends the ``BLPOP`` with ``CLIENT UNBLOCK`` (under an ACL that refuses it, a
``BLPOP`` one server tick short and a local wait). A waiter that the shared
token tells of an earlier due time pushes the token again, so every sleeping
worker learns of it and none depends on the first staying alive; a waiter that
is being stopped puts a token it took back. A long wait toward a due time
returns 50 ms early, so the slow first round trips after a quiet spell (a
halted idle CPU, cold caches) are over before the job is due.
An idle worker with nothing due for an hour sends a handful of commands an hour.

``expiry_events=True`` adds the classic key-expiry trigger: each scheduled job
gets a shadow key that expires at its due time, and a subscriber thread wakes
local waiters on ``__keyevent@<db>__:expired``. It is only a hint: Redis
publishes expiry events when it actually deletes the key (lazily, on access,
or by its sampling sweep, so possibly late) over fire-and-forget pub/sub (lost
while the subscriber is disconnected), so the due ZSET stays the source of
truth and a lost event costs latency, never a job.

Modules: ``_keys`` (the layout above), ``_connection`` (URL parsing, clients,
scripts, driver errors mapped in one place), ``_fields`` (script arguments and
replies), ``_waiting`` (blocked waits and wake-ups), ``_expiry`` (the optional
key-expiry trigger), ``_server`` (eviction and
persistence checks), ``_store`` (the contract methods), ``_inspect`` (reads and
dead letters), ``_schedules`` (recurring schedule records), ``_flow`` (flow-control
limit records), ``_keyed`` (keyed calls: debounce, throttle, unique, append).
"""

from delayq.backends.redis._connection import SCRIPT_NAMES, mask, split_url
from delayq.backends.redis._keys import DEFAULT_PREFIX, DEFAULT_QUEUE, queue_keys
from delayq.backends.redis._store import RedisBackend

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_QUEUE",
    "SCRIPT_NAMES",
    "RedisBackend",
    "mask",
    "queue_keys",
    "split_url",
]

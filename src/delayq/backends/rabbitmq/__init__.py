"""The RabbitMQ store: delays carried by TTL + dead-letter level queues, punctual to the ms.

``amqp://user:pass@host:port/vhost?queue=orders`` selects it; it needs
``pip install 'delayq[rabbitmq]'`` (pika) and RabbitMQ 3.10 or later. Options
(URL query or keyword, see docs/stores.md): ``queue`` (default ``default``),
``prefetch`` (deliveries a worker holds unacked, 32), ``max_returns`` (10),
``confirm_timeout`` (30 s), ``declare`` (``auto`` or ``passive``),
``queue_type`` (``quorum``; ``classic`` needs ``allow_at_most_once=true``),
``policies`` (``warn``, ``refuse`` or ``off``: vhost policies that change delayq's
queues, see ``_policies.py``), ``log`` (``true``; ``false`` drops the queue's log and
with it everything by id).

How a job travels (the parts live in this folder; ``_store.py`` holds the
contract methods):

* ``_topology.py``: the level queues (one per power of two from 32 ms, shared by
  every queue of the virtual host) that hold a message for the broker part of
  its delay without head-of-line blocking, then the queue's ready queue; the
  orphans queue catches what a deleted queue leaves in the levels.
* ``_publisher.py``: ``schedule`` publishes with confirms and ``mandatory`` (a
  batch pipelined, under a deadline), so it returns only once the broker has the
  message, and an unroutable one is an error, never a silent loss.
* ``_consumer.py``: a worker's I/O thread holds deliveries unacked until their
  local deadline (the part of the delay under 32 ms, measured on its monotonic
  clock from the delivery); ``claim`` hands out those due, acks go back through
  that thread.
* ``_claims.py``: what a due delivery becomes, and how attempts and returns are
  counted (in the message, never from the broker's delivery count).
* ``_dead.py``: the dead-letter stream (read by offset, never consumed).
* ``_log.py``, ``_arbiter.py``, ``_inspect.py``: the queue's log, a second stream
  that decides every race on a job id (a cancel or reschedule against a worker's
  start, two copies of one delivery), read back by a thread of each handle that
  needs an answer; ``cancel``, ``reschedule`` and ``get`` answer from it.
* ``admin.py``: ``delayq rabbitmq verify | setup | teardown`` (public: the CLI uses it).

What this store promises is in ``RabbitMQBackend.features``: ``shared`` (many
workers on one queue), ``durable`` (quorum queues, persistent messages,
publisher confirms, at-least-once dead-lettering between levels) and
``definite_cancel`` (the log). It keeps no index of jobs, so it does not offer
``list_jobs``, ``stats`` or ``next_due`` (they raise
:class:`~delayq.errors.Unsupported`); ``on_conflict`` is decided by the log's
enqueue record (with ``log=false`` nothing can: ``reject`` does not check,
``keep`` and ``replace`` raise ``Unsupported``), and claims are handed out in due
order on each worker only. ``claim(now=...)`` cannot move the broker's time: it is
checked and otherwise ignored.
"""

from delayq.backends.rabbitmq._store import RabbitMQBackend

__all__ = ["RabbitMQBackend"]

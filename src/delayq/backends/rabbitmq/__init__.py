"""The RabbitMQ store: delays carried by TTL + dead-letter level queues, punctual to the ms.

``amqp://user:pass@host:port/vhost?queue=orders`` selects it; it needs
``pip install 'delayq[rabbitmq]'`` (pika). Options (URL query or keyword):
``queue`` (default ``default``), ``queue_type`` (``quorum``, the default, or
``classic``), ``prefetch`` (deliveries a worker holds unacked, 5000 by default).

How a job travels (the parts live in this folder; ``_store.py`` holds the
contract methods):

* ``_topology.py``: the level queues (one per power of two from 1.024 s, shared by
  every queue of the virtual host) that hold a message for the broker part of
  its delay without head-of-line blocking, then the queue's ready queue.
* ``_publisher.py``: ``schedule`` publishes with confirms and ``mandatory``, so
  it returns only once the broker has the message, and an unroutable one is an
  error, never a silent loss.
* ``_consumer.py``: a worker's I/O thread holds deliveries unacked until their
  local deadline (the part of the delay under 1.024 s, measured on its monotonic
  clock from the delivery), so a job is never early even when hosts' clocks
  disagree; ``claim`` hands out those due, acks go back through that thread.
* ``_dead.py``: the dead-letter queue (jobs buried with their error).

What this store promises is in ``RabbitMQBackend.features``: ``shared`` (many
workers on one queue) and ``durable`` (quorum queues, persistent messages,
publisher confirms, at-least-once dead-lettering between levels). There is no
record of a job outside its message, so it does not offer ``get``,
``list_jobs``, ``stats``, ``next_due``, ``cancel`` or ``reschedule`` (they
raise :class:`~delayq.errors.Unsupported`), it cannot tell that a job id is
already taken (``on_conflict="reject"`` does not check; ``keep`` and
``replace`` raise ``Unsupported``), and claims are handed out in due order on
each worker only. ``claim(now=...)`` cannot move the broker's time: it is
checked and otherwise ignored.

Attempts: a message carries the attempts that started before it was
published; a quorum queue's ``x-delivery-count`` adds the deliveries that ended
without an ack (a worker killed or disconnected, a lease that ran out), so a
job that keeps killing its worker is buried after ``max_attempts``. Such a
return also counts against deliveries the worker held but had not started (a
classic queue counts any number of returns as one).
"""

from delayq.backends.rabbitmq._store import RabbitMQBackend

__all__ = ["RabbitMQBackend"]

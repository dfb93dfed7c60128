"""Operating the RabbitMQ store: verify a broker, declare the topology, remove a queue.

``delayq rabbitmq verify|setup|teardown`` calls these. ``verify`` reads the
broker's version and feature flags, the topology it finds (passive declares:
nothing is created),
the orphans queue's depth, and the policies that apply to delayq's queues,
through ``rabbitmqctl`` when it is on PATH (a policy can shorten a level's TTL,
which makes jobs early, or drop jobs from a ready queue); ``setup`` declares the
topology, so workers can run with ``declare=passive`` and no ``configure``
permission; ``teardown`` removes one delayq queue: its jobs still in the shared
levels then go to the orphans queue instead of stalling the levels.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika.exceptions

from delayq.backends.rabbitmq._connection import Settings, connect, map_errors
from delayq.backends.rabbitmq._policies import (
    NEEDED_FEATURE_FLAGS,
    RISKY_POLICY_KEYS,
    problems,
    read_feature_flags,
    read_policies,
    risky_policies,
)
from delayq.backends.rabbitmq._topology import ORPHANS, Topology
from delayq.errors import ConfigurationError

__all__ = ["RISKY_POLICY_KEYS", "Report", "Settings", "setup", "teardown", "verify"]

MIN_VERSION = (3, 10)
"""At-least-once dead-lettering between quorum queues needs RabbitMQ 3.10."""


@dataclass
class Report:
    """What ``verify`` found; ``problems`` empty means the broker is fit for the store."""

    version: str = "?"
    queues: dict[str, int | None] = field(default_factory=dict)  # name -> depth (None: missing)
    policies: list[str] = field(default_factory=list)  # policies touching delayq's queues
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        missing = [n for n, d in self.queues.items() if d is None]
        out = [f"RabbitMQ {self.version}"]
        out.append(
            f"topology: {len(self.queues) - len(missing)} of {len(self.queues)} queues present"
            + (f" (missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})"
               if missing else "")
        )  # fmt: skip
        orphans = self.queues.get(ORPHANS)
        if orphans is not None:
            out.append(f"orphans: {orphans} message(s) of deleted queues in {ORPHANS}")
        out += [f"policy: {p}" for p in self.policies]
        out += [f"note: {n}" for n in self.notes]
        out += [f"PROBLEM: {p}" for p in self.problems]
        return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _open(settings: Settings, action: str) -> Any:
    with map_errors(settings, action):
        return connect(settings, name="admin")


def _depth(connection: Any, name: str) -> int | None:
    """The queue's message count, or None when it does not exist (a passive declare)."""
    channel = connection.channel()
    try:
        return int(channel.queue_declare(name, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise
    finally:
        if channel.is_open:
            channel.close()


def verify(
    settings: Settings,
    *,
    policies: Callable[[str], list[dict[str, Any]] | None] = read_policies,
    feature_flags: Callable[[], dict[str, str] | None] = read_feature_flags,
) -> Report:
    """Check the broker and the topology of ``settings.queue`` (creates nothing)."""
    topology = Topology(settings.queue, settings.queue_type)
    report = Report()
    connection = _open(settings, "verify the broker")
    try:
        server = connection._impl.server_properties
        version = server.get("version", b"?")
        report.version = version.decode() if isinstance(version, bytes) else str(version)
        if _version(report.version) < MIN_VERSION:
            report.problems.append(
                f"RabbitMQ {report.version} is older than 3.10: no at-least-once "
                f"dead-lettering between quorum queues"
            )
        if _version(report.version) >= (4, 0):
            report.notes.append(
                "RabbitMQ 4.x: quorum queues have a default delivery-limit of 20; the store "
                "counts returns itself and reads dead letters from a stream, so it is not hit"
            )
        with map_errors(settings, "verify the topology"):
            for name in topology.names():
                report.queues[name] = _depth(connection, name)
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            connection.close()
    missing = [n for n, d in report.queues.items() if d is None]
    if missing:
        report.problems.append(
            f"{len(missing)} queue(s) of the topology are missing: run `delayq rabbitmq setup`"
        )
    flags = feature_flags()
    if flags is None:
        report.notes.append(
            "feature flags not checked (rabbitmqctl is not on PATH): make sure "
            f"{' and '.join(NEEDED_FEATURE_FLAGS)} are enabled"
        )
    for flag in NEEDED_FEATURE_FLAGS:
        if flags is not None and flags.get(flag) != "enabled":
            report.problems.append(
                f"feature flag {flag} is {flags.get(flag, 'unknown')}: enable it "
                f"(rabbitmqctl enable_feature_flag {flag}); without it dead-lettering "
                f"between levels is at most once, or the store's streams cannot exist"
            )
    rows = policies(settings.vhost)
    if rows is None:
        report.notes.append(
            "policies not checked (rabbitmqctl is not on PATH): make sure no policy sets "
            f"{', '.join(sorted(RISKY_POLICY_KEYS))} on delayq.v2.* queues"
        )
    for policy, keys, matched in risky_policies(rows or [], topology.names()):
        shown = ", ".join(matched[:3]) + (" ..." if len(matched) > 3 else "")
        report.policies.append(f"{policy} sets {', '.join(keys)} on {shown}")
    report.problems += problems(rows or [], topology.names())
    return report


def setup(settings: Settings) -> list[str]:
    """Declare the whole topology of ``settings.queue``; the names of its queues."""
    topology = Topology(settings.queue, settings.queue_type)
    connection = _open(settings, "declare the topology")
    try:
        with map_errors(settings, "declare the topology"):
            channel = connection.channel()
            topology.declare(channel)
            channel.close()
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            connection.close()
    return topology.names()


def teardown(settings: Settings, *, force: bool = False) -> list[str]:
    """Delete ``settings.queue``'s ready queue, dead-letter stream and log; the names deleted.

    Refuses while the ready queue holds jobs or has consumers (``force`` deletes
    them). Jobs of the queue still in the shared levels go to the orphans queue.
    """
    topology = Topology(settings.queue, settings.queue_type)
    connection = _open(settings, "remove the queue")
    deleted = []
    try:
        with map_errors(settings, "remove the queue"):
            channel = connection.channel()
            for name in (topology.ready_queue, topology.dead_queue, topology.log_queue):
                if _depth(connection, name) is None:
                    continue
                if name == topology.ready_queue and not force:
                    state = channel.queue_declare(name, passive=True).method
                    if state.message_count or state.consumer_count:
                        raise ConfigurationError(
                            f"{name} holds {state.message_count} job(s) and has "
                            f"{state.consumer_count} consumer(s): stop its workers and let it "
                            f"drain, or pass --force to delete them"
                        )
                channel.queue_delete(name)
                deleted.append(name)
            channel.close()
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            connection.close()
    return deleted

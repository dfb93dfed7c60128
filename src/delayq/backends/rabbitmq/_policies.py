"""Vhost policies that change what delayq's queues do with a message, found and judged.

A policy (or an operator policy) matching a level queue can shorten its TTL, so
jobs run early; one matching a ready queue can drop jobs (``message-ttl``,
``max-length``) or move them (``dead-letter-exchange``). AMQP cannot list
policies, so they are read with ``rabbitmqctl`` when it is on PATH and the
broker is on this host (the management API may be off); where it is not, the
check says so instead. ``delayq rabbitmq verify`` reports them, and opening a
store checks them once per vhost and process (``policies=warn``, the default:
a warning in the log; ``refuse``: the store does not open; ``off``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
from typing import Any

from delayq.clock import SYSTEM_CLOCK
from delayq.errors import ConfigurationError

__all__ = [
    "RISKY_POLICY_KEYS",
    "cached_policies",
    "check_at_open",
    "problems",
    "read_policies",
    "risky_policies",
]

log = logging.getLogger("delayq.rabbitmq")

RISKY_POLICY_KEYS = frozenset(
    {
        "message-ttl",
        "expires",
        "max-length",
        "max-length-bytes",
        "overflow",
        "delivery-limit",
        "dead-letter-exchange",
        "dead-letter-routing-key",
        "dead-letter-strategy",
    }
)
"""Policy keys that change what delayq's queues do with a message (TTL, drops, limits)."""

CTL_TIMEOUT = 30
"""Seconds the broker gives one ``rabbitmqctl`` command; its process group is killed
five seconds later (the CLI starts an Erlang VM, which a plain kill would leave)."""

CACHE_FOR = 60.0
"""Seconds the policies read for a vhost serve later opens of this process."""

_LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})

_cache_lock = threading.Lock()  # guards _cache
_cache: dict[str, tuple[float, list[dict[str, Any]] | None]] = {}  # vhost -> (expiry, rows)


def _rabbitmqctl(*args: str) -> str | None:
    """The output of ``rabbitmqctl -q ARGS`` (bounded), or None when it failed."""
    process = subprocess.Popen(
        ["rabbitmqctl", "-q", "-t", str(CTL_TIMEOUT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=CTL_TIMEOUT + 5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    return out if process.returncode == 0 else None


NEEDED_FEATURE_FLAGS = ("quorum_queue", "stream_queue")
"""Feature flags the store needs: quorum queues, and streams (the dead letters, the
log, and at-least-once dead-lettering between quorum queues, which falls back to at
most once without them)."""


def read_feature_flags(host: str | None = "") -> dict[str, str] | None:
    """The broker's feature flags and their state; None when they cannot be read here."""
    if host not in _LOCAL_HOSTS or shutil.which("rabbitmqctl") is None:
        return None
    out = _rabbitmqctl("list_feature_flags", "name", "state", "--formatter", "json")
    if out is None:
        return None
    try:
        return {str(row["name"]): str(row["state"]) for row in json.loads(out or "[]")}
    except (ValueError, TypeError, KeyError):
        return None


def read_policies(vhost: str, host: str | None = "") -> list[dict[str, Any]] | None:
    """Policies and operator policies of ``vhost``; None when they cannot be read here
    (no ``rabbitmqctl``, or ``host`` is not this one)."""
    if host not in _LOCAL_HOSTS or shutil.which("rabbitmqctl") is None:
        return None
    found: list[dict[str, Any]] = []
    for command, kind in (
        ("list_policies", "policy"),
        ("list_operator_policies", "operator policy"),
    ):
        out = _rabbitmqctl(command, "-p", vhost, "--formatter", "json")
        if out is None:
            return None
        with contextlib.suppress(ValueError):
            for row in json.loads(out or "[]"):
                found.append(row | {"kind": kind})
    return found


def cached_policies(vhost: str, host: str | None) -> list[dict[str, Any]] | None:
    """:func:`read_policies`, read at most once per ``CACHE_FOR`` seconds per vhost."""
    now = SYSTEM_CLOCK.monotonic()
    with _cache_lock:
        hit = _cache.get(vhost)
    if hit is not None and hit[0] > now:
        return hit[1]
    rows = read_policies(vhost, host)
    with _cache_lock:
        _cache[vhost] = (now + CACHE_FOR, rows)
    return rows


def risky_policies(
    rows: list[dict[str, Any]], names: list[str]
) -> list[tuple[str, list[str], list[str]]]:
    """(policy, its risky keys, the names it matches) for each policy that changes how
    one of ``names`` treats messages."""
    out = []
    for row in rows:
        definition = row.get("definition")
        if isinstance(definition, str):
            with contextlib.suppress(ValueError):
                definition = json.loads(definition)
        if not isinstance(definition, dict):
            continue
        keys = sorted(RISKY_POLICY_KEYS & set(definition))
        if not keys or row.get("apply-to", "all") == "exchanges":
            continue
        try:
            pattern = re.compile(str(row.get("pattern", "")))
        except re.error:
            continue
        matched = [n for n in names if pattern.search(n)]
        if matched:
            out.append((f"{row.get('kind', 'policy')} {row.get('name', '?')}", keys, matched))
    return out


def problems(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """One sentence per risky policy on ``names``."""
    out = []
    for policy, keys, matched in risky_policies(rows, names):
        shown = ", ".join(matched[:3]) + (" ..." if len(matched) > 3 else "")
        out.append(
            f"{policy} sets {', '.join(keys)} on {shown}: a shorter message-ttl makes jobs "
            f"run early, and length or TTL limits drop jobs (they end as dead letters)"
        )
    return out


def check_at_open(mode: str, vhost: str, host: str | None, names: list[str]) -> None:
    """Opening a store: ``warn`` logs each risky policy on ``names`` (read on a thread of
    its own, so opening never waits for the CLI); ``refuse`` raises
    :class:`~delayq.errors.ConfigurationError`; ``off`` reads nothing."""
    if mode == "off":
        return

    def check() -> list[str]:
        found = problems(cached_policies(vhost, host) or [], names)
        for problem in found:
            log.warning("RabbitMQ vhost %r: %s (see `delayq rabbitmq verify`)", vhost, problem)
        return found

    if mode == "warn":
        threading.Thread(target=check, name="delayq-rabbitmq-policies", daemon=True).start()
        return
    found = check()
    if found:
        raise ConfigurationError(
            f"RabbitMQ vhost {vhost!r}: {found[0]}; remove the policy (or narrow its "
            f"pattern), or open with policies=warn"
        )

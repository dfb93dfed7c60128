"""Connecting to RabbitMQ: URL options, pika parameters, and ONE map from pika errors to delayq's.

``pika.BlockingConnection`` is not thread-safe, so the store opens one
connection per role: the publisher's (used under a lock by producer and worker
threads, see ``_publisher.py``) and the consumer's (owned by its I/O thread,
see ``_consumer.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pika
import pika.exceptions

from delayq.backends._common import check_queue_name
from delayq.backends._urls import UrlOptions, flag, mask, split_url
from delayq.backends.rabbitmq._topology import QueueType
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError, PayloadTooLarge

__all__ = ["ConfirmTimeout", "Settings", "connect", "map_errors", "mask"]

_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "queue_type": str,
    "prefetch": int,
    "max_returns": int,
    "confirm_timeout": float,
    "declare": str,
    "allow_at_most_once": flag,
    "policies": str,
    "log": flag,
}
"""Query parameters that are delayq options; every other one goes to pika."""
DEFAULT_QUEUE = "default"
DEFAULT_MAX_RETURNS = 10
DEFAULT_PREFETCH = 32
"""Deliveries a worker holds unacked (due ones waiting for a handler slot, and those in
their local wait of at most 32 ms): a few more than a worker's handler slots. Memory:
at most ``prefetch`` bodies (a body is about its payload's size, 1 MiB at the default
payload limit) plus their decoded payloads."""
DEFAULT_CONFIRM_TIMEOUT = 30.0
"""Seconds a publish waits for the broker's confirms before it fails (the job may or may
not be stored)."""


class ConfirmTimeout(Exception):
    """The broker did not confirm ``count`` messages within ``timeout`` seconds."""

    def __init__(self, count: int, timeout: float) -> None:
        super().__init__(count, timeout)
        self.count, self.timeout = count, timeout


def _int_option(raw: object, field: str, low: int, high: int) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        value = low - 1
    if isinstance(raw, bool) or not low <= value <= high:
        raise ConfigurationError(f"{field} must be an int in {low}..{high}, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """What the store reads from its URL and options."""

    url: str  # masked, for messages
    pika_url: str  # the URL without delayq's own query options, for pika
    vhost: str
    queue: str
    queue_type: QueueType
    prefetch: int = DEFAULT_PREFETCH
    max_returns: int = DEFAULT_MAX_RETURNS
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT
    declare: str = "auto"  # "auto" (declare what is missing) or "passive" (check only)
    policies: str = "warn"  # risky vhost policies at open: "warn", "refuse" or "off"
    log: bool = True  # the queue's log (_log.py): cancel / reschedule / get by id

    @classmethod
    def parse(cls, url: str, **options: Any) -> Settings:
        """Read ``amqp[s]://user:pass@host:port/vhost?queue=..&queue_type=..&prefetch=..``.

        Keyword options (None means not given) and query options: the one rule
        of ``delayq.backends._urls`` (the same option set to two values is an
        ``InvalidOption``); other query options (``heartbeat``,
        ``connection_attempts`` ...) go to pika unchanged.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ConfigurationError(f"RabbitMQBackend needs an amqp:// URL, got {mask(url)!r}")
        unknown = sorted(set(options) - set(_URL_OPTIONS))
        if unknown:
            raise ConfigurationError(f"unknown RabbitMQ store option(s): {', '.join(unknown)}")
        rest_url, own = split_url(url, _URL_OPTIONS, store="RabbitMQ")
        given = UrlOptions(url, own, dict.fromkeys(_URL_OPTIONS))

        def pick(name: str, default: Any) -> Any:
            value = given.pick(name, options.get(name))
            return default if value is None else value

        chosen_queue = check_queue_name(pick("queue", DEFAULT_QUEUE))
        kind = pick("queue_type", "quorum")
        if kind not in ("quorum", "classic"):
            raise ConfigurationError(f"queue_type must be 'quorum' or 'classic', got {kind!r}")
        if kind == "classic" and pick("allow_at_most_once", False) is not True:
            raise ConfigurationError(
                "queue_type='classic' dead-letters between levels at most once (a job is lost "
                "when a hop fails) and is not replicated; pass allow_at_most_once=true to "
                "accept that, or use the default quorum queues"
            )
        prefetch = _int_option(pick("prefetch", DEFAULT_PREFETCH), "prefetch", 1, 65535)
        max_returns = _int_option(
            pick("max_returns", DEFAULT_MAX_RETURNS), "max_returns", 1, 10_000
        )
        raw_timeout = pick("confirm_timeout", DEFAULT_CONFIRM_TIMEOUT)
        try:
            timeout = float(str(raw_timeout))
        except ValueError:
            timeout = -1.0
        if isinstance(raw_timeout, bool) or not 0.0 < timeout <= 3600.0:
            raise ConfigurationError(
                f"confirm_timeout must be seconds in (0, 3600], got {raw_timeout!r}"
            )
        declare = pick("declare", "auto")
        if declare not in ("auto", "passive"):
            raise ConfigurationError(f"declare must be 'auto' or 'passive', got {declare!r}")
        policies = pick("policies", "warn")
        if policies not in ("warn", "refuse", "off"):
            raise ConfigurationError(
                f"policies must be 'warn', 'refuse' or 'off', got {policies!r}"
            )
        log = pick("log", True)
        if not isinstance(log, bool):
            raise ConfigurationError(f"log must be true or false, got {log!r}")
        parts = urlsplit(rest_url)
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        vhost = unquote(path) if path else "/"
        pika_url = urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
        return cls(
            url=mask(url),
            pika_url=pika_url,
            vhost=vhost,
            queue=chosen_queue,
            queue_type=kind,
            prefetch=prefetch,
            max_returns=max_returns,
            confirm_timeout=timeout,
            declare=str(declare),
            policies=str(policies),
            log=log,
        )


def connect(settings: Settings, *, name: str) -> Any:
    """A new ``pika.BlockingConnection`` (errors mapped); ``name`` shows in the management UI."""
    with map_errors(settings, "connect"):
        try:
            params = pika.URLParameters(settings.pika_url)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad AMQP URL {settings.url!r}: {exc}") from exc
        params.client_properties = {"connection_name": f"delayq {name}"}
        if params.blocked_connection_timeout is None:
            # A broker under a memory or disk alarm blocks publishers; fail instead of hanging.
            params.blocked_connection_timeout = 60.0
        return pika.BlockingConnection(params)


@contextlib.contextmanager
def map_errors(settings: Settings, action: str) -> Iterator[None]:
    """Turn pika's errors into delayq's (the cause kept): the one place that does it."""
    where = f"RabbitMQ at {settings.url}"
    try:
        yield
    except (
        pika.exceptions.ProbableAuthenticationError,
        pika.exceptions.AuthenticationError,
    ) as exc:
        raise ConfigurationError(
            f"{where} refused the login while trying to {action}: wrong user or password ({exc!r})"
        ) from exc
    except pika.exceptions.ProbableAccessDeniedError as exc:
        raise ConfigurationError(
            f"{where} denied access to virtual host {settings.vhost!r} while trying to "
            f"{action}: it does not exist or the user has no permissions on it ({exc!r})"
        ) from exc
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code in (403, 530):  # ACCESS_REFUSED (login), NOT_ALLOWED (vhost)
            raise ConfigurationError(
                f"{where} refused the connection while trying to {action}: {exc.reply_text} "
                f"(check the user, password and virtual host {settings.vhost!r})"
            ) from exc
        raise BackendUnavailable(
            f"{where} closed the connection while trying to {action}: {exc.reply_text}"
        ) from exc
    except pika.exceptions.ChannelClosedByBroker as exc:
        text = str(exc.reply_text)
        if exc.reply_code == 406 and "message size" in text:
            raise PayloadTooLarge(f"{where} refused to {action}: {text}") from exc
        if exc.reply_code == 406 and "inequivalent arg" in text:
            raise ConfigurationError(
                f"{where} refused to {action}: {text} (an exchange or queue of that name "
                f"exists with other arguments, e.g. another queue_type)"
            ) from exc
        if exc.reply_code == 404:
            raise ConfigurationError(
                f"{where} refused to {action}: {text} (with declare=passive, run "
                f"`delayq rabbitmq setup` first)"
            ) from exc
        if exc.reply_code == 403:
            raise ConfigurationError(
                f"{where} refused to {action}: {text} (the user lacks a permission; "
                f"run `delayq rabbitmq setup` as one that has it and open the store "
                f"with declare=passive)"
            ) from exc
        raise BackendError(f"{where} failed to {action}: {text}") from exc
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
        raise BackendError(
            f"{where} did not accept the message while trying to {action}: "
            f"{type(exc).__name__} (a queue of the topology is missing or full)"
        ) from exc
    except ConfirmTimeout as exc:
        raise BackendUnavailable(
            f"{where} did not confirm {exc.count} message(s) within {exc.timeout:g} s while "
            f"trying to {action} (confirm_timeout): they may or may not be stored"
        ) from exc
    except pika.exceptions.ConnectionBlockedTimeout as exc:
        raise BackendUnavailable(
            f"{where} blocked publishing while trying to {action}: a resource alarm (memory "
            f"or disk) is raised on the broker"
        ) from exc
    except pika.exceptions.AMQPConnectionError as exc:
        raise BackendUnavailable(
            f"{where} is unreachable while trying to {action}: {exc!r}"
        ) from exc
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise BackendUnavailable(f"{where} failed while trying to {action}: {exc!r}") from exc

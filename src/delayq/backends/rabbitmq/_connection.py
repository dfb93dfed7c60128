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
from delayq.backends._urls import UrlOptions, mask, split_url
from delayq.backends.rabbitmq._topology import QueueType
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError

__all__ = ["Settings", "connect", "map_errors", "mask"]

_URL_OPTIONS: dict[str, Callable[[str], Any]] = {"queue": str, "queue_type": str, "prefetch": int}
"""Query parameters that are delayq options; every other one goes to pika."""
DEFAULT_QUEUE = "default"
DEFAULT_PREFETCH = 5000
"""Deliveries a worker holds unacked: enough for every job due within the ~1 s that
deliveries are held locally at several thousand jobs/s."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What the store reads from its URL and options."""

    url: str  # masked, for messages
    pika_url: str  # the URL without delayq's own query options, for pika
    vhost: str
    queue: str
    queue_type: QueueType
    prefetch: int

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        queue: str | None = None,
        queue_type: str | None = None,
        prefetch: int | None = None,
    ) -> Settings:
        """Read ``amqp[s]://user:pass@host:port/vhost?queue=..&queue_type=..&prefetch=..``.

        A keyword and a query option that disagree are an ``InvalidOption``
        (``delayq.backends._urls``); other query options (``heartbeat``,
        ``connection_attempts`` ...) go to pika unchanged.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ConfigurationError(f"RabbitMQBackend needs an amqp:// URL, got {mask(url)!r}")
        rest_url, own = split_url(url, _URL_OPTIONS, store="RabbitMQ")
        given = UrlOptions(url, own, dict.fromkeys(_URL_OPTIONS))
        chosen = given.pick("queue", queue)
        chosen_queue = check_queue_name(DEFAULT_QUEUE if chosen is None else chosen)
        kind = given.pick("queue_type", queue_type)
        kind = "quorum" if kind is None else kind
        if kind not in ("quorum", "classic"):
            raise ConfigurationError(f"queue_type must be 'quorum' or 'classic', got {kind!r}")
        raw_prefetch: object = given.pick("prefetch", prefetch)
        if raw_prefetch is None:
            count = DEFAULT_PREFETCH
        else:
            try:
                count = int(str(raw_prefetch))
            except ValueError:
                count = 0
            if isinstance(raw_prefetch, bool) or not 1 <= count <= 65535:
                raise ConfigurationError(
                    f"prefetch must be an int in 1..65535, got {raw_prefetch!r}"
                )
        parts = urlsplit(rest_url)
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        vhost = unquote(path) if path else "/"
        pika_url = urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
        return cls(
            url=mask(url),
            pika_url=pika_url,
            vhost=vhost,
            queue=chosen_queue,
            queue_type=kind,  # type: ignore[arg-type]
            prefetch=count,
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
        if exc.reply_code == 406:
            raise ConfigurationError(
                f"{where} refused to {action}: {exc.reply_text} (an exchange or queue of "
                f"that name exists with other arguments, e.g. another queue_type)"
            ) from exc
        raise BackendError(f"{where} failed to {action}: {exc.reply_text}") from exc
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
        raise BackendError(
            f"{where} did not accept the message while trying to {action}: "
            f"{type(exc).__name__} (a queue of the topology is missing or full)"
        ) from exc
    except pika.exceptions.AMQPConnectionError as exc:
        raise BackendUnavailable(
            f"{where} is unreachable while trying to {action}: {exc!r}"
        ) from exc
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise BackendUnavailable(f"{where} failed while trying to {action}: {exc!r}") from exc

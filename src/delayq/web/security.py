"""Who may read and who may act: the token, the session cookie and CSRF.

* Every action (any request that is not GET/HEAD) needs the token: a browser
  proves it with the session cookie it got by opening a page with
  ``?token=...``, a script sends ``Authorization: Bearer <token>``.
* Reads need the token too when the server listens beyond the loopback
  interface (``require_for_reads``).
* A state-changing request authenticated by the cookie must also carry the CSRF
  value of that session (a hidden form field ``csrf`` or the header
  ``X-CSRF-Token``) and, when the browser sends one, an ``Origin`` of this very
  server. A cookie alone never acts: another site can make a browser send it,
  never read the CSRF value. A bearer token is not sent by browsers on their
  own, so it needs no CSRF value.

Tokens and derived values are compared in constant time.

Every request must name this server in its ``Host`` header (the bound
address, the loopback names, or a name given with ``--allowed-host``): a page
of another site that re-points its own DNS name at 127.0.0.1 (DNS rebinding)
is then refused, though the browser thinks it reads its own origin.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

__all__ = [
    "COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "LOOPBACK_HOSTS",
    "Guard",
    "host_of",
    "is_loopback",
]

COOKIE = "delayq_session"
"""The session cookie's name; each dashboard adds a suffix derived from its
token (cookies ignore ports: two dashboards on one host keep their own)."""
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def host_of(netloc: str) -> str | None:
    """The host name of a ``Host`` header or URL authority, lower case, without
    the port or IPv6 brackets; None when it is malformed."""
    netloc = netloc.strip().lower().rpartition("@")[2]
    if netloc.startswith("["):
        host, closed, rest = netloc[1:].partition("]")
        if not closed or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return host or None
    host, _, port = netloc.partition(":")
    if port and not port.isdigit():
        return None
    return host or None


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Guard:
    """The token rules of one server (see the module docstring)."""

    token: str
    require_for_reads: bool = False

    def _derive(self, purpose: str) -> str:
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def cookie(self) -> str:
        """This dashboard's cookie name (:data:`COOKIE` plus 8 hex of the token's HMAC)."""
        return f"{COOKIE}_{self._derive('cookie-name')[:8]}"

    @property
    def session(self) -> str:
        """The cookie value: derived from the token, so the token never sits in a cookie."""
        return self._derive("session")

    @property
    def csrf(self) -> str:
        """The CSRF value pages embed in their forms."""
        return self._derive("csrf")

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def session_ok(self, cookie: str | None) -> bool:
        return cookie is not None and hmac.compare_digest(cookie.encode(), self.session.encode())

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())

    @staticmethod
    def bearer(authorization: str | None) -> str | None:
        if authorization is None or not authorization.lower().startswith("bearer "):
            return None
        return authorization[7:].strip()

"""Store URLs: delayq's options taken out of the query, passwords masked, and
the ONE rule for an option given both in the URL and as a keyword.

The rule (every store keeps it, ``docs/stores.md``): a URL query option and a
keyword that set the same option to *different* values is an
:class:`~delayq.errors.InvalidOption` naming both; the same value twice is
fine. Explicit beats silent: which of two conflicting settings should win is
a guess, and a wrong guess shows only later (another queue, a shorter TTL).
A keyword left at its default counts as not given, so the URL sets it
(:class:`UrlOptions`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from delayq.errors import ConfigurationError, InvalidOption

__all__ = ["UrlOptions", "flag", "keyword_defaults", "mask", "merge_options", "split_url"]


def flag(value: str) -> bool:
    """A URL's boolean option: ``1/true/yes/on`` or ``0/false/no/off``."""
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _unsplit(parts: SplitResult) -> str:
    """``urlunsplit``, keeping the ``//`` of ``unix:///path`` (an empty host)."""
    url = urlunsplit(parts)
    if parts.scheme == "unix" and not parts.netloc and not url.startswith("unix://"):
        url = "unix://" + url.removeprefix("unix:")
    return url


def mask(url: str) -> str:
    """``url`` with its password replaced by ``***``: the one in the user info
    and any query parameter whose name contains ``password``."""
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if "password" in parts.query.lower():
        query = [
            (name, "***" if "password" in name.lower() else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query=urlencode(query, safe="*"))
    return _unsplit(parts)


def split_url(
    url: str,
    parsers: Mapping[str, Callable[[str], Any]],
    *,
    store: str,
    strict: bool = False,
) -> tuple[str, dict[str, Any]]:
    """``(the URL without delayq's options, delayq's options)``.

    ``parsers`` names delayq's own query options and turns each text into its
    value; every other query parameter stays in the URL for the driver, or is a
    :class:`~delayq.errors.ConfigurationError` when ``strict`` (a store with no
    driver options). ``store`` names the store in messages.
    """
    parts = urlsplit(url)
    ours: dict[str, Any] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in parsers:
            try:
                ours[name] = parsers[name](value)
            except ValueError as exc:
                raise ConfigurationError(
                    f"bad {name}={value!r} in {store} URL {mask(url)!r}: {exc}"
                ) from exc
        elif strict:
            raise ConfigurationError(
                f"unknown {store} URL option {name!r}; known: {', '.join(parsers)}"
            )
        else:
            theirs.append((name, value))
    # %20 for a space: libpq decodes only %XX (urlencode's default + would reach it as +)
    return _unsplit(parts._replace(query=urlencode(theirs, quote_via=quote))), ours


class UrlOptions:
    """A URL's delayq options, read against the keywords by the one precedence rule.

    ``defaults`` are the keywords' defaults: a keyword equal to its default
    counts as not given (the URL sets it); a keyword without an entry there
    was given explicitly.
    """

    __slots__ = ("_defaults", "_options", "_url")

    def __init__(
        self, url: str, options: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> None:
        self._url = url
        self._options = options
        self._defaults = defaults or {}

    def pick(self, name: str, keyword: Any) -> Any:
        """The value of option ``name`` given ``keyword`` as its keyword value."""
        if name not in self._options:
            return keyword
        value = self._options[name]
        if _same(keyword, value):
            return keyword
        if name in self._defaults and _same(keyword, self._defaults[name]):
            return value
        raise InvalidOption(
            f"{name} is set twice: {name}={keyword!r} as a keyword and {name}={value!r} "
            f"in the URL {mask(self._url)!r}; set it in one place"
        )


def merge_options(
    url: str, options: Mapping[str, Any], keywords: Mapping[str, Any]
) -> dict[str, Any]:
    """``keywords`` (all given explicitly, as ``**options``) with the URL's ``options``
    added, by the one precedence rule."""
    given = UrlOptions(url, options)
    merged = dict(keywords)
    for name, value in options.items():
        merged[name] = given.pick(name, keywords[name]) if name in keywords else value
    return merged


def keyword_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    """The defaults of ``function``'s keyword-only parameters (for :class:`UrlOptions`)."""
    return {
        p.name: p.default
        for p in inspect.signature(function).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    }


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (``True`` is not ``1`` here)."""
    return a is b or (isinstance(a, bool) is isinstance(b, bool) and a == b)

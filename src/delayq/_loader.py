"""Loading a DelayQ app named ``package.module:attr``: the one loader.

``delayq worker TARGET`` loads the app with it, and so does each child process
of a worker's process pool (the child must build the same handlers, and it
cannot be handed functions across a spawn). :func:`app_target` finds the name
of an app already imported, for ``Worker(app, pool="process")`` given no target.
"""

from __future__ import annotations

import importlib
import os
import sys

from delayq.app import URL_ENV, DelayQ
from delayq.errors import ConfigurationError, InvalidOption

__all__ = ["app_target", "import_modules", "load_app"]


def load_app(target: str, url: str | None = None) -> DelayQ:
    """Import ``target`` (``package.module:attr``, dots allowed in ``attr``) and return
    the app it names (calling it first if it is a function returning one).

    The current directory is importable, as for ``python -m``. ``url`` is put in
    ``$DELAYQ_URL`` first, so an app built with ``DelayQ()`` opens that store.
    Raises :class:`InvalidOption` for a malformed target and
    :class:`ConfigurationError` when it cannot be imported or is not an app.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise InvalidOption(f"TARGET must look like 'package.module:app', got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if url is not None:
        os.environ[URL_ENV] = url  # an app built with DelayQ() picks it up
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj: object = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, DelayQ) and callable(obj):
        obj = obj()
    if not isinstance(obj, DelayQ):
        raise ConfigurationError(
            f"{target} is a {type(obj).__name__}, not a DelayQ app (or a function returning one)"
        )
    return obj


def import_modules(names: list[str]) -> None:
    """Import the user's modules named in a configuration (the Django setting
    ``DELAYQ["MODULES"]``: the handlers they register), as :func:`load_app` does."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import {name!r}: {exc}") from exc


def app_target(app: DelayQ) -> str | None:
    """``module:attr`` of a module-level variable holding ``app`` (a module other
    than ``__main__`` first), or None when no imported module holds it."""
    found: list[str] = []
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if value is app and not attr.startswith("__"):
                found.append(f"{name}:{attr}")
                break
    found.sort(key=lambda t: (t.startswith(("__main__:", "__mp_main__:")), t))
    return found[0] if found else None

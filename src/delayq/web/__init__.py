"""The dashboard: server-rendered pages, a JSON API under ``/api`` and ``/metrics``.

``delayq web --url URL`` serves it; :func:`create_app` builds the ASGI app
(Starlette) for embedding, e.g. in a worker's process. Needs
``pip install 'delayq[web]'``. Nothing in the library imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from delayq.errors import MissingDependency

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from delayq.app import DelayQ

__all__ = ["create_app"]


def create_app(app: DelayQ, **options: Any) -> Starlette:
    """The dashboard for ``app`` (see :func:`delayq.web.app.create_app`)."""
    try:
        from delayq.web.app import create_app as build  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependency(
            f"the delayq dashboard needs {exc.name or 'its packages'}: pip install 'delayq[web]'"
        ) from exc
    return build(app, **options)

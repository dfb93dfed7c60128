"""Web framework integrations: delayq opened and closed with a web app.

* :mod:`delayq.integrations.starlette`: :class:`~delayq.integrations.starlette.DelayQLifespan`
  (open / close the app with the web app's lifespan, optionally an in-process
  worker, the dashboard mounted under a prefix) and ``get_delayq(request)``;
* :mod:`delayq.integrations.fastapi`: the same plus the dependencies ``DelayQDep``
  and ``AsyncDelayQDep`` (``pip install 'delayq[fastapi]'``).

Nothing in the library imports this package.
"""

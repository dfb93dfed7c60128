"""An app the dashboard's process loads by name (``tests.unit._web_app:app``):
``DelayQ()`` opens the store in ``$DELAYQ_URL``, which the loader sets."""

from __future__ import annotations

from delayq import DelayQ

TARGET = "tests.unit._web_app:app"


def app() -> DelayQ:
    return DelayQ()

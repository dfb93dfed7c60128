"""``delayq.otel``: the public path of :mod:`delayq.observe.otel` (re-exported)."""

from __future__ import annotations

from delayq.observe.otel import (
    ENVELOPE_KEY,
    Tracing,
    instrument,
    unwrap,
)

__all__ = [
    "ENVELOPE_KEY",
    "Tracing",
    "instrument",
    "unwrap",
]

"""``delayq.metrics``: the public path of :mod:`delayq.observe.metrics` (re-exported)."""

from __future__ import annotations

from delayq.observe.metrics import (
    DURATION_BUCKETS,
    LATENESS_BUCKETS,
    MULTIPROC_ENV,
    LatenessSeries,
    Metrics,
    SeriesPoint,
    StoreCollector,
    bucket_quantile,
    exposition_registry,
    lateness_bucket_totals,
    multiprocess_dir,
)

__all__ = [
    "DURATION_BUCKETS",
    "LATENESS_BUCKETS",
    "MULTIPROC_ENV",
    "LatenessSeries",
    "Metrics",
    "SeriesPoint",
    "StoreCollector",
    "bucket_quantile",
    "exposition_registry",
    "lateness_bucket_totals",
    "multiprocess_dir",
]

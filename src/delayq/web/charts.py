"""The overview's charts: lateness (p50 / p99) and throughput, as server-drawn SVG.

Both share one honest time axis: it ends at the server's ``now`` (not at the
last slot that had attempts) and spans the slots kept, at least
:data:`MIN_SPAN` seconds. A slot without attempts is a gap in the lateness
lines (nothing was measured) and an empty bar in the throughput chart. The
SVG holds numbers and fixed labels only, nothing from a job, so it is safe to
mark as HTML. Colours come from CSS classes, so the dark theme restyles them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from delayq.observe.metrics import SeriesPoint

__all__ = ["MIN_SPAN", "lateness_svg", "throughput_svg"]

MIN_SPAN = 600.0
_LEFT, _RIGHT_PAD, _TOP, _BOTTOM_PAD = 52, 8, 8, 22
_GRID = ((0.0001, "0.1ms"), (0.001, "1ms"), (0.1, "100ms"), (1, "1s"), (60, "1m"), (3600, "1h"))
_LO, _HI = math.log10(0.0001), math.log10(86400.0)


def _ago(seconds: float) -> str:
    """A tick label: ``-45s``, ``-20m``, ``-1.5h``."""
    if seconds < 120:
        return f"-{seconds:.0f}s"
    if seconds < 7200:
        return f"-{seconds / 60:.0f}m"
    return f"-{seconds / 3600:.1f}h"


class _Axis:
    """Wall time from ``now - span`` to ``now`` onto ``[left, right]``."""

    def __init__(self, points: Sequence[SeriesPoint], slot: float, now: float, width: int) -> None:
        first = points[0].start if points else now
        self.t1 = now
        self.t0 = min(first, now - MIN_SPAN)
        self.left, self.right = _LEFT, width - _RIGHT_PAD

    def x(self, t: float) -> float:
        t = min(max(t, self.t0), self.t1)
        return self.left + (t - self.t0) / (self.t1 - self.t0) * (self.right - self.left)

    def ticks(self, height: int) -> str:
        """Four labelled ticks: ``-30m`` ... ``now``."""
        out = []
        span = self.t1 - self.t0
        for i in range(4):
            back = span * (3 - i) / 3
            x = self.x(self.t1 - back)
            label = "now" if i == 3 else _ago(back)
            anchor = "end" if i == 3 else ("start" if i == 0 else "middle")
            out.append(
                f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" '
                f'y2="{height - _BOTTOM_PAD}"/>'
                f'<text x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">{label}</text>'
            )
        return "".join(out)


def _svg(width: int, height: int, label: str, body: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{label}" preserveAspectRatio="none">{body}</svg>'
    )


def lateness_svg(
    points: Sequence[SeriesPoint],
    *,
    slot_seconds: float,
    now: float,
    width: int = 720,
    height: int = 200,
) -> str:
    """p50 and p99 lateness per slot (log scale, 0.1 ms to 1 d); empty string
    when there are no points. Consecutive slots join; an idle slot breaks the line."""
    if not points:
        return ""
    axis = _Axis(points, slot_seconds, now, width)
    bottom = height - _BOTTOM_PAD

    def y(v: float) -> float:
        v = min(max(v if math.isfinite(v) else 86400.0, 0.0001), 86400.0)
        return bottom - (math.log10(v) - _LO) / (_HI - _LO) * (bottom - _TOP)

    grid = "".join(
        f'<line class="grid" x1="{_LEFT}" x2="{axis.right}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
        f'<text x="4" y="{y(v) + 4:.1f}">{text}</text>'
        for v, text in _GRID
    )
    runs: list[list[SeriesPoint]] = []
    for p in points:
        if runs and p.start - runs[-1][-1].start <= slot_seconds * 1.5:
            runs[-1].append(p)
        else:
            runs.append([p])

    def line(run: list[SeriesPoint], pick: str, css: str) -> str:
        mid = slot_seconds / 2
        coords = [(axis.x(p.start + mid), y(getattr(p, pick))) for p in run]
        if len(coords) == 1:  # one slot alone: a dot, not a line to somewhere
            cx, cy = coords[0]
            return f'<circle class="{css}" cx="{cx:.1f}" cy="{cy:.1f}" r="2.5"/>'
        text = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
        return f'<polyline class="{css}" fill="none" stroke-width="2" points="{text}"/>'

    # p50 first, p99 on top: equal values show the p99 colour, never hide it
    lines = "".join(line(r, "p50", "p50") + line(r, "p99", "p99") for r in runs)
    return _svg(width, height, "lateness p50 and p99 over time", grid + axis.ticks(height) + lines)


def throughput_svg(
    points: Sequence[SeriesPoint],
    *,
    slot_seconds: float,
    now: float,
    width: int = 720,
    height: int = 120,
) -> str:
    """Attempts per minute in each slot, as bars on the same time axis as the
    lateness chart (linear scale from 0, its top labelled); empty string when
    there are no points."""
    if not points:
        return ""
    axis = _Axis(points, slot_seconds, now, width)
    bottom = height - _BOTTOM_PAD
    rates = [p.count * 60.0 / slot_seconds for p in points]
    top_rate = max(rates)
    bar = max(1.0, axis.x(axis.t0 + slot_seconds) - axis.x(axis.t0) - 1)
    tall = bottom - _TOP
    bars = "".join(
        f'<rect class="bar" x="{axis.x(p.start):.1f}" y="{bottom - r / top_rate * tall:.1f}" '
        f'width="{bar:.1f}" height="{r / top_rate * tall:.1f}"/>'
        for p, r in zip(points, rates, strict=True)
        if p.start + slot_seconds > axis.t0
    )
    scale = (
        f'<line class="grid" x1="{_LEFT}" x2="{axis.right}" y1="{_TOP}" y2="{_TOP}"/>'
        f'<text x="4" y="{_TOP + 8}">{top_rate:.4g}/m</text>'
        f'<line class="grid" x1="{_LEFT}" x2="{axis.right}" y1="{bottom}" y2="{bottom}"/>'
        f'<text x="4" y="{bottom}">0</text>'
    )
    return _svg(width, height, "attempts per minute over time", scale + axis.ticks(height) + bars)

"""Pure arithmetic over measured rounds: medians with spread, percentiles, paired ratios, rate series.

Noisy machines vary 10-40% run to run (DESIGN.md section 7), so every figure is a median over short
interleaved rounds with its min/max beside it, and a ratio is the median of the per-round ratios of two
measurements taken back to back (drift cancels within a round) rather than a ratio of medians.
"""

from __future__ import annotations

import math
import statistics


def spread(values: list[float | None]) -> dict | None:
    """{median, min, max, rounds} of the values that exist; None when there are none."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "rounds": len(xs)}


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 95)) -> dict:
    """Nearest-rank percentiles plus max: ``{"p50": .., "p95": .., "max": ..}`` (None when empty)."""
    xs = sorted(values)
    out: dict = {}
    for q in qs:
        out[f"p{q}"] = xs[max(0, math.ceil(q / 100 * len(xs)) - 1)] if xs else None
    out["max"] = xs[-1] if xs else None
    return out


def paired_ratio(ours: list[dict], theirs: list[dict], figure: str) -> dict | None:
    """Median over rounds of ours[r][figure] / theirs[r][figure], with min/max across rounds."""
    ratios = []
    for a, b in zip(ours, theirs):
        x, y = a.get(figure), b.get(figure)
        if x is not None and y:
            ratios.append(x / y)
    return spread(ratios)


def rate(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def rate_series(points: list[tuple[float, float]], bins: int = 40) -> list[list[float]]:
    """Cumulative (t, count) points -> [[t_mid, count per second], ...] over ``bins`` equal windows."""
    if len(points) < 2:
        return []
    t_end = points[-1][0]
    if t_end <= 0:
        return []
    width = t_end / bins
    out = []
    j = 0
    prev = 0.0
    for b in range(bins):
        hi = (b + 1) * width
        while j < len(points) and points[j][0] <= hi:
            j += 1
        total = points[j - 1][1] if j else 0.0
        out.append([round((b + 0.5) * width, 4), round((total - prev) / width, 3)])
        prev = total
    return out


def rotate(names: list[str], r: int) -> list[str]:
    """Round r runs the measurements in a rotated order, so none always goes first (cold cache, turbo)."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]

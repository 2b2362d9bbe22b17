"""Pure arithmetic over measured rounds: medians with quartiles, paired ratios, percentiles, rates sampled
once a second, and the rotation that interleaves measurements.

These machines vary 10-40% run to run (docs/performance.md), so a figure is the median over short
interleaved rounds with its quartiles beside it, and a ratio is computed per round from two measurements
taken back to back (machine drift cancels within a round), then summarised like any other figure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.records import Record, spec


@dataclass(frozen=True, slots=True)
class Spread(Record):
    """One figure over rounds: median, quartiles (inclusive method), extremes and how many rounds."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    rounds: int = field(metadata=spec(minimum=1))

    @property
    def iqr(self) -> float:
        """The run-to-run spread the regression gate weighs a drop against."""
        return self.q3 - self.q1

    def check_fields(self, what: str) -> None:
        """Quartiles of something measured: finite, not negative, in order (an edited report is refused)."""
        xs = [self.min, self.q1, self.median, self.q3, self.max]
        if not all(math.isfinite(x) and x >= 0 for x in xs) or xs != sorted(xs):
            raise FormatError(f"{what}: min, q1, median, q3, max must be finite, not negative and in order, not {xs}")


def spread(values: Sequence[float | None], what: str) -> Spread:
    """The Spread of a figure that every run measures: no finite value means nothing was measured."""
    s = summarise(values)
    if s is None:
        raise UsageError(
            f"no round measured {what} ({len(values)} round(s), none finite)", hint="measure longer (--duration)"
        )
    return s


def summarise(values: Sequence[float | None]) -> Spread | None:
    """The Spread of the finite values; None when there are none."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    if len(xs) == 1:
        return Spread(xs[0], xs[0], xs[0], xs[0], xs[0], 1)
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return Spread(q2, q1, q3, xs[0], xs[-1], len(xs))


def paired_ratios(ours: list[float | None], theirs: list[float | None]) -> list[float]:
    """ours[r] / theirs[r] for every round where both were measured (and the divisor is not zero)."""
    return [a / b for a, b in zip(ours, theirs) if a is not None and b]


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float] | None:
    """Nearest-rank percentiles plus the max, ``{"p50": .., "p90": .., "p99": .., "max": ..}``; None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    out = {f"p{q}": xs[max(0, math.ceil(q / 100 * len(xs)) - 1)] for q in qs}
    out["max"] = xs[-1]
    return out


def sampled_rates(points: list[tuple[float, float]], offset: float = 0.0) -> list[tuple[float, float]]:
    """Cumulative ``(t, count)`` samples (about one a second, the last at the end) -> ``(t_mid + offset,
    count per second)`` for each interval between consecutive samples."""
    out = []
    prev_t, prev_n = 0.0, 0.0
    for t, n in points:
        if t > prev_t:
            out.append((offset + (prev_t + t) / 2, (n - prev_n) / (t - prev_t)))
            prev_t, prev_n = t, n
    return out


def rotate(names: list[str], r: int) -> list[str]:
    """Round r runs the measurements in a rotated order, so none always goes first (cold cache, CPU boost)."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]

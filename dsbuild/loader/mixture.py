"""Deterministic mixing schedules: which source feeds global batch j (or, mixing per sample, slot j).

A low-discrepancy sequence (the golden-ratio additive recurrence) compared against cumulative weights:
batch j goes to the source whose weight interval holds frac(phase + j * phi). Realised proportions
track the weights within O(log n / n), far tighter than random draws (binomial error ~ 1/sqrt(n)),
and the choice for any j is O(1) arithmetic, so resuming needs no replay.
"""

from __future__ import annotations

import math

import numpy as np

from dsbuild.core.errors import UsageError
from dsbuild.loader.permutation import derive_key

PHI = (math.sqrt(5) - 1) / 2


def normalise(weights: list[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise UsageError(f"mixture weights must be finite, non-negative and not all zero: {list(weights)}")
    return w / w.sum()


def schedule(weights: np.ndarray, seed: int, start: int, count: int) -> np.ndarray:
    """Source index of global batches (or sample slots) [start, start + count)."""
    phase = (derive_key(seed, "mixture") % (1 << 52)) / float(1 << 52)
    j = np.arange(start, start + count, dtype=np.float64)
    u = np.mod(phase + j * PHI, 1.0)
    return np.minimum(np.searchsorted(np.cumsum(weights), u, side="right"), len(weights) - 1)


def schedule_counts(weights: np.ndarray, seed: int, count: int, block: int = 1 << 20) -> list[int]:
    """How many of global batches (or slots) [0, count) go to each source, in blocks of bounded memory."""
    out = np.zeros(len(weights), dtype=np.int64)
    for start in range(0, count, block):
        out += np.bincount(schedule(weights, seed, start, min(block, count - start)), minlength=len(weights))
    return out.tolist()

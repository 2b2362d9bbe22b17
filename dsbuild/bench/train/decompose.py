"""Where a training step's time goes, from the profiler's intervals: pure interval arithmetic.

A step is one window of the main thread's timeline, ``[start, end)``. Its time is cut into disjoint parts,
each instant counted once, in this order of precedence:

- **data wait**: inside the loader's ``next`` (the ``dsbuild.data_wait`` range);
- **h2d**: copying the batch to the device (the ``dsbuild.h2d`` range; CPU: a no-op, about zero);
- **compute**: any operator running on the main thread or kernel on the device that is not a collective;
- **exposed communication**: a collective running (on any thread: gloo's own, or NCCL kernels) while none
  of the above is;
- **other**: the rest of the window: Python between operators, the optimizer's bookkeeping outside
  operators, waiting on a collective that the profiler does not show as running, allocator and launch gaps.

The parts add up to the step exactly (the window is partitioned). **Communication** is reported beside
them: all the time any collective ran in the step, overlapped or not; communication minus exposed
communication is the part hidden behind compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dsbuild.core.records import Record

Interval = tuple[float, float]
PARTS = ("compute", "exposed_comm", "data_wait", "h2d", "other")


@dataclass(frozen=True, slots=True)
class Parts(Record):
    """One step's (or the mean step's) time in seconds, split as the module docstring defines."""

    step: float
    compute: float
    exposed_comm: float
    data_wait: float
    h2d: float
    other: float
    comm: float  # every instant a collective ran, overlapped with compute or not


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-empty intervals covering the same instants."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return union((max(a, lo), min(b, hi)) for a, b in intervals)


def minus(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Instants of ``a`` not in ``b`` (both disjoint and sorted, as ``union`` gives)."""
    out, j = [], 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def split_step(
    window: Interval,
    data: Iterable[Interval],
    h2d: Iterable[Interval],
    compute: Iterable[Interval],
    comm: Iterable[Interval],
) -> Parts:
    """The parts of one step window (see the module docstring for the precedence)."""
    taken: list[Interval] = []
    sizes = {}
    for name, spans in (("data_wait", data), ("h2d", h2d), ("compute", compute), ("exposed_comm", comm)):
        mine = minus(clip(spans, window), taken)
        sizes[name] = length(mine)
        taken = union([*taken, *mine])
    step = window[1] - window[0]
    return Parts(
        step=step,
        other=max(0.0, step - length(taken)),
        comm=length(clip(comm, window)),
        **sizes,
    )


def mean(parts: Sequence[Parts]) -> Parts:
    """The mean step of a window of steps (each part's mean; the sum still equals the mean step)."""
    n = len(parts)
    return Parts(**{k: sum(getattr(p, k) for p in parts) / n for k in Parts.__dataclass_fields__})

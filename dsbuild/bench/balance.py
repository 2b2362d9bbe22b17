"""Per-rank work of a data-parallel run, as drawn and as ``balance="frames"`` deals it (issue 40).

Under data parallelism a step lasts as long as its busiest rank; with clips of mixed lengths the rank
that draws the longest ones is a straggler made by the data. Both deals are computed from the loader's
own epoch plan (``walk.balance_steps``: pure, no sample is read), over the first global steps of the
stream, so one bench run shows the spread with and without ``balance`` on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsbuild.core.records import Record
from dsbuild.loader.parallel import straggler
from dsbuild.loader.walk import End, Position, balance_steps, walk_batches, walk_samples

MAX_BATCHES = 20_000  # global batches weighed (dp of them a step): a bounded, quick pass over the plan


@dataclass(frozen=True, slots=True)
class WorkSpread(Record):
    min: float  # the least-loaded rank's frames in a step (mean over steps)
    max: float  # the busiest rank's frames
    max_over_min: float | None  # None if a rank got no frames
    max_over_mean: float
    straggler_cost: float  # sum(max) / sum(mean) - 1: the steps' time beyond an even split


@dataclass(frozen=True, slots=True)
class RankWork(Record):
    unit: str  # frames (delivered: after frame_stride, clip_frames, max_frames)
    dp: int  # data-parallel ranks
    steps: int  # global steps weighed
    drawn: WorkSpread  # balance=None: rank k takes global batch p + k
    balanced: WorkSpread | None  # balance="frames"; None under bucket_by (a deal would mix shapes)


def rank_work(loader, max_batches: int = MAX_BATCHES) -> RankWork | None:
    """The per-rank frames of the first whole global steps of ``loader``'s stream (at most
    ``max_batches`` batches), both ways; None with one data-parallel rank or no whole step."""
    loader.open()
    o, dp = loader.options, loader.coords.dp_size
    if dp < 2:
        return None
    start = Position(0, tuple((0, 0) for _ in loader.plans))
    if o.mix == "sample":
        walk = walk_samples(start, loader.plans, loader.weights, o.seed, True, loader.spec)
    else:
        walk = walk_batches(start, loader.plans, loader.weights, o.seed, True)
    drawn: list[np.ndarray] = []
    dealt: list[np.ndarray] = []
    group: list = []
    for step in walk:
        if isinstance(step, End) or len(drawn) * dp >= max_batches:
            break
        group.append(step)
        if len(group) == dp:
            _, a, b = balance_steps(group, loader.plans, o.pack_frames, 0)
            drawn.append(a)
            dealt.append(b)
            group = []
    if not drawn:
        return None
    return RankWork(
        "frames",
        dp,
        len(drawn),
        WorkSpread(**straggler(np.array(drawn))),
        None if o.bucket_by is not None else WorkSpread(**straggler(np.array(dealt))),
    )


COLUMNS = ("deal", "min frames", "max frames", "max/min", "max/mean", "straggler cost")


def rows(work: RankWork) -> list[tuple[str, ...]]:
    """The text table's rows: the deal as drawn, then balanced (or why not)."""
    out: list[tuple[str, ...]] = []
    for name, s in (("as drawn (balance=None)", work.drawn), ('balance="frames"', work.balanced)):
        if s is None:
            out.append((name, "-", "-", "-", "-", "not offered: bucket_by would be mixed"))
            continue
        ratio = "-" if s.max_over_min is None else f"{s.max_over_min:.2f}"
        out.append(
            (name, f"{s.min:.0f}", f"{s.max:.0f}", ratio, f"{s.max_over_mean:.3f}", f"+{100 * s.straggler_cost:.1f}%")
        )
    return out

"""The records of a ``bench --model`` run and the pure arithmetic that turns ranks' measurements into its
figures: MFU, the mean step's parts, the straggler, scaling efficiency, the input-bound verdict and cost."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from dsbuild.bench.report import Machine
from dsbuild.bench.train.decompose import Parts, mean
from dsbuild.bench.train.options import TrainOptions
from dsbuild.bench.train.peaks import Peak
from dsbuild.core.records import JsonValue, Record, spec

FORMAT = "dsbuild.bench.model/1"
FED_BELOW = 0.05  # input-bound when the step waits for data this share of its time or more (as `bench`)
STRAGGLER_SHARE = 0.10  # a rank whose own work exceeds the others' median by this share of the step
OWN = ("compute", "data_wait", "h2d", "other")  # a rank's own work: everything but waiting for the others


@dataclass(frozen=True, slots=True)
class RankRun(Record):
    """One rank's measurements over the profiled window (``dsbuild.bench.train.worker``)."""

    rank: int
    world: int
    batch_size: int
    device: str
    torch_threads: int
    params: int
    flops: int  # forward + backward of one step, counted by FlopCounterMode
    peak: Peak
    step_s: tuple[float, ...]
    parts: tuple[Parts, ...]
    frames: tuple[int, ...]  # frames the loader delivered per step
    samples: tuple[int, ...]
    batch_build_s: float | None  # loader worker seconds per batch (read + decode + collate)
    loss: tuple[float, ...]  # first and last
    timings: dict[str, float]
    software: dict[str, JsonValue]
    round_steps: tuple[int, ...] | None = field(  # of step_s, per interleaved round, in order
        default=None, metadata=spec(absent_when_none=True, doc="profiled steps per interleaved round")
    )


@dataclass(frozen=True, slots=True)
class Straggler(Record):
    rank: int  # the slowest rank: the most own work (step minus exposed communication)
    excess_s: float  # its own work minus the other ranks' median
    share: float  # excess / the median step
    component: str  # the part of its own work that exceeds the others' the most
    component_excess_s: float
    flagged: bool  # excess >= STRAGGLER_SHARE of the step


@dataclass(frozen=True, slots=True)
class Point(Record):
    """One job: ``world`` ranks of ``batch_size`` clips each."""

    kind: str  # base (1 rank) | weak (per-rank batch fixed) | strong (global batch fixed)
    world: int
    batch_size: int
    ranks: tuple[RankRun, ...]
    step_s: float  # the slowest rank's mean step: the job's step
    parts: Parts  # the mean step of the slowest rank
    flops_per_step: int  # all ranks, counted
    analytic_flops_per_step: float  # 6 x parameters x tokens, all ranks
    mfu: float
    mfu_analytic: float
    samples_per_s: float
    frames_per_s: float
    efficiency: float | None  # weak: T1 / TW; strong: T1 / (W x TW); base: None; median over rounds
    straggler: Straggler | None
    round_step_s: tuple[float, ...] | None = field(  # per interleaved round: the slowest rank's mean step
        default=None, metadata=spec(absent_when_none=True, doc="the job's step in each interleaved round")
    )


@dataclass(frozen=True, slots=True)
class InputVerdict(Record):
    data_wait_share: float
    input_bound: bool
    batch_build_s: float | None
    workers_per_rank: int | None  # loader threads that would feed the step
    threads: int


@dataclass(frozen=True, slots=True)
class Cost(Record):
    price_per_hour: float  # per device
    devices: int
    per_1000_steps: float
    steps_per_epoch: float
    per_epoch: float
    data_wait_share: float  # of the cost


@dataclass(frozen=True, slots=True)
class Restart(Record):
    killed_rank: int
    killed_after_step: int
    signal: str
    components: dict[str, float]  # seconds to the first step after the restart, by component
    total_s: float
    exactly_once: bool
    samples_checked: int
    detail: str


@dataclass(frozen=True, slots=True)
class DatasetRef(Record):
    version_id: str
    split: str | None
    samples: int


@dataclass(frozen=True, slots=True)
class ModelInfo(Record):
    name: str
    params: int
    tokens_per_clip: int  # a patch of a frame or an action step each
    parallel: str
    dtype: str


@dataclass(frozen=True, slots=True)
class TrainReport(Record):
    FORMAT = FORMAT

    options: TrainOptions
    dataset: DatasetRef
    model: ModelInfo
    device: str
    peak: Peak
    software: dict[str, JsonValue]
    machine: Machine
    points: tuple[Point, ...]
    verdict: InputVerdict
    cost: Cost | None
    restart: Restart | None
    notes: tuple[str, ...]


def mean_parts(run: RankRun) -> Parts:
    return mean(run.parts)


def straggler(runs: list[Parts]) -> Straggler | None:
    """The slowest of ranks whose mean steps are ``runs`` (by rank), by how much and in which part."""
    if len(runs) < 2:
        return None
    own = [sum(getattr(p, k) for k in OWN) for p in runs]
    slow = max(range(len(runs)), key=own.__getitem__)
    others = [p for r, p in enumerate(runs) if r != slow]
    excess = own[slow] - statistics.median(own[r] for r in range(len(runs)) if r != slow)
    by_part = {k: getattr(runs[slow], k) - statistics.median(getattr(p, k) for p in others) for k in OWN}
    component = max(by_part, key=by_part.__getitem__)
    step = statistics.median(p.step for p in runs)
    share = excess / step if step > 0 else 0.0
    return Straggler(slow, excess, share, component, by_part[component], share >= STRAGGLER_SHARE)


def point(kind: str, runs: list[RankRun], tokens_per_clip: int) -> Point:
    """A job's figures from its ranks (efficiency filled in by ``scale``)."""
    parts = [mean_parts(r) for r in runs]
    slow = max(range(len(runs)), key=lambda r: parts[r].step)
    step = parts[slow].step
    flops = sum(r.flops for r in runs)
    peak = sum(r.peak.flops for r in runs)
    clips = sum(statistics.fmean(r.samples) for r in runs)
    analytic = 6.0 * runs[0].params * tokens_per_clip * clips
    return Point(
        kind=kind,
        world=len(runs),
        batch_size=runs[0].batch_size,
        ranks=tuple(runs),
        step_s=step,
        parts=parts[slow],
        flops_per_step=flops,
        analytic_flops_per_step=analytic,
        mfu=flops / step / peak,
        mfu_analytic=analytic / step / peak,
        samples_per_s=clips / step,
        frames_per_s=sum(statistics.fmean(r.frames) for r in runs) / step,
        efficiency=None,
        straggler=straggler(parts),
        round_step_s=round_steps(runs),
    )


def round_steps(runs: list[RankRun]) -> tuple[float, ...] | None:
    """Per interleaved round, the job's step: the slowest rank's mean step over that round's steps."""
    counts = runs[0].round_steps
    if counts is None:
        return None
    ends = [0, *itertools.accumulate(counts)]
    return tuple(max(mean(r.parts[a:b]).step for r in runs) for a, b in zip(ends, ends[1:]))


def efficiency(kind: str, base_step_s: float, step_s: float, scale: float) -> float:
    """``scale`` times the base's ranks. Weak scaling (per-rank batch fixed): T1 / TW, 1 when the step does
    not grow. Strong (global batch fixed, split over the ranks): T1 / (scale x TW), 1 when twice the ranks
    take half the time."""
    return base_step_s / step_s if kind == "weak" else base_step_s / (scale * step_s)


def paired_efficiency(kind: str, base: Point, p: Point) -> float:
    """``efficiency`` of ``p`` against ``base``: with rounds interleaved, the median over rounds of each
    round's (paired: both measured under the same load), else from the whole windows."""
    scale = p.world / base.world
    if base.round_step_s and p.round_step_s and len(base.round_step_s) == len(p.round_step_s):
        return statistics.median(efficiency(kind, b, t, scale) for b, t in zip(base.round_step_s, p.round_step_s))
    return efficiency(kind, base.step_s, p.step_s, scale)


def verdict(p: Point, threads: int) -> InputVerdict:
    """Input-bound when a rank's step waits for data FED_BELOW of its time or more (the rank that waits the
    most: the others wait for it in their collectives); the loader threads a rank needs: one builds a batch
    in ``batch_build_s``, the step asks for one every (step - data wait)."""
    parts = max((mean_parts(r) for r in p.ranks), key=lambda q: q.data_wait / q.step if q.step > 0 else 0.0)
    share = parts.data_wait / parts.step if parts.step > 0 else 0.0
    builds = [r.batch_build_s for r in p.ranks if r.batch_build_s is not None]
    build = max(builds) if builds else None
    busy = parts.step - parts.data_wait
    workers = max(1, math.ceil(build / busy)) if build is not None and busy > 0 else None
    return InputVerdict(share, share >= FED_BELOW, build, workers, threads)


def cost(p: Point, v: InputVerdict, price_per_hour: float, dataset_samples: int) -> Cost:
    """Device-hours priced per device: per 1,000 steps, per epoch of the version, and the share of it spent
    waiting for data (the verdict's: while one rank waits for its batch, every rank waits for it)."""
    per_step = price_per_hour * p.world * p.step_s / 3600
    steps_per_epoch = dataset_samples / (p.batch_size * p.world)
    return Cost(
        price_per_hour, p.world, per_step * 1000, steps_per_epoch, per_step * steps_per_epoch, v.data_wait_share
    )

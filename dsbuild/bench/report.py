"""The bench report: one typed record, saved with ``--save`` and read back as a ``--baseline``.

It records what was measured (settings, and the device and decoder that actually ran), on what (the
dataset version by identity and size), where (the machine and its software), and how long (the budget,
the start-up, the rounds finished, whether it was interrupted); then every figure as a median with
quartiles over rounds, each baseline's figure and the ratio ours / baseline, the training simulation,
where the time went, and every measurement of every round (from which all of the above derive).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from dsbuild.bench.balance import RankWork
from dsbuild.bench.dataset import DatasetFacts
from dsbuild.bench.gate import Gate
from dsbuild.bench.measure import Measured
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.ranks import Ranks
from dsbuild.bench.stages import Stages
from dsbuild.bench.stats import Spread
from dsbuild.bench.step import H2D, StepInfo
from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.records import Record, spec
from dsbuild.formats.probe import usable_cores

FORMAT = "dsbuild.bench/2"
MAX_REPORT = 1 << 26
PACKAGES = ("dsbuild", "torch", "av", "numpy", "pyarrow", "webdataset", "litdata", "mosaicml-streaming", "torchcodec")


@dataclass(frozen=True, slots=True)
class Resolved(Record):
    """What ran where the options left a choice (part of the settings a comparison requires equal)."""

    device: str  # cuda, cpu (torch tensors) or numpy
    decoder: str | None  # the video decoder that ran (frames mode); None in bytes mode
    bucket_by: str | None  # resolution when frames of several sizes are batched without resize


@dataclass(frozen=True, slots=True)
class Machine(Record):
    cpu_count: int
    usable_cpus: int
    cpu_model: str | None
    memory_bytes: int | None
    platform: str
    python: str
    gpu: str | None
    packages: dict[str, str | None]  # installed versions (None: not installed)


@dataclass(frozen=True, slots=True)
class RunTime(Record):
    """How ``--duration`` was kept."""

    duration_s: float  # the budget of all rounds and baselines together
    measured_s: float  # wall time of the rounds
    startup_s: float  # before the first round: opening the version, peers' copies, the step, rank processes
    rounds_planned: int
    rounds_done: int
    interrupted: bool


@dataclass(frozen=True, slots=True)
class Ours(Record):
    figure: Spread  # frames/s (frames mode) or MB/s (bytes mode): what the baselines are compared on
    samples_per_s: Spread
    frames_per_s: Spread | None
    mb_per_s: Spread
    open_s: Spread
    first_batch_s: Spread
    resume_s: Spread
    corrupt: int
    decoder_note: str | None  # why this decoder (e.g. "auto: no CUDA GPU, decoding with PyAV on CPU")
    notes: tuple[str, ...]  # other choices the loader made (device fallback)


@dataclass(frozen=True, slots=True)
class BaselineResult(Record):
    name: str
    description: str
    version: str | None  # the library's version, for library baselines
    skipped: str | None  # why it did not run
    figure: Spread | None  # in the report's unit
    ratio: Spread | None  # ours / it, per round


@dataclass(frozen=True, slots=True)
class Training(Record):
    step: StepInfo
    steps: int
    wait_fraction: Spread  # data wait / wall time of the training loop, per round
    fed: bool  # median wait fraction below fed_below
    fed_below: float
    gpu_idle_fraction: Spread | None
    gpu_idle_reason: str | None


@dataclass(frozen=True, slots=True)
class BenchReport(Record):
    FORMAT = FORMAT

    options: BenchOptions
    resolved: Resolved
    dataset: DatasetFacts
    machine: Machine
    started_at: str
    time: RunTime
    unit: str  # frames/s or MB/s
    ours: Ours | None  # None when no round finished
    baselines: tuple[BaselineResult, ...]
    training: Training | None
    stages: dict[str, Stages]  # throughput / training, summed over rounds
    waits_ms: tuple[float, ...]  # data wait per training step (per batch without a step)
    waits_of: str
    h2d: H2D
    ranks: Ranks | None
    rounds: tuple[Measured, ...]  # every measurement of every finished round, in the order they ran
    gate: Gate | None = None
    rank_work: RankWork | None = field(  # dp > 1: frames per rank per step, as drawn and balanced
        default=None, metadata=spec(absent_when_none=True, doc="the per-rank spread (dsbuild.bench.balance)")
    )

    def check_fields(self, what: str) -> None:
        """A report read back (a ``--baseline``) is what a run wrote: its ratios are what its rounds give
        (the gate compares them; an edited median or quartile would move its verdicts; every spread was
        checked in order as it was read)."""
        from dsbuild.bench.stats import paired_ratios, summarise

        def by_round(name: str) -> list[float | None]:
            got = {m.round: m.figure(self.options.decode) for m in self.rounds if m.name == name}
            return [got.get(r) for r in range(self.time.rounds_done)]

        mine = by_round("ours")
        for b in self.baselines:
            if b.ratio is None:
                continue
            again = summarise(paired_ratios(mine, by_round(b.name)))
            if again is None or any(
                abs(x - y) > 1e-9 * max(1.0, abs(y))
                for x, y in zip(again.to_json().values(), b.ratio.to_json().values())
            ):
                raise FormatError(f"{what}: the ratio ours/{b.name} is not what its rounds give (an edited report?)")


def machine(gpu: str | None) -> Machine:
    import importlib.metadata as md

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = md.version(name)
        except md.PackageNotFoundError:
            packages[name] = None
    if packages["dsbuild"] is None:  # running from a source tree
        from dsbuild import __version__

        packages["dsbuild"] = __version__
    return Machine(
        os.cpu_count() or 1,
        usable_cores(),
        model,
        memory,
        platform.platform(),
        platform.python_version(),
        gpu,
        packages,
    )


def load(path: str | Path) -> BenchReport:
    """A report saved with ``--save`` (a ``UsageError`` if unreadable, a ``FormatError`` if it is not one)."""
    from dsbuild.core.files import read_capped
    from dsbuild.core.jsonio import loads_bounded

    try:  # a regular file only (a FormatError naming it otherwise): a FIFO waited forever for a writer
        data = read_capped(Path(path), MAX_REPORT, what=f"--baseline {path}")
    except OSError as e:
        raise UsageError(f"--baseline {path}: cannot read ({e.strerror})") from None
    return BenchReport.from_json(loads_bounded(data, max_bytes=MAX_REPORT, what=str(path)), f"--baseline {path}")

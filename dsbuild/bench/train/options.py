"""What a ``bench --model`` run measures: one typed record, validated when built, saved in every report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsbuild.core.errors import UsageError
from dsbuild.core.records import Record, spec

DTYPES = ("bf16", "fp32")
PARALLEL = ("ddp", "fsdp")
COMPONENTS = ("compute", "data")


@dataclass(frozen=True, slots=True)
class Inject(Record):
    """``--inject-delay RANK[:data]:MS``: a sleep on one rank, in its step (a slow device) or in its data path."""

    rank: int = field(metadata=spec(minimum=0))
    component: str  # compute | data
    ms: float = field(metadata=spec(minimum=0))


@dataclass(frozen=True, slots=True)
class TrainOptions(Record):
    ref: str  # PATH[@VERSION]
    model: str
    split: str | None = None
    ranks: tuple[int, ...] = (1,)  # one scaling point per world size, in this order
    parallel: str = "ddp"  # ddp | fsdp (FSDP2: fully_shard per block and at the root)
    dtype: str = "bf16"  # bf16 autocast, or fp32
    batch_size: int = field(default=2, metadata=spec(minimum=1, doc="clips per rank per step (weak scaling)"))
    clip_frames: int = field(default=8, metadata=spec(minimum=2, doc="frames per clip: a crop, as training takes"))
    resize: tuple[int, ...] = (64, 64)  # the models need one frame size; 64x64 keeps tiny in seconds on a CPU
    threads: int = field(default=2, metadata=spec(minimum=1, doc="loader threads per rank"))
    steps: int = field(default=5, metadata=spec(minimum=1, doc="profiled steps per rank"))
    rounds: int = field(  # (an older report, made before rounds, reads as the default)
        default=3,
        metadata=spec(minimum=1, doc="interleaved rounds the steps are cut into, the scaling points alternating"),
    )
    warmup: int = field(default=2, metadata=spec(minimum=0, doc="steps before the profiled window (lazy setup)"))
    seed: int = field(default=0, metadata=spec(minimum=0))
    inject: Inject | None = None
    timeout_s: float = field(default=120.0, metadata=spec(minimum=1, doc="collective timeout (a dead peer)"))
    price_per_hour: float | None = None  # USD per device
    restart: bool = False  # also measure restart time at the largest world (kill a rank, restart the job)

    def __post_init__(self) -> None:
        for flag, value, allowed in (("--parallel", self.parallel, PARALLEL), ("--dtype", self.dtype, DTYPES)):
            if value not in allowed:
                raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
        if not self.ranks or min(self.ranks) < 1 or len(set(self.ranks)) != len(self.ranks):
            raise UsageError(f"--ranks must be distinct whole numbers >= 1, not {list(self.ranks)}")
        if self.inject is not None and self.inject.rank >= max(self.ranks):
            raise UsageError(
                f"--inject-delay names rank {self.inject.rank}, but the largest run has {max(self.ranks)} rank(s)",
                hint=f"ranks are numbered 0..{max(self.ranks) - 1}",
            )
        if self.price_per_hour is not None and not 0 <= self.price_per_hour < math.inf:
            raise UsageError(f"--price-per-hour must be a finite number >= 0, not {self.price_per_hour!r}")


def parse_ranks(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise UsageError(f"--ranks {text!r}: use a count or a list of counts, e.g. 2 or 1,2,4")
    return tuple(int(p) for p in parts)


def parse_inject(text: str | None) -> Inject | None:
    """'1:200' (rank 1's step, 200 ms) or '1:data:200' (rank 1's data path) -> Inject."""
    if not text:
        return None
    parts = text.split(":")
    try:
        if len(parts) == 2:
            return Inject(int(parts[0]), "compute", float(parts[1]))
        if len(parts) == 3 and parts[1] in COMPONENTS:
            return Inject(int(parts[0]), parts[1], float(parts[2]))
    except ValueError:
        pass
    raise UsageError(f"--inject-delay {text!r}: use RANK:MS or RANK:data:MS, e.g. 1:200 or 1:data:200")

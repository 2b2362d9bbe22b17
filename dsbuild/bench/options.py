"""What a bench run measures: one typed record, validated when built, saved in the report.

Every field but ``ref`` and ``duration`` is a *setting*: two reports are comparable only when their settings
are equal (``dsbuild.bench.gate``), because each changes what is measured. ``ref`` is where the data was
read from (the dataset is compared by version id and split instead); ``duration`` only changes how long
each round lasts, not what a round measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsbuild.core.errors import UsageError
from dsbuild.core.records import Record, spec
from dsbuild.loader.options import BACKENDS, VERIFY
from dsbuild.loader.parallel import parse_layout

DECODES = ("frames", "bytes")
DEVICES = ("auto", "cuda", "cpu")
NOT_SETTINGS = ("ref", "duration")


@dataclass(frozen=True, slots=True)
class BenchOptions(Record):
    ref: str  # PATH[@VERSION]
    split: str | None = None  # NAME/SPLIT
    batch_size: int = field(default=8, metadata=spec(minimum=1, doc="the loader's default"))
    threads: int = field(default=2, metadata=spec(minimum=1, doc="loader threads per rank (the loader's default)"))
    workers: int | None = field(
        default=None,
        metadata=spec(absent_when_none=True, doc="loader worker processes per rank (None: threads); see bench.sweep"),
    )
    ranks: int = field(default=1, metadata=spec(minimum=1, doc="simulated data-parallel ranks (processes)"))
    step_ms: float = field(default=50.0, metadata=spec(minimum=0, doc="a small model's step; 0: no training loop"))
    decode: str = "frames"  # frames (uint8 arrays) or bytes (encoded clips for a GPU decoder)
    decode_backend: str = (
        "pyav"  # the loader's default; auto picks the fastest measured (PyAV today: dsbuild.loader.backends)
    )
    resize: tuple[int, ...] | None = None  # (height, width); None keeps sizes and buckets by resolution
    verify: str = "sample"  # the loader's default: a hash of each sample read
    device: str = "auto"  # cuda when present, else cpu tensors; numpy when torch is missing
    duration: float = field(default=30.0, metadata=spec(minimum=0, doc="wall seconds of all rounds together"))
    rounds: int = field(default=5, metadata=spec(minimum=1, doc="interleaved rounds; the gate needs 3 or more"))
    compare: tuple[str, ...] | None = None  # baselines by name; None: every one that applies (peers if installed)
    seed: int = field(default=0, metadata=spec(minimum=0))
    parallel: str | None = field(
        default=None,
        metadata=spec(absent_when_none=True, doc="the loader's model-parallel layout over the ranks, e.g. tp=2,cp=2"),
    )

    def __post_init__(self) -> None:
        for flag, value, allowed in (
            ("--decode", self.decode, DECODES),
            ("--device", self.device, DEVICES),
            ("--verify", self.verify, VERIFY),
            ("--decode-backend", self.decode_backend, BACKENDS),
        ):
            if value not in allowed:
                raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
        for flag, number, low in (
            ("--batch-size", self.batch_size, 1),
            ("--threads", self.threads, 1),
            ("--ranks", self.ranks, 1),
            ("--rounds", self.rounds, 1),
            ("--workers", 1 if self.workers is None else self.workers, 1),
            ("--seed", self.seed, 0),
        ):
            if not isinstance(number, int) or isinstance(number, bool) or number < low:
                raise UsageError(f"{flag} must be a whole number >= {low}, not {number!r}")
        if not 0 <= self.step_ms < math.inf:
            raise UsageError(f"--step-ms must be a finite number >= 0, not {self.step_ms!r}")
        if not 0 < self.duration < math.inf:
            raise UsageError(f"--duration must be a finite number of seconds > 0, not {self.duration!r}")
        if self.resize is not None and (len(self.resize) != 2 or min(self.resize) < 1):
            raise UsageError(f"--resize must be HEIGHTxWIDTH, not {self.resize!r}")
        if self.parallel is not None:
            layout = parse_layout(self.parallel)
            layout.data_parallel(self.ranks)  # tp x cp x pp must divide --ranks
            if layout.pp > 1:
                raise UsageError(
                    f"--parallel {self.parallel}: pp={layout.pp} is not measured (middle stages read nothing)",
                    hint="bench the first stage's layout without pp",
                )

    def settings(self) -> dict:
        """The fields that define what is measured (see the module docstring)."""
        doc = self.to_json()
        if doc.get("compare"):  # one run whatever order the names were given in (saved before they were sorted)
            doc["compare"] = sorted(doc["compare"])
        return {k: v for k, v in doc.items() if k not in NOT_SETTINGS}


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """'HxW' -> (H, W)."""
    if not text:
        return None
    h, sep, w = text.lower().partition("x")
    if not sep or not h.isdigit() or not w.isdigit() or int(h) < 1 or int(w) < 1:
        raise UsageError(f"--resize {text!r}: use HEIGHTxWIDTH, e.g. 128x128")
    return int(h), int(w)


def parse_compare(text: str | None) -> tuple[str, ...] | None:
    """'auto' (or nothing) -> None (every baseline that applies); 'none' -> (); 'raw,webdataset' -> names, in
    one order whatever order they were given in (a baseline saved with raw,sha256 gates sha256,raw)."""
    if text is None or text.strip() == "auto":
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts == ["none"]:
        return ()
    if not parts or "none" in parts or "auto" in parts:
        raise UsageError(f"--compare {text[:60]!r}: use auto, none, or baseline names such as raw,sha256")
    return tuple(sorted(set(parts)))

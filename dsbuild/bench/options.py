"""What a bench run measures: one typed record, validated when built, written into the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsbuild.core.errors import UsageError

BASELINES = ("raw", "pyav", "webdataset")
DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class BenchOptions:
    ref: str
    split: str | None = None
    batch_size: int = 8  # the loader's default
    workers: int = 2  # the loader's default: decode threads per rank
    ranks: int = 1  # simulated data-parallel ranks (processes on this machine)
    step_ms: float = 50.0  # a small model's training step; 0 skips the training simulation
    decode: str = "frames"  # frames (uint8 arrays) or bytes (encoded clips)
    resize: tuple[int, int] | None = None  # (height, width); None keeps sizes and buckets by resolution
    device: str = "auto"  # cuda when present, else cpu (torch tensors); numpy when torch is missing
    duration: float = 30.0  # seconds measured in all, split over rounds and measurements
    rounds: int = 3  # interleaved rounds: medians need at least three
    compare: tuple[str, ...] = BASELINES  # baselines measured in the same run
    seed: int = 0
    verify: bool = True  # the loader's default: check each sample's sha256

    def __post_init__(self) -> None:
        if self.decode not in ("frames", "bytes"):
            raise UsageError(f"--decode must be frames or bytes, not {self.decode!r}")
        if self.device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        bad = [c for c in self.compare if c not in BASELINES]
        if bad:
            raise UsageError(f"--compare: unknown baseline {bad[0]!r}; choose from {', '.join(BASELINES)}")
        if self.batch_size < 1 or self.workers < 0 or self.ranks < 1 or self.rounds < 1:
            raise UsageError("--batch-size, --ranks and --rounds must be >= 1 and --workers >= 0")
        if self.step_ms < 0 or self.duration <= 0:
            raise UsageError("--step-ms must be >= 0 and --duration > 0")

    @property
    def threads(self) -> int:
        """Decode threads per rank (the loader runs one thread when workers=0)."""
        return max(1, self.workers)

    def to_json(self) -> dict:
        d = asdict(self)
        d["resize"] = list(self.resize) if self.resize else None
        d["compare"] = list(self.compare)
        return d

    @classmethod
    def from_json(cls, d: dict) -> BenchOptions:
        d = dict(d)
        d["resize"] = tuple(d["resize"]) if d.get("resize") else None
        d["compare"] = tuple(d.get("compare", ()))
        return cls(**d)


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """'HxW' -> (H, W)."""
    if not text:
        return None
    h, sep, w = text.lower().partition("x")
    if not sep or not h.isdigit() or not w.isdigit() or int(h) < 1 or int(w) < 1:
        raise UsageError(f"--resize {text!r}: use HEIGHTxWIDTH, e.g. 128x128")
    return int(h), int(w)


def parse_compare(text: str | None) -> tuple[str, ...]:
    """'raw,pyav' -> ('raw', 'pyav'); '' or 'none' -> ()."""
    if text is None:
        return BASELINES
    parts = tuple(p.strip() for p in text.split(",") if p.strip() and p.strip() != "none")
    return tuple(dict.fromkeys(parts))

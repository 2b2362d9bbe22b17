"""The options of a build. Everything in ``ConvertConfig`` changes the output bytes and is hashed."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dsbuild.errors import UsageError

FORMATS = ("webdataset", "parquet")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text: str) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30, '4096' -> 4096."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"cannot read size {text!r}; use a number of bytes or e.g. 256MB, 1GiB")
    unit = (m.group(2) or "").upper().removesuffix("B")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class ConvertConfig:
    """Build options that define the output. Worker count and strictness are not here: they never
    change a byte of the result."""

    format: str = "webdataset"
    # ~8 s: long enough for temporal context, short enough that a clip is a cheap random read.
    clip_seconds: float = 8.0
    # A few hundred MB: big sequential reads for object stores, small enough to rewrite incrementally.
    shard_size: int = 256_000_000
    # Parquet row groups of a few samples keep a single-sample read small (the index points at the group).
    parquet_row_group_samples: int = 8
    # zstd level 3: 5.5x on action JSON at ~180 MB/s; level 10 costs 4-8x the CPU for <20% more.
    zstd_level: int = 3
    # Carry the capture's first audio track in each clip (False: video only, recorded as a repair).
    audio: bool = True
    # None: clips are the source's packets, remuxed. A spec (formats.transcode, e.g. "h264:256x256:30fps:gop8")
    # re-encodes them; stored in its canonical form so equal specs hash equally.
    transcode: str | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if not 0.5 <= self.clip_seconds <= 3600:
            raise UsageError(f"--clip-seconds must be between 0.5 and 3600, not {self.clip_seconds}")
        if self.shard_size < 1 << 16:
            raise UsageError(f"--shard-size must be at least 64KiB, not {self.shard_size}")
        if self.transcode is not None:
            from dsbuild.formats.transcode import TranscodeSpecError, parse_transcode

            try:
                object.__setattr__(self, "transcode", str(parse_transcode(self.transcode)))
            except TranscodeSpecError as e:
                raise UsageError(f"--transcode: {e}") from None

    def to_json(self) -> dict:
        """The options, plus the encoder and library versions when transcoding: they define the bytes."""
        out = asdict(self)
        if self.transcode is not None:
            from dsbuild.formats.transcode import parse_transcode

            out["transcode_encoder"] = parse_transcode(self.transcode).encoder_settings()
        return out

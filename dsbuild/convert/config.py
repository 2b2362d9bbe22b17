"""The options of a build. Everything in ``ConvertConfig`` changes the output bytes and is hashed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from dsbuild.core.errors import UsageError
from dsbuild.core.records import JsonValue, Record
from dsbuild.formats import format_names

_SIZE_RE = re.compile(r"^\s*(\d{1,20}(?:\.\d{1,20})?)\s*((?:[KMGT]i?)?B?)\s*$", re.IGNORECASE)
MAX_SIZE = 1 << 60  # bytes: an exbibyte; anything larger is a typo
_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}


def parse_size(text: str, flag: str = "--shard-size") -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30, '4096' -> 4096; errors name ``flag``."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"{flag} {str(text)[:40]!r}: not a size", hint="use bytes or a unit, e.g. 256MB or 1GiB")
    unit = (m.group(2) or "").upper().removesuffix("B")
    size = int(Fraction(m.group(1)) * _UNITS[unit])
    if size > MAX_SIZE:
        raise UsageError(f"{flag} {str(text)[:40]!r}: more than {MAX_SIZE:,} bytes")
    return size


@dataclass(frozen=True, slots=True)
class ConvertConfig(Record):
    """Build options that define the output. Worker count, executor and strictness are not here: they
    never change a byte of the result."""

    format: str = "webdataset"
    # ~8 s: long enough for temporal context, short enough that a clip is a cheap random read.
    clip_seconds: float = 8.0
    # A few hundred MB: big sequential reads for object stores, small enough to rewrite incrementally.
    shard_size: int = 256_000_000
    # zstd level 3: 5.5x on action JSON at ~180 MB/s; level 10 costs 4-8x the CPU for <20% more.
    zstd_level: int = 3
    # Game audio is a modality (world models, captioners train on it); --no-audio drops it.
    audio: bool = True
    # None: clips are the source's packets, remuxed. A spec (formats.transcode, e.g. "h264:256x256:30fps:gop8")
    # re-encodes them; stored in its canonical form so equal specs hash equally.
    transcode: str | None = None
    # Derived from ``transcode``: the encoder, its options and library versions (they define the bytes, so
    # they are part of the config hash). Never set by hand.
    transcode_encoder: JsonValue = None

    def __post_init__(self) -> None:
        if self.format not in format_names():
            raise UsageError(f"--format must be one of {', '.join(format_names())}, not {self.format!r}")
        if not (
            isinstance(self.clip_seconds, (int, float))
            and math.isfinite(self.clip_seconds)
            and 0.5 <= self.clip_seconds <= 3600
        ):
            raise UsageError(f"--clip-seconds must be between 0.5 and 3600, not {self.clip_seconds}")
        # 1 and 1.0 are one setting: hashed as given, they named two versions of the same build
        object.__setattr__(self, "clip_seconds", float(self.clip_seconds))
        if self.shard_size < 1 << 16:
            raise UsageError(f"--shard-size must be at least 64KiB, not {self.shard_size}")
        if not 1 <= self.zstd_level <= 22:
            raise UsageError(f"zstd level must be 1..22, not {self.zstd_level}")
        encoder = None
        if self.transcode is not None:
            from dsbuild.formats.transcode import TranscodeSpecError, parse_transcode

            try:
                spec = parse_transcode(self.transcode)
            except TranscodeSpecError as e:
                raise UsageError(f"--transcode: {e}") from None
            object.__setattr__(self, "transcode", str(spec))
            encoder = spec.encoder_settings()
        object.__setattr__(self, "transcode_encoder", encoder)

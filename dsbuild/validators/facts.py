"""What the checks' ``run`` functions see: the version's index rows, lineage.verify's findings, the small
per-sample facts the pass sent back (never sample bytes), and the split set.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from dsbuild.core.errors import UsageError
from dsbuild.lineage.index import IndexRow
from dsbuild.lineage.manifest import Manifest, SessionRecord
from dsbuild.lineage.verify import NOT_A_FILE

# lineage.verify's problem names for a shard whose bytes are not what the manifest records.
SHARD_DAMAGE = ("missing", NOT_A_FILE, "size changed", "altered", "unreadable")


@dataclass(frozen=True, slots=True)
class Usage:
    """How often each control of one sample is active (|value| >= ACTIVE), for the action balance."""

    controls: tuple[str, ...]
    active: tuple[int, ...]
    frames: int


@dataclass(frozen=True, slots=True)
class ClipMeasure:
    """One decoded clip's measurements that dataset checks and plots use (the thresholds are applied
    per sample in the worker; these are the raw values behind them)."""

    decoded: int
    luma_max: float | None
    motion: float | None
    phash: tuple[int, ...] | None
    fps: float | None  # decoded frame rate (frame_rate of the decoded frame times)
    fps_expected: float | None  # frame_rate of the sample's timestamps
    span: float | None  # decoded first frame to the end of the last
    span_expected: float | None  # the same over the sample's timestamps
    frame_seconds: float | None  # the sample's mean frame interval


@dataclass(frozen=True, slots=True)
class SampleFacts:
    key: str
    problems: tuple[tuple[str, str], ...]  # (check name, what is wrong)
    usage: Usage | None = None
    clip: ClipMeasure | None = None
    content: bool = False  # its content was read and decoded (level full)


@dataclass(frozen=True, slots=True)
class UnitResult:
    samples: tuple[SampleFacts, ...]
    unsafe: tuple[tuple[str, str], ...]  # (member or column, why), from the shard's scan


@dataclass(frozen=True)
class SplitData:
    """A split set as the split checks need it: keys per split, and the field that groups them."""

    name: str
    by: str
    keys: dict[str, tuple[str, ...]]  # split -> sample keys


@dataclass
class VersionFacts:
    version_id: str
    level: str
    manifest: Manifest
    rows: list[IndexRow]  # sorted by key as stored
    verify: list[dict] = field(default_factory=list)  # lineage.verify's problems
    samples: list[SampleFacts] = field(default_factory=list)  # sorted by key
    unsafe: list[tuple[str, str]] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)  # (key, why) of samples whose shard is gone
    split: SplitData | None = None
    sessions: list[SessionRecord] = field(default_factory=list)  # sessions.json: what convert dropped, per stream

    @cached_property
    def _by_check(self) -> dict[str, list[tuple[str, str]]]:
        """check -> [(key, details joined)], a sample once per check, in key order."""
        out: dict[str, dict[str, list[str]]] = defaultdict(dict)
        for s in self.samples:
            for check, detail in s.problems:
                details = out[check].setdefault(s.key, [])
                if detail not in details:
                    details.append(detail)
        return {c: [(k, "; ".join(d)) for k, d in per.items()] for c, per in out.items()}

    def split_set(self) -> SplitData:
        """The split set, for a check that needs one (``needs_split``: it is skipped without one)."""
        if self.split is None:
            raise UsageError(f"version {self.version_id[:12]}: this check needs a split set (--split NAME)")
        return self.split

    def offenders(self, check: str) -> list[tuple[str, str]]:
        """(sample key, what is wrong) for every sample the per-sample pass found breaking ``check``."""
        return list(self._by_check.get(check, []))

    def clips(self) -> list[tuple[str, ClipMeasure]]:
        """(key, measurements) of every decoded clip."""
        return [(s.key, s.clip) for s in self.samples if s.clip is not None]

    def bad_shards(self) -> dict[str, str]:
        """shard path -> what is wrong with its bytes (from lineage.verify)."""
        return {
            p["shard"]: p["problem"] + (f" ({p['detail']})" if p.get("detail") else "")
            for p in self.verify
            if "shard" in p and "sample" not in p and p["problem"] in SHARD_DAMAGE
        }

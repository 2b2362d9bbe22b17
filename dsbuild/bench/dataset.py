"""The dataset version a bench measures, described once, so every reader's work is counted the same way.

MB/s counts sample payload (the index's ``bytes``: the sum of a sample's members) for every reader, ours
and the baselines alike: a reader that also reads framing (tar headers, Parquet pages) is not credited for
it. A reader of whole shards (the raw read, the sha256 floor) delivers every sample stored in a shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dsbuild.core.errors import UsageError
from dsbuild.core.records import SHA256, Record, spec

if TYPE_CHECKING:
    from dsbuild.export.source import ExportSource


@dataclass(frozen=True, slots=True)
class DatasetFacts(Record):
    """What was measured: the version and split by identity, and its size (saved with every report)."""

    version_id: str = field(metadata=spec(pattern=SHA256))
    split: str | None
    shard_format: str
    samples: int = field(metadata=spec(minimum=0))
    bytes: int = field(metadata=spec(minimum=0, doc="payload bytes of the split's samples"))
    frames: int = field(metadata=spec(minimum=0))
    shards: int = field(metadata=spec(minimum=0, doc="shards holding the split's samples"))
    shard_bytes: int = field(metadata=spec(minimum=0))
    resolutions: tuple[str, ...]  # WIDTHxHEIGHT, sorted


@dataclass(frozen=True)
class Shard:
    path: Path  # a local file (an object store's shards come through the verified cache)
    bytes: int  # file size
    samples: int  # every sample stored in it (of any split)
    payload: int  # their payload bytes


@dataclass(frozen=True)
class Dataset:
    """The facts plus what the baselines need: the shard files and the split's samples in key order."""

    ref: str  # PATH@VERSION_ID: every measurement reads this exact version
    facts: DatasetFacts
    source: ExportSource  # proven members of the split's samples
    shards: tuple[Shard, ...]
    sizes: dict[str, int]  # key -> payload bytes, every sample of the version
    frames: dict[str, int]  # key -> frames, every sample of the version

    @property
    def bucket_by(self) -> str | None:
        """Frames of several resolutions need buckets unless resized (the loader refuses to mix them)."""
        return "resolution" if len(self.facts.resolutions) > 1 else None

    def items(self) -> list:
        """The split's samples as (ShardRecord, Entry), in key order within shards."""
        return self.source.splits[0].entries()


def check_split(split: str | None) -> None:
    """``--split`` is NAME/SPLIT (or absent)."""
    if split is not None and (split.count("/") != 1 or split.startswith("/") or split.endswith("/")):
        raise UsageError(f"--split {split!r}: use NAME/SPLIT, e.g. main/train")


def describe(ref: str, split: str | None) -> Dataset:
    from dsbuild.export.source import open_source
    from dsbuild.lineage.catalog import parse_ref

    check_split(split)
    source = open_source(ref, split)
    table = source.catalog.index(source.version_id, ["key", "frames", "width", "height"])
    keys = table.column("key").to_pylist()
    frames = dict(zip(keys, table.column("frames").to_pylist()))
    shape = dict(zip(keys, zip(table.column("width").to_pylist(), table.column("height").to_pylist())))
    part = source.splits[0]
    mine = [e.key for e in (e for p in part.parts for e in p.entries)]
    if not mine:
        raise UsageError(f"{ref}{' split ' + split if split else ''}: no samples to measure")
    shards = tuple(
        Shard(
            source.catalog.shard_file(p.shard, proven=True),
            p.shard.bytes,
            len(p.entries) + len(p.foreign),
            sum(source.sizes[e.key] for e in (*p.entries, *p.foreign)),
        )
        for p in part.parts
    )
    facts = DatasetFacts(
        version_id=source.version_id,
        split=split,
        shard_format=source.manifest.shard_format,
        samples=len(mine),
        bytes=sum(source.sizes[k] for k in mine),
        frames=sum(frames[k] for k in mine),
        shards=len(shards),
        shard_bytes=sum(s.bytes for s in shards),
        resolutions=tuple(f"{w}x{h}" for w, h in sorted({shape[k] for k in mine})),
    )
    return Dataset(f"{parse_ref(ref)[0]}@{source.version_id}", facts, source, shards, dict(source.sizes), frames)

"""The dataset version a bench measures, described once: identity, shards, per-sample bytes and frames.

Every measurement (ours and the baselines) counts work against this one description, so samples/s, frames/s
and MB/s mean the same thing for all of them: MB are the bytes a sample occupies in its shard (tar framing
included; Parquet: the sample's bytes as the index records them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ShardFacts:
    path: Path
    size: int
    samples: int  # every sample of the version stored in it
    frames: int


@dataclass(frozen=True)
class Dataset:
    ref: str
    split: str | None
    version_id: str
    shard_format: str
    samples: int  # in the split (or version)
    resolutions: tuple[tuple[int, int], ...]  # (width, height)
    sample_bytes: dict[str, int]  # key -> bytes, for every sample of the version
    shards: tuple[ShardFacts, ...]  # the shards holding the split's samples, in index order

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def bucket_by(self) -> str | None:
        """Frames of several resolutions need buckets unless resized (the loader refuses to mix them)."""
        return "resolution" if len(self.resolutions) > 1 else None

    def to_json(self) -> dict:
        return {"ref": self.ref, "split": self.split, "version_id": self.version_id, "format": self.shard_format,
                "samples": self.samples, "shards": len(self.shards), "shard_bytes": self.bytes,
                "resolutions": [f"{w}x{h}" for w, h in self.resolutions]}


def describe(ref: str, split: str | None) -> Dataset:
    from dsbuild.lineage.catalog import parse_ref
    from dsbuild.lineage.index import read_index
    from dsbuild.loader.source import Source

    src = Source(ref, split, verify=False).open()
    try:
        table = read_index(src.catalog.version_dir(src.version_id) / src.manifest.index["path"],
                           columns=["key", "shard", "length", "bytes", "frames"])
    finally:
        src.close()
    col = {c: table[c].to_numpy() for c in ("length", "bytes", "frames")}
    keys = table["key"].to_pylist()
    sizes = np.where(col["length"] >= 0, col["length"], col["bytes"])
    names, which = np.unique(np.array(table["shard"].to_pylist()), return_inverse=True)
    counts = np.bincount(which, minlength=len(names))
    frames = np.bincount(which, weights=col["frames"], minlength=len(names))
    slot = {str(n): i for i, n in enumerate(names)}
    facts = []
    for rel in src.shards:
        path = src.catalog.root / rel
        facts.append(ShardFacts(path, path.stat().st_size, int(counts[slot[rel]]), int(frames[slot[rel]])))
    pinned = f"{parse_ref(ref)[0]}@{src.version_id}"  # every measurement reads this exact version
    return Dataset(ref=pinned, split=split, version_id=src.version_id, shard_format=src.format, samples=len(src),
                   resolutions=tuple(sorted({(int(w), int(h)) for w, h in zip(src.width, src.height)})),
                   sample_bytes=dict(zip(keys, (int(s) for s in sizes))), shards=tuple(facts))

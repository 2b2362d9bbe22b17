"""Assembling shards from samples: the deterministic step between per-session work and the commit.

Every sample of the new version is a ``SampleRef``: either a segment a worker just wrote, or a sample
of a parent version's shard (reused: its session did not change). Sorted by key they are cut into
shards by ``formats.shards.plan_shards``; a planned shard whose exact samples (keys and hashes) form a
healthy shard of the parent is taken as it is, every other one is written by an assembly task (byte
copies of segments; reused samples are re-proven against their sample hash on the way).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import FormatError, LineageError
from dsbuild.formats import Entry, Segment, get_format
from dsbuild.formats.shards import WrittenShard, plan_shards, write_shard
from dsbuild.lineage.manifest import ShardRecord


@dataclass(frozen=True)
class SampleRef:
    """Where one sample's bytes are: a fresh segment (``seg_path``) or a parent shard (``parent``)."""

    key: str
    sha256: str
    member_bytes: tuple[int, ...]
    seg_path: Path | None = None
    seg_offset: int = 0
    seg_length: int = 0
    parent: ShardRecord | None = None
    entry: Entry | None = None


@dataclass(frozen=True)
class ShardTask:
    number: int
    format: str
    refs: tuple[SampleRef, ...]
    out: Path
    parent_files: tuple[tuple[str, Path], ...]  # parent shard key -> a local file holding it


@dataclass(frozen=True)
class ShardPlan:
    """The version's shards in order: each is reused from the parent (``reuse``) or to be written."""

    groups: tuple[tuple[SampleRef, ...], ...]
    reuse: tuple[ShardRecord | None, ...]


def plan(refs: list[SampleRef], fmt, target: int, parent_shards: dict[tuple, ShardRecord]) -> ShardPlan:
    """Cut the sorted samples into shards and match each against the parent's healthy shards.

    ``parent_shards``: the composition (tuple of (key, sha256) in order) of each healthy parent shard."""
    refs = sorted(refs, key=lambda r: r.key)
    groups, reuse = [], []
    sizes = [fmt.planned_size(r.member_bytes) for r in refs]
    for rng in plan_shards([r.key for r in refs], sizes, target, fmt.max_overhead):
        group = tuple(refs[i] for i in rng)
        groups.append(group)
        reuse.append(parent_shards.get(tuple((r.key, r.sha256) for r in group)))
    return ShardPlan(tuple(groups), tuple(reuse))


def _segments(task: ShardTask):
    fmt = get_format(task.format)
    files = dict(task.parent_files)
    readers = {}
    try:
        for ref in task.refs:
            if ref.seg_path is not None:
                with open(ref.seg_path, "rb") as f:
                    data = os.pread(f.fileno(), ref.seg_length, ref.seg_offset)
                if len(data) != ref.seg_length:
                    raise LineageError(f"{ref.seg_path}: segment of {ref.key} is truncated")
                yield Segment(ref.key, ref.sha256, data, ref.member_bytes)
                continue
            path = files[ref.parent.path]
            reader = readers.get(path)
            if reader is None:
                reader = readers[path] = fmt.reader(path)
            try:
                yield reader.verified_segment(ref.entry, fmt)
            except FormatError as e:
                raise LineageError(f"{ref.parent.path}: {e}",
                                   hint="run the convert again with --rehash: damaged shards are then "
                                        "rewritten from the captures") from None
    finally:
        for r in readers.values():
            r.close()


def assemble_shard(task: ShardTask) -> WrittenShard:
    """Write one planned shard (runs in a worker)."""
    return write_shard(get_format(task.format), _segments(task), task.out)

"""Assembling shards from samples: the deterministic step between per-session work and the commit.

Every sample of the new version is a ``SampleRef``: either a segment a worker just wrote, or a sample
of a parent version's shard (reused: its session did not change). Sorted by key they are cut into
shards by ``formats.shards.ShardCutter``; a planned shard whose exact samples (keys and hashes) form a
healthy shard of the parent is taken as it is, every other one is written by an assembly task (byte
copies of segments; reused samples are re-proven against their sample hash on the way). ``Assembly``
makes that plan while sessions are still being processed, so shards are written beside them.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import FormatError, LineageError
from dsbuild.formats import Entry, Segment, get_format
from dsbuild.formats.base import ShardReader
from dsbuild.formats.shards import ShardCutter, WrittenShard, write_shard
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


class Assembly:
    """The shard plan, made while sessions finish: the same shards as cutting all samples at once.

    Samples known from the start (``known``: reused from the parent) and those of each pending session as
    it finishes (``add``) enter the sorted sequence once no unfinished session can hold an earlier key:
    every key starts with its session's prefix (``pending``), so everything below the smallest pending
    prefix is final. Each shard the cutter closes is taken from the parent when its exact samples (keys
    and hashes) form a healthy parent shard (``parent_shards``), else returned as a task to run. Once
    every sample of a segment file is in a written or reused shard (``release``), the file is deleted:
    a build stages a few sessions' samples on disk, not the whole version.
    """

    def __init__(
        self,
        pending: Iterable[str],
        known: Iterable[SampleRef],
        fmt,
        format_name: str,
        target: int,
        parent_shards: dict[tuple, ShardRecord],
        out_dir: Path,
        shard_file: Callable[[ShardRecord], Path],
    ):
        self._fmt, self._format, self._out_dir, self._shard_file = fmt, format_name, out_dir, shard_file
        self._parent_shards = parent_shards
        self._cutter = ShardCutter(target, fmt.max_overhead)
        self._pending = list(pending)
        heapq.heapify(self._pending)
        self._finished: Counter[str] = Counter()  # prefixes finished but still in the heap
        self._held: list[tuple[str, int, SampleRef]] = []  # finished samples not yet in the sequence
        self._arrival = itertools.count()  # (ties in the heap never compare two refs)
        self._sequence: list[SampleRef] = []
        self._staged: Counter[Path] = Counter()  # segment file -> its samples in no written shard yet
        self.groups: list[tuple[SampleRef, ...]] = []
        self.reuse: list[ShardRecord | None] = []
        self._hold(known)

    def _hold(self, refs: Iterable[SampleRef]) -> None:
        for ref in refs:
            heapq.heappush(self._held, (ref.key, next(self._arrival), ref))
            if ref.seg_path is not None:
                self._staged[ref.seg_path] += 1

    def add(self, refs: Iterable[SampleRef], finished: str) -> list[ShardTask]:
        """The samples of the pending session whose prefix is ``finished``; the shard tasks that completes."""
        self._hold(refs)
        self._finished[finished] += 1
        while self._pending and self._finished[self._pending[0]]:
            self._finished[heapq.heappop(self._pending)] -= 1
        return self._advance()

    def _advance(self) -> list[ShardTask]:
        """Move every held sample below the smallest pending prefix into the sequence, in key order."""
        bound = self._pending[0] if self._pending else None
        tasks = []
        while self._held and (bound is None or self._held[0][0] < bound):
            ref = heapq.heappop(self._held)[2]
            self._sequence.append(ref)
            tasks += [
                t
                for r in self._cutter.add(ref.key, self._fmt.planned_size(ref.member_bytes))
                if (t := self._close(r)) is not None
            ]
        return tasks

    def finish(self) -> list[ShardTask]:
        """The remaining shard tasks, once every pending session has been added."""
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} sessions were never added")
        return self._advance() + [t for r in self._cutter.finish() if (t := self._close(r)) is not None]

    def _close(self, rng: range) -> ShardTask | None:
        group = tuple(self._sequence[i] for i in rng)
        number = len(self.groups)
        self.groups.append(group)
        reuse = self._parent_shards.get(tuple((r.key, r.sha256) for r in group))
        self.reuse.append(reuse)
        if reuse is not None:
            self.release(group)
            return None
        parents = {r.parent.path: r.parent for r in group if r.parent is not None}
        return ShardTask(
            number,
            self._format,
            group,
            self._out_dir / f"shard-{number:06d}.{self._fmt.ext}.part",
            tuple(sorted((k, self._shard_file(rec)) for k, rec in parents.items())),
        )

    def release(self, group: tuple[SampleRef, ...]) -> None:
        """The group's samples are in their shard: delete each segment file none of whose samples wait."""
        for ref in group:
            if ref.seg_path is not None:
                self._staged[ref.seg_path] -= 1
                if not self._staged[ref.seg_path]:
                    del self._staged[ref.seg_path]
                    ref.seg_path.unlink(missing_ok=True)

    @property
    def plan(self) -> ShardPlan:
        return ShardPlan(tuple(self.groups), tuple(self.reuse))


def _segments(task: ShardTask):
    fmt = get_format(task.format)
    files = dict(task.parent_files)
    readers: dict[Path, ShardReader] = {}
    try:
        for ref in task.refs:
            if ref.seg_path is not None:
                with open(ref.seg_path, "rb") as f:
                    data = os.pread(f.fileno(), ref.seg_length, ref.seg_offset)
                if len(data) != ref.seg_length:
                    raise LineageError(f"{ref.seg_path}: segment of {ref.key} is truncated")
                yield Segment(ref.key, ref.sha256, data, ref.member_bytes)
                continue
            if ref.parent is None or ref.entry is None:
                raise LineageError(f"sample {ref.key}: planned with neither a fresh segment nor a parent shard")
            path = files[ref.parent.path]
            reader = readers.get(path)
            if reader is None:
                reader = readers[path] = fmt.reader(path)
            try:
                yield reader.verified_segment(ref.entry, fmt)
            except FormatError as e:
                raise LineageError(
                    f"{ref.parent.path}: {e}",
                    hint="run the convert again with --rehash: damaged shards are then rewritten from the captures",
                ) from None
    finally:
        for r in readers.values():
            r.close()


def assemble_shard(task: ShardTask) -> WrittenShard:
    """Write one planned shard (runs in a worker)."""
    return write_shard(get_format(task.format), _segments(task), task.out)

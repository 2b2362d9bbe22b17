"""What every shard writer shares: rollover at a size target, hashing while writing, the sample index.

A format subclasses ``ShardWriter`` with three hooks (open a file, append one sample and return where it
went, finish the file). Shards are written to temporary names; the catalog renames them to their sha256
at commit, which is what makes them content-addressed and shareable between versions.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from dsbuild.errors import StorageError

from dsbuild.formats.sample import Sample
from dsbuild.lineage.hashing import HashingWriter


@dataclass(frozen=True)
class IndexEntry:
    """Where one sample lives inside its shard: a byte range (tar) or a row group and row (Parquet)."""

    key: str
    sha256: str
    offset: int = -1
    length: int = -1
    row_group: int = -1
    row: int = -1


@dataclass(frozen=True)
class WrittenShard:
    tmp_path: Path
    sha256: str
    bytes: int
    entries: tuple[IndexEntry, ...]


class ShardWriter(ABC):
    """Writes samples into shard files of at most ~``max_bytes`` each (a sample is never split)."""

    ext: str = ""

    def __init__(self, tmp_dir: Path, stem: str, max_bytes: int):
        self.tmp_dir = tmp_dir
        self.stem = stem
        self.max_bytes = max_bytes
        self.shards: list[WrittenShard] = []
        self._file = None
        self._hasher: HashingWriter | None = None
        self._path: Path | None = None
        self._entries: list[IndexEntry] = []
        self._size = 0

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Output failures (ENOSPC, EROFS, EIO...) stop the build; they are never the capture's fault."""
        try:
            yield
        except OSError as e:
            raise StorageError(f"cannot write shard {self._path or self.tmp_dir}: {e.strerror or e}") from None

    def add(self, sample: Sample, members: list[tuple[str, bytes]], sha256: str) -> None:
        with self._writing():
            self._add(sample, members, sha256)

    def _add(self, sample: Sample, members: list[tuple[str, bytes]], sha256: str) -> None:
        size = sum(len(p) for _, p in members)
        if self._file is not None and self._entries and self._size + size > self.max_bytes:
            self._roll()
        if self._file is None:
            self._path = self.tmp_dir / f"{self.stem}-{len(self.shards):05d}.{self.ext}.part"
            self._file = open(self._path, "wb")
            self._hasher = HashingWriter(self._file)
            self._size = 0
            self._begin()
        self._entries.append(self._append(sample, members, sha256))
        self._size += size

    def close(self) -> list[WrittenShard]:
        if self._file is not None:
            with self._writing():
                self._roll()
        return self.shards

    def abort(self) -> None:
        """Drop everything written: a quarantined session leaves no files behind."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # flushing a doomed file can fail again (disk full); it is deleted next
            self._file = None
        for path in [self._path] + [s.tmp_path for s in self.shards]:
            if path is not None:
                path.unlink(missing_ok=True)
        self.shards = []

    def _roll(self) -> None:
        self._finish()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.shards.append(WrittenShard(self._path, self._hasher.hexdigest(), self._hasher.tell_bytes,
                                        tuple(self._entries)))
        self._file = None
        self._entries = []

    @property
    def out(self) -> HashingWriter:
        return self._hasher

    def _begin(self) -> None:
        """Hook: called after a new shard file is opened."""

    @abstractmethod
    def _append(self, sample: Sample, members: list[tuple[str, bytes]], sha256: str) -> IndexEntry: ...

    @abstractmethod
    def _finish(self) -> None: ...

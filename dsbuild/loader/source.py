"""A version (or one split of it) as the loader sees it: an index in columns, and random-access reads.

The index is held as numpy columns (the per-sample locators: shard, byte range or row group/row, and
the shape facts planning needs). Reads are positional (``os.pread`` on cached descriptors, one
small Parquet row group), so any thread may read any sample and nothing depends on read order.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.formats.sample import members_sha256
from dsbuild.lineage.catalog import Catalog, open_ref
from dsbuild.lineage.index import LOCATOR_COLUMNS, read_index

COLUMNS = [*LOCATOR_COLUMNS, "frames", "width", "height"]


@dataclass(frozen=True)
class RawSample:
    """A sample's canonical members by extension (``json``, ``mp4``, ``actions.npy``...), as bytes-like
    objects (memoryviews into the sample's bytes for tar shards)."""

    key: str
    members: dict[str, bytes]


class BufferPool:
    """Reusable read buffers. A fresh 10 MB ``bytes`` per sample costs page faults on every read (the
    allocator hands big blocks back to the OS), which halves throughput on page-cached shards. A buffer
    is reused only when nothing references it any more — no delivered sample can change under a user
    who keeps it: a live memoryview (even a slice of a slice) holds a reference to its bytearray."""

    IDLE_REFS = 3  # the pool's list, the local name in ``take`` and getrefcount's argument

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> bytearray:
        with self._lock:
            for k in range(len(self._buffers)):
                buf = self._buffers[k]
                if len(buf) >= n and sys.getrefcount(buf) <= self.IDLE_REFS:
                    del self._buffers[k]  # by position: list.remove would compare contents
                    return buf
        return bytearray(-(-n // (1 << 20)) << 20)  # whole MiBs, so buffers fit many samples

    def give(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._buffers) < self.keep:
                self._buffers.append(buf)


class Source:
    """One dataset reference (``PATH[@VERSION]``) and optional split (``NAME/SPLIT``)."""

    def __init__(self, ref: str, split: str | None = None, *, verify: bool = True):
        self.ref = ref
        self.split = split
        self.verify = verify
        self._opened = False

    # -- opening (not in the constructor: constructors only store) --------------------------------
    def open(self) -> "Source":
        if self._opened:
            return self
        catalog, version = open_ref(self.ref)
        self.catalog: Catalog = catalog
        self.version_id = version
        self.manifest = catalog.manifest(version)
        table = read_index(catalog.version_dir(version) / self.manifest.index["path"], columns=COLUMNS)
        if self.split:
            from dsbuild.split import load_split

            keys = load_split(catalog, version, self.split).column("key")
            table = table.filter(pc.is_in(table["key"], value_set=keys))
        if table.num_rows == 0:
            raise UsageError(f"{self.ref}{' split ' + self.split if self.split else ''}: no samples")
        self._load(table)
        self.controls = list(self.manifest.vocabulary["controls"])
        self.channels = list(self.manifest.vocabulary["telemetry"])
        self.format = self.manifest.shard_format
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._row_groups: OrderedDict = OrderedDict()
        self._pool = BufferPool()
        self._opened = True
        return self

    def _load(self, table: pa.Table) -> None:
        shards = table["shard"].to_pylist()
        self.shards = sorted(set(shards))
        known = {s.path for s in self.manifest.shards}  # never follow an index entry out of the catalog
        if stray := [s for s in self.shards if s not in known]:
            raise FormatError(f"{self.ref}: index names shards the manifest does not hold: {stray[:3]}")
        pos = {s: i for i, s in enumerate(self.shards)}
        self.shard_id = np.array([pos[s] for s in shards], dtype=np.int32)
        self.keys = table["key"].to_pylist()
        self.sha256 = table["sha256"].to_pylist()
        col = {c: table[c].to_numpy() for c in ("offset", "length", "row_group", "row", "frames", "width", "height")}
        self.offset, self.length = col["offset"], col["length"]
        self.row_group, self.row = col["row_group"], col["row"]
        self.frames, self.width, self.height = col["frames"], col["width"], col["height"]

    def __len__(self) -> int:
        return len(self.keys)

    def identity(self) -> dict:
        return {"ref": self.ref.rpartition("@")[0] or self.ref, "version_id": self.version_id, "split": self.split}

    # -- reading ---------------------------------------------------------------------------------
    def _fd(self, shard: int) -> int:
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                path = self.catalog.shard_file(self.shards[shard])  # remote: a verified cached copy
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError as e:
                    raise FormatError(f"{path}: cannot open shard ({e.strerror})") from None
                self._fds[shard] = fd
            return fd

    def read_bytes(self, i: int) -> memoryview:
        """The raw byte range of sample ``i`` (tar shards), in a pooled buffer (see ``BufferPool``)."""
        n = int(self.length[i])
        buf = self._pool.take(n)
        view = memoryview(buf)[:n]
        got = os.preadv(self._fd(int(self.shard_id[i])), [view], int(self.offset[i]))
        self._pool.give(buf)  # reusable again once every view of it is gone
        if got != n:
            raise FormatError(f"{self.keys[i]}: shard is truncated ({got} of {n} bytes)")
        return view

    def read(self, i: int) -> RawSample:
        """Sample ``i`` with its members; raises FormatError if it is damaged (hash, tar or Parquet)."""
        key = self.keys[i]
        if self.format == "webdataset":
            from dsbuild.formats.webdataset import parse_members

            # Views into the one buffer read for this sample: no per-member copies on the hot path.
            pairs = [(name.split(".", 1)[1], payload)
                     for name, payload in parse_members(self.read_bytes(i), key, views=True)]
        else:
            pairs = self._parquet_members(i)
        if self.verify and members_sha256(pairs) != self.sha256[i]:
            raise FormatError(f"{key}: sample bytes do not match their hash (damaged shard?)")
        return RawSample(key, dict(pairs))

    def _parquet_members(self, i: int) -> list[tuple[str, bytes]]:
        import pyarrow.parquet as pq

        from dsbuild.formats.parquet import row_arrays
        from dsbuild.formats.sample import npy_bytes

        slot = (int(self.shard_id[i]), int(self.row_group[i]))
        with self._lock:
            table = self._row_groups.get(slot)
        if table is None:
            try:
                table = pq.ParquetFile(self.catalog.shard_file(self.shards[slot[0]])).read_row_group(slot[1])
            except (OSError, pa.ArrowException) as e:
                raise FormatError(f"{self.keys[i]}: cannot read row group ({e})") from None
            with self._lock:
                self._row_groups[slot] = table
                while len(self._row_groups) > 8:
                    self._row_groups.popitem(last=False)
        row = table.slice(int(self.row[i]), 1).to_pylist()[0]
        if row["key"] != self.keys[i]:
            raise FormatError(f"{self.keys[i]}: index points at row of {row['key']}")
        actions, telemetry, timestamps = row_arrays(row)
        return [("json", row["meta"].encode()), (row["video_ext"], row["video"]),
                ("actions.npy", npy_bytes(actions)), ("telemetry.npy", npy_bytes(telemetry)),
                ("timestamps.npy", npy_bytes(timestamps)), ("events.jsonl.zst", row["events"])]

    def close(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)
        self._fds = {}

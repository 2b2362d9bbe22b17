"""A version (or one split of it) as the loader sees it: its index as numpy columns, checked at open.

Opening proves the index against the manifest's pin (``Catalog.index``), keeps only the columns the
loader needs, and refuses an index that could make a reader misbehave: a duplicated key (one sample
delivered twice, another never), a byte range outside its shard (a length of 2^40 would otherwise be
a MemoryError), overlapping ranges, member sizes that do not fit their sample, or array members too
small for the shapes the index gives. Session fields (title, player, conditions) come from the index
once per session, so batches carry them without parsing any sample's JSON. What opening derives is kept
for the machine under the index and session records' file identities (``core.hashcache``): the next open
of the unchanged files, by another rank, worker or job, takes it without reading the Parquet.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
from blake3 import blake3

from dsbuild.core import hashcache
from dsbuild.core.arrow import array, to_numpy
from dsbuild.core.errors import FormatError, UsageError
from dsbuild.formats import Entry, get_format
from dsbuild.formats.sample import ARRAY_MEMBERS, KEY_PATTERN, MEMBERS
from dsbuild.formats.video import MAX_PIXELS
from dsbuild.lineage.catalog import Catalog, open_ref
from dsbuild.lineage.index import LOCATOR_COLUMNS
from dsbuild.lineage.manifest import ShardRecord
from dsbuild.loader.layout import lay_out, read_batch, write_batch
from dsbuild.loader.state import SourceId

SESSION_COLUMNS = ("session_id", "title", "player", "platform", "conditions")
# The samples' hashes, read only when a sample is checked against its own (``Source.sha256``): two columns
# of 64 hex digits were half of the index's read at open.
HASH_COLUMNS = ("sha256", "blake3")
COLUMNS = [
    *(c for c in LOCATOR_COLUMNS if c not in HASH_COLUMNS),
    *SESSION_COLUMNS,
    "frames",
    "fps",
    "width",
    "height",
    "codec",
    "has_audio",
    "n_controls",
    "n_channels",
]
# What opening derives from the index and session records, kept per machine (``Source._derived``):
# DERIVED_FORMAT changes whenever opening derives or checks anything new, so that no note of an older
# open is taken.
DERIVED_FORMAT = 2
MAX_DERIVED = 64 << 20  # bytes (about 250,000 samples): a larger index is derived by every open
DERIVED_ARRAYS = (
    "shard_id",
    "shard_bytes",
    "byte_offset",
    "byte_length",
    "row_group",
    "row_index",
    "member_bytes",
    "payload_offsets",
    "sample_bytes",
    "frames",
    "width",
    "height",
    "n_controls",
    "n_channels",
    "fps",
    "has_audio",
    "codec_id",
    "session_code",
    "session_first",
)
# The array members' dtypes (``formats.sample.Sample``): actions, telemetry float32; timestamps float64.
ARRAY_DTYPES: tuple[np.dtype, np.dtype, np.dtype] = (np.dtype("<f4"), np.dtype("<f4"), np.dtype("<f8"))


def _kept_rows(mask, held: int):
    """The split's rows of the index (a boolean Arrow array) from the kept numpy mask, which must hold
    ``held`` of them (built from the buffer: ``pyarrow.array`` would import pandas)."""
    import pyarrow as pa

    if not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.ndim != 1 or int(mask.sum()) != held:
        raise ValueError("the kept rows are not a boolean mask of the split's samples")
    return array(mask, pa.bool_())


@dataclass(frozen=True)
class Session:
    """One capture session's fields, as every sample of it carries them."""

    session_id: str
    title: str
    player: str
    platform: str | None
    conditions: dict[str, str]
    controls: tuple[str, ...]
    channels: tuple[str, ...]


class Source:
    """One dataset reference (``PATH[@VERSION]``) and optional split (``NAME/SPLIT``)."""

    shards: list[ShardRecord]
    sessions: list[Session]

    def __init__(self, ref: str, split: str | None = None):
        self.ref = str(ref)
        self.split = split
        self._opened = False
        self._hashes: tuple[list[str], list[str | None]] | None = None
        self._hashes_lock = threading.Lock()
        self._kept = None  # with a split: which index rows it holds (a boolean Arrow array)

    def open(self) -> Source:
        if self._opened:
            return self
        catalog, version = open_ref(self.ref)
        self.catalog: Catalog = catalog
        self.version_id = version
        self.manifest = catalog.manifest(version)
        self.format = get_format(self.manifest.shard_format)
        split_set, part = self._split_set() if self.split else (None, "")
        self.split_hash = None if split_set is None else split_set.hash
        began, where = time.time_ns(), self._derived_key()
        kept = None if where is None else hashcache.noted(where[0][0], where[1])
        self.from_cache = kept is not None and self._restore(kept)  # (a damaged note: derived again)
        if not self.from_cache:
            table = catalog.index(version, COLUMNS)
            if split_set is not None:
                self._kept = self._split_rows(table, split_set, part)
                table = table.filter(self._kept)
            if table.num_rows == 0:
                raise UsageError(f"{self.ref}{' split ' + self.split if self.split else ''}: no samples")
            self._columns(table)
            self._sessions(table)
            self._check()
            if (
                where is not None
                and self._derived_key() == where
                and all(hashcache.settled(i, began) for i in where[0])
            ):
                derived = self._derived()
                if len(derived) <= MAX_DERIVED:
                    hashcache.note(where[0][0], where[1], derived)
        self._opened = True
        return self

    def _derived_key(self) -> tuple[tuple[hashcache.Identity, hashcache.Identity], str] | None:
        """((index file's identity, session records file's identity), kind): where the machine keeps what
        opening derives from them (``_derived``), for this split and this code's ``DERIVED_FORMAT``; None
        for a remote catalog (its files have no local identity)."""
        if self.catalog.root is None:
            return None
        folder = self.catalog.root / "versions" / self.version_id
        try:
            index, sessions = (
                hashcache.identity(os.stat(folder / p.path)) for p in (self.manifest.index, self.manifest.sessions)
            )
        except OSError:
            return None  # (opening the index names what is missing)
        kind = (
            f"opened {DERIVED_FORMAT} {self.version_id} {self.split} {self.split_hash} {' '.join(map(str, sessions))}"
        )
        return (index, sessions), kind

    def _derived(self) -> bytes:
        """What opening derived from the index and session records, checked, in one block (``layout``),
        behind a BLAKE3 of it."""
        fields = {name: getattr(self, name) for name in DERIVED_ARRAYS}
        fields.update(
            kept=None if self._kept is None else to_numpy(self._kept),
            keys=["\n".join(self.keys.tolist()).encode()],
            shards=[s.path for s in self.shards],
            codecs=self.codecs,
            byte_range=self.byte_range,
            sessions=[list(dataclasses.astuple(s)) for s in self.sessions],
        )
        header, payloads, size = lay_out(fields, {})
        block = np.zeros(size, np.uint8)
        write_batch(block, header, payloads)
        body = block.tobytes()
        return blake3(body).digest() + body

    def _restore(self, data: bytes) -> bool:
        """Take what ``_derived`` kept; False (nothing taken) where it does not hash to its digest or does
        not parse (a damaged cache is derived again, never used)."""
        digest, body = data[:32], bytearray(data[32:])  # (writable: its arrays are taken as they lie)
        if len(data) < 40 or blake3(body).digest() != digest:
            return False
        block = np.frombuffer(body, np.uint8)
        try:
            fields, _ = read_batch(block)
            records = {s.path: s for s in self.manifest.shards}
            shards = [records[path] for path in fields["shards"]]
            keys = bytes(fields["keys"][0]).decode().split("\n")
            rows = fields["sessions"]
            sessions = [Session(a, b, c, d, dict(e), tuple(f), tuple(g)) for a, b, c, d, e, f, g in rows]
            kept = None if fields["kept"] is None else _kept_rows(fields["kept"], len(keys))
        except (ValueError, KeyError, TypeError, IndexError):
            return False
        self.keys = np.asarray(keys, dtype=object)
        self.shards, self.codecs, self.byte_range, self.sessions = (
            shards,
            fields["codecs"],
            fields["byte_range"],
            sessions,
        )
        for name in DERIVED_ARRAYS:
            setattr(self, name, fields[name])
        self._kept = kept
        return True

    def _split_set(self):
        from dsbuild.lineage.splitsets import open_split_set

        name, slash, part = self.split.partition("/")
        if not slash or not name or not part:
            raise UsageError(f"split {self.split!r}: use NAME/SPLIT, e.g. main/train")
        return open_split_set(self.catalog, self.version_id, name), part

    def _split_rows(self, table, split_set, part: str):
        import pyarrow.compute as pc

        keys = split_set.table(part, ["key"]).column("key")
        kept = pc.is_in(table["key"], value_set=keys)
        if (held := pc.sum(kept).as_py() or 0) != len(keys):
            raise FormatError(
                f"{split_set.path}: split {part} names {len(keys) - held} sample(s) the version does not hold"
            )
        return kept

    def _columns(self, table) -> None:
        import pyarrow.compute as pc

        well_formed = pc.match_substring_regex(table["key"], f"^{KEY_PATTERN}$")
        if not pc.all(well_formed).as_py() and table.num_rows:  # (a forged index's keys: 30-MB or `../` names)
            bad = table["key"][int(pc.index(well_formed, False).as_py())].as_py()
            raise FormatError(
                f"{self.ref}: index key {bad[:64]!r} is not a sample key",
                hint="the version is damaged or forged; run `dsbuild verify`",
            )
        self.keys = np.asarray(table["key"].to_pylist(), dtype=object)
        records = {s.path: s for s in self.manifest.shards}
        shard_col = pc.dictionary_encode(table["shard"]).combine_chunks()
        names = shard_col.dictionary.to_pylist()
        if stray := [s for s in names if s not in records]:  # never follow an index entry out of the catalog
            raise FormatError(f"{self.ref}: index names shards the manifest does not hold: {stray[:3]}")
        self.shards = [records[s] for s in names]
        self.shard_id = to_numpy(shard_col.indices).astype(np.int32)
        self.shard_bytes = np.array([s.bytes for s in self.shards], dtype=np.int64)
        self.byte_range = table["byte_offset"].null_count == 0 and table["byte_length"].null_count == 0
        if not self.byte_range and (table["row_group"].null_count or table["row_index"].null_count):
            raise FormatError(f"{self.ref}: index rows give neither a byte range nor a row for every sample")
        self.byte_offset, self.byte_length, self.row_group, self.row_index = (
            to_numpy(table[c], null=-1).astype(np.int64)
            for c in ("byte_offset", "byte_length", "row_group", "row_index")
        )
        mb = table["member_bytes"]
        self.member_bytes: np.ndarray | None = None  # [samples, members]; None where the index lacks them
        self.payload_offsets: np.ndarray | None = None  # set by ``_check_ranges`` for formats that slice
        if mb.null_count == 0:
            widths = to_numpy(pc.list_value_length(mb))
            if np.any(widths != len(MEMBERS)):
                bad = int(np.flatnonzero(widths != len(MEMBERS))[0])
                raise FormatError(f"{self.keys[bad]}: index lists {widths[bad]} member sizes, not {len(MEMBERS)}")
            self.member_bytes = to_numpy(pc.list_flatten(mb)).astype(np.int64).reshape(-1, len(MEMBERS))
        # the bytes a sample's read costs, for the stats: its range, or (rows of Parquet) its members
        self.sample_bytes = (
            self.byte_length
            if self.byte_range
            else self.member_bytes.sum(axis=1)
            if self.member_bytes is not None
            else np.zeros(len(self.keys), np.int64)
        )
        self.frames, self.width, self.height, self.n_controls, self.n_channels = (
            to_numpy(table[c]).astype(np.int64) for c in ("frames", "width", "height", "n_controls", "n_channels")
        )
        self.fps = to_numpy(table["fps"], null=0.0)
        self.has_audio = to_numpy(table["has_audio"], null=False)
        codec = pc.dictionary_encode(table["codec"]).combine_chunks()
        self.codec_id, self.codecs = to_numpy(codec.indices), codec.dictionary.to_pylist()

    def _sessions(self, table) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        enc = pc.dictionary_encode(table["session_id"]).combine_chunks()
        self.session_code = to_numpy(enc.indices).astype(np.int32)
        _, self.session_first = np.unique(self.session_code, return_index=True)  # session -> its first sample
        rows = table.select(list(SESSION_COLUMNS)).take(array(self.session_first, pa.int64())).to_pylist()
        vocab = {s.session_id: s for s in self.catalog.session_columns(self.version_id).sessions}
        self.sessions = []
        for row in rows:
            rec = vocab.get(row["session_id"])
            if rec is None:
                raise FormatError(f"{self.ref}: index session {row['session_id']!r} is not in the manifest")
            self.sessions.append(
                Session(
                    row["session_id"],
                    row["title"],
                    row["player"],
                    row["platform"],
                    dict(row["conditions"] or ()),
                    rec.controls,
                    rec.telemetry,
                )
            )

    def _check(self) -> None:
        """Refuse an index that could deliver a sample twice, read outside a shard, or mis-shape arrays."""
        n = len(self.keys)
        if len(set(self.keys.tolist())) != n:
            seen: set[str] = set()
            for dup in self.keys.tolist():
                if dup in seen:
                    raise FormatError(
                        f"{self.ref}: the index lists sample {dup} more than once", hint="run `dsbuild verify`"
                    )
                seen.add(dup)
        widths = (
            np.array([len(s.controls) for s in self.sessions]),
            np.array([len(s.channels) for s in self.sessions]),
        )
        for col, w, what in ((self.n_controls, widths[0], "controls"), (self.n_channels, widths[1], "channels")):
            if np.any(col != w[self.session_code]):
                bad = int(np.flatnonzero(col != w[self.session_code])[0])
                raise FormatError(
                    f"{self.keys[bad]}: index gives {col[bad]} {what}, its session has {w[self.session_code[bad]]}"
                )
        if np.any(self.frames < 1):
            raise FormatError(f"{self.keys[int(np.argmin(self.frames))]}: index gives no frames")
        pixels = (self.width < 1) | (self.height < 1) | (self.width * self.height > MAX_PIXELS)
        if np.any(pixels):  # frame buffers are sized from it before anything is decoded
            i = int(np.flatnonzero(pixels)[0])
            raise FormatError(
                f"{self.keys[i]}: index gives a {self.width[i]}x{self.height[i]} picture, outside "
                f"1..{MAX_PIXELS} pixels",
                hint="the version is damaged or forged; run `dsbuild verify`",
            )
        if self.byte_range:
            self._check_ranges()
        else:
            loc = np.stack([self.shard_id, self.row_group, self.row_index], axis=1)
            if len(np.unique(loc, axis=0)) != n:
                raise FormatError(f"{self.ref}: two index rows point at the same row of a shard")
        if self.member_bytes is not None:
            self._check_arrays(self.member_bytes)

    def _check_ranges(self) -> None:
        off, length, size = self.byte_offset, self.byte_length, self.shard_bytes[self.shard_id]
        bad = (off < 0) | (length <= 0) | (length > size) | (off > size - length)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise FormatError(
                f"{self.keys[i]}: index byte range {off[i]}+{length[i]} lies outside its shard ({size[i]} bytes)",
                hint="the version is damaged or forged; run `dsbuild verify`",
            )
        order = np.lexsort((off, self.shard_id))
        same = self.shard_id[order][1:] == self.shard_id[order][:-1]
        overlap = same & (off[order][1:] < (off + length)[order][:-1])
        if np.any(overlap):
            i = int(order[1:][overlap][0])
            raise FormatError(
                f"{self.keys[i]}: index byte range overlaps another sample's",
                hint="the version is damaged or forged; run `dsbuild verify`",
            )
        if self.member_bytes is not None:
            starts = self.format.payload_offsets(self.member_bytes.astype(np.int64))
            ends = (starts + self.member_bytes) if starts is not None else np.cumsum(self.member_bytes, axis=1)
            if np.any(self.member_bytes < 0) or np.any(ends[:, -1] > length):
                i = int(np.flatnonzero((ends[:, -1] > length) | np.any(self.member_bytes < 0, axis=1))[0])
                raise FormatError(f"{self.keys[i]}: member sizes do not fit the sample's {length[i]} bytes")
            self.payload_offsets = starts

    def _check_arrays(self, member_bytes: np.ndarray) -> None:
        rows = (self.n_controls, self.n_channels, np.ones_like(self.frames))
        for k, (m, width, dtype) in enumerate(zip(ARRAY_MEMBERS, rows, ARRAY_DTYPES)):
            need = self.frames * width * dtype.itemsize
            short = member_bytes[:, MEMBERS.index(m)] < need
            if np.any(short):
                i = int(np.flatnonzero(short)[0])
                raise FormatError(
                    f"{self.keys[i]}: {m} member is smaller than its {self.frames[i]} x {rows[k][i]} array"
                )

    def fields(self, idx: np.ndarray) -> dict[str, list]:
        """Per-sample fields of samples ``idx`` for a batch: session fields and the clip's encoding
        (vectorised takes over per-session tables; no sample is read)."""
        if not hasattr(self, "_tables"):

            def obj(values: list) -> np.ndarray:
                return np.array(values + [None], dtype=object)[:-1]  # 1-d even for dicts

            self._codecs = obj(list(self.codecs))  # (before ``_tables``: another thread may see it set)
            self._tables = {
                name: obj([getattr(s, name) for s in self.sessions])
                for name in ("session_id", "title", "player", "conditions")
            }
        codes = self.session_code[idx]
        out = {name: table[codes].tolist() for name, table in self._tables.items()}
        fps = self.fps[idx]
        out.update(
            codec=self._codecs[self.codec_id[idx]].tolist(),
            width=self.width[idx].tolist(),
            height=self.height[idx].tolist(),
            fps=[f or None for f in fps.tolist()],
            has_audio=self.has_audio[idx].tolist(),
        )
        return out

    @property
    def sha256(self) -> list[str]:
        """Each sample's sha256 (its identity), read from the index on first use."""
        return self._hash_columns()[0]

    @property
    def blake3(self) -> list[str | None]:
        """Each sample's BLAKE3 (None in versions made before it was recorded), read on first use."""
        return self._hash_columns()[1]

    def _hash_columns(self) -> tuple[list[str], list[str | None]]:
        if self._hashes is None:
            with self._hashes_lock:
                if self._hashes is None:
                    table = self.catalog.index(self.version_id, list(HASH_COLUMNS))  # (the same pinned bytes)
                    if self._kept is not None:
                        table = table.filter(self._kept)
                    self._hashes = (table["sha256"].to_pylist(), table["blake3"].to_pylist())
        return self._hashes

    def __len__(self) -> int:
        return len(self.keys)

    def sliced(self) -> tuple[np.ndarray, np.ndarray]:
        """(payload_offsets, member_bytes) [samples, members] of a source whose format slices samples out
        of byte ranges (``payload_offsets`` is set at open); asking one that does not is a bug."""
        if self.payload_offsets is None or self.member_bytes is None:
            raise UsageError(f"{self.ref}: its {self.manifest.shard_format} samples are not sliced by byte range")
        return self.payload_offsets, self.member_bytes

    def identity(self, weight: float) -> SourceId:
        return SourceId(self.version_id, self.split, self.split_hash, round(float(weight), 12))

    def entry(self, i: int) -> Entry:
        mb = tuple(self.member_bytes[i].tolist()) if self.member_bytes is not None else None
        if self.byte_range:
            return Entry(
                self.keys[i], self.sha256[i], int(self.byte_offset[i]), int(self.byte_length[i]), member_bytes=mb
            )
        return Entry(
            self.keys[i], self.sha256[i], row_group=int(self.row_group[i]), row=int(self.row_index[i]), member_bytes=mb
        )

"""Parquet shards: one row per sample, arrays as typed list columns, video stored uncompressed.

Every column is compressed with zstd where it pays: metadata, names and arrays (floats also with
BYTE_STREAM_SPLIT, 2.2x on telemetry); the video and the already-zstd events are stored as they are.
Arrays are self-describing: each row carries the names of its action and telemetry columns beside
the row-major values, so ``actions[i * len(controls) + j]`` is always control ``controls[j]`` of that
row, whatever session it came from. Row groups hold a few samples, so an index entry points a reader
at one small group. pyarrow, duckdb, polars and HF datasets read these files directly.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsbuild.core.arrow import check_expansion
from dsbuild.core.errors import FormatError, StorageError
from dsbuild.core.jsonio import parse
from dsbuild.formats.base import (
    ByteSink,
    Entry,
    Members,
    MemberViews,
    Segment,
    ShardFormat,
    ShardReader,
    register_format,
)
from dsbuild.formats.sample import ARRAY_MEMBERS, MEMBERS, Sample, SampleMeta, npy_bytes, npy_load

if TYPE_CHECKING:  # numpy loads lazily: `dsbuild log` and `info` start without it
    import numpy as np
    import pyarrow as pa

MAX_EXPANSION = 8  # decompressed / stored bytes a row group may declare, beyond the floor (clips do not compress)
EXPANSION_FLOOR = 64 << 20
ROW_GROUP_SAMPLES = 8  # small groups: a single-sample read decodes at most a few neighbours


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string()),
            ("sha256", pa.string()),
            ("meta", pa.string()),  # the sample's metadata document (JSON), as the tar's <key>.json
            ("video", pa.binary()),  # MP4 clip
            ("frames", pa.int32()),
            ("controls", pa.list_(pa.string())),
            ("actions", pa.list_(pa.float32())),  # row-major [frames, len(controls)]
            ("telemetry_channels", pa.list_(pa.string())),
            ("telemetry", pa.list_(pa.float32())),  # row-major [frames, len(telemetry_channels)]
            ("timestamps", pa.list_(pa.float64())),
            ("events", pa.binary()),  # zstd JSONL of the raw action events, as the tar member
        ]
    )


COLUMNS = (
    "key",
    "sha256",
    "meta",
    "video",
    "frames",
    "controls",
    "actions",
    "telemetry_channels",
    "telemetry",
    "timestamps",
    "events",
)
# What the array check reads (``array_members``): a row's arrays and what shapes them, never its clip.
ARRAY_COLUMNS = ("key", "frames", "controls", "actions", "telemetry_channels", "telemetry", "timestamps")
# Column paths as Parquet names them (a list's values are "<name>.list.element").
_STORED_AS_IS = ("video", "events")
_FLOATS = ("actions.list.element", "telemetry.list.element", "timestamps.list.element")
_DICTIONARY = ("controls.list.element", "telemetry_channels.list.element")  # names repeat in every row
COMPRESSION = {
    **dict.fromkeys(
        ("key", "sha256", "meta", "frames", "controls.list.element", "telemetry_channels.list.element", *_FLOATS),
        "ZSTD",
    ),
    **dict.fromkeys(_STORED_AS_IS, "NONE"),
}


def _frame(payloads: Iterable[bytes | memoryview]) -> bytes:
    return b"".join(struct.pack("<Q", len(p)) + bytes(p) for p in payloads)


def _unframe(data: bytes) -> list[memoryview]:
    view, out, pos = memoryview(data), [], 0
    while pos < len(view):
        (n,) = struct.unpack_from("<Q", view, pos)
        out.append(view[pos + 8 : pos + 8 + n])
        pos += 8 + n
    if len(out) != len(MEMBERS):
        raise FormatError(f"parquet segment holds {len(out)} members, expected {len(MEMBERS)}")
    return out


@dataclass(frozen=True, slots=True)
class _Read:
    """``columns`` of a run of row groups as one table; row group ``groups[i]`` starts at row ``starts[i]``."""

    groups: range
    columns: tuple[str, ...]
    table: pa.Table
    starts: list[int]


class ParquetReader(ShardReader):
    def __init__(self, path: Path):
        super().__init__(path)
        self._file = None
        self._size = 0  # bytes of the file (what its row groups may expand to is bounded by it)
        self._group: _Read | None = None  # the last read, kept until another is asked for
        self._alone = False  # a run of row groups failed to read: each is read alone from then on

    def _pf(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._file is None:
            try:
                self._size = os.stat(self.path).st_size
                self._file = pq.ParquetFile(self.path)
            except OSError as e:  # the file system's fault (EMFILE, EACCES...), not the data's
                raise StorageError(f"{self.path}: cannot open shard ({e.strerror or e})") from None
            except pa.ArrowException as e:
                raise FormatError(f"{self.path.name}: not readable Parquet ({str(e)[:160]})") from None
        return self._file

    def _table(self, entry: Entry, columns: tuple[str, ...], wanted: Container[int] = ()) -> tuple[pa.Table, int]:
        """A table of ``columns`` holding ``entry``'s row group, and the entry's row in it. The row groups
        right after it that are in ``wanted`` come in the same read where together they stay within the
        bound every read has (what their column chunks declare once decompressed), else it comes alone (and
        so does every later one: a damaged group costs one failed run, not one a group)."""
        pf = self._pf()
        g, r = entry.row_group, entry.row
        if g is None or r is None or not 0 <= g < pf.num_row_groups:
            raise FormatError(f"{entry.key}: row group {g} does not exist")
        held = self._group
        if held is None or held.columns != columns or g not in held.groups:
            end = g + 1
            while not self._alone and end < pf.num_row_groups and end in wanted:
                end += 1
            try:
                held = self._read(range(g, end), columns, entry.key)
            except FormatError:
                if end == g + 1:
                    raise
                self._alone = True
                held = self._read(range(g, g + 1), columns, entry.key)
            self._group = held
        at, stop = held.starts[g - held.groups.start], held.starts[g - held.groups.start + 1]
        if not 0 <= r < stop - at:
            raise FormatError(f"{entry.key}: row {g}/{r} does not exist")
        return held.table, at + r

    def _read(self, groups: range, columns: tuple[str, ...], key: str) -> _Read:
        import pyarrow as pa

        pf = self._pf()
        what = f"{key}: row group{'s' if len(groups) > 1 else ''} {groups.start}"
        what += f"-{groups.stop - 1}" if len(groups) > 1 else ""
        check_expansion(pf, columns, groups, MAX_EXPANSION * self._size + EXPANSION_FLOOR, what)
        try:
            table = pf.read_row_groups(list(groups), columns=list(columns))
        except (OSError, pa.ArrowException, KeyError) as e:
            raise FormatError(f"{what} unreadable ({str(e)[:160]})") from None
        starts = [0]
        for g in groups:
            starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
        if starts[-1] != table.num_rows:
            raise FormatError(f"{what}: {table.num_rows} rows read, its metadata says {starts[-1]}")
        return _Read(groups, columns, table, starts)

    @staticmethod
    def _vetted(entry: Entry, row: dict) -> dict:
        """``row`` (a value, or None for null, under each column read), refused unless it is ``entry``'s."""
        if row["key"] != entry.key:
            raise FormatError(f"{entry.key}: row {entry.row_group}/{entry.row} holds {str(row['key'])[:80]!r}")
        nulls = [c for c, v in row.items() if v is None]
        if nulls:
            raise FormatError(f"{entry.key}: null column(s) {', '.join(nulls)}")
        return row

    def _row(self, entry: Entry) -> dict:
        table, r = self._table(entry, COLUMNS)
        return self._vetted(entry, {c: table.column(c)[r].as_py() for c in COLUMNS})

    @staticmethod
    def _arrays(row: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A row's actions, telemetry and timestamps shaped by its frames and names. Its list columns may
        be Python lists (``_row``) or numpy vectors of the values (``array_members``); ``controls`` and
        ``telemetry_channels`` then only need a length."""
        import numpy as np

        f = int(row["frames"])
        shaped = []
        for col, names in (("actions", "controls"), ("telemetry", "telemetry_channels")):
            values, width = row[col], len(row[names])
            if f < 0 or len(values) != f * width:
                raise FormatError(f"{row['key']}: {col} holds {len(values)} values, not {f} x {width}")
            shaped.append(np.asarray(values, np.float32).reshape(f, width))
        ts = np.asarray(row["timestamps"], np.float64)
        if len(ts) != f:
            raise FormatError(f"{row['key']}: {len(ts)} timestamps for {f} frames")
        return shaped[0], shaped[1], ts

    def array_members(self, entries: Sequence[Entry]) -> Iterator[tuple[Entry, MemberViews | FormatError]]:
        """The array members as ``members`` makes them, from the array columns alone (``ARRAY_COLUMNS``,
        each row group's read bounded as ``members``' is): the clips, metadata and events are never read
        or decompressed; the row groups ``entries`` hold are read together (within the bound), and their
        columns become numpy vectors once, not a Python list a row."""
        wanted = {e.row_group for e in entries if e.row_group is not None}
        rows: tuple[pa.Table | None, list[dict]] = (None, [])  # the last table read, its rows as numpy
        for e in entries:
            try:
                table, i = self._table(e, ARRAY_COLUMNS, wanted)
                if rows[0] is not table:
                    rows = (table, _array_rows(table))
                arrays = self._arrays(self._vetted(e, rows[1][i]))
            except FormatError as err:
                yield e, err
                continue
            yield e, [(ext, npy_bytes(a)) for ext, a in zip(ARRAY_MEMBERS, arrays)]

    def members(self, entry: Entry) -> Members:
        row = self._row(entry)
        actions, telemetry, timestamps = self._arrays(row)
        return list(
            zip(
                MEMBERS,
                (
                    row["meta"].encode("utf-8", "surrogatepass"),
                    row["video"],
                    npy_bytes(actions),
                    npy_bytes(telemetry),
                    npy_bytes(timestamps),
                    row["events"],
                ),
            )
        )

    def read(self, entry: Entry) -> Sample:
        from dsbuild.core.jsonio import loads_bounded
        from dsbuild.formats.sample import MAX_META_BYTES

        row = self._row(entry)
        meta = SampleMeta.from_json(
            loads_bounded(row["meta"], max_bytes=MAX_META_BYTES, what=f"{entry.key}.json"), f"{entry.key}.json"
        )
        return Sample(entry.key, meta, row["video"], *self._arrays(row), row["events"])

    def check(self, entry: Entry, size: int) -> None:
        row = self._row(entry)
        if row["sha256"] != entry.sha256:
            raise FormatError("row's sample hash does not match the index")

    def check_all(self, entries: list[Entry], size: int) -> list[tuple[str, str]]:
        """Every entry's row group and row hold its key and sample hash (two columns read once)."""
        import pyarrow as pa

        try:
            pf = self._pf()
            table = pf.read(columns=["key", "sha256"])
            groups = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        except (FormatError, OSError, pa.ArrowException, KeyError) as e:
            return [(x.key, f"shard unreadable ({str(e)[:120]})") for x in entries]
        keys, hashes = table.column("key").to_pylist(), table.column("sha256").to_pylist()
        starts = [sum(groups[:g]) for g in range(len(groups))]
        out = []
        for x in entries:
            if (
                x.row_group is None
                or x.row is None
                or not 0 <= x.row_group < len(groups)
                or not 0 <= x.row < groups[x.row_group]
            ):
                out.append((x.key, f"row {x.row_group}/{x.row} does not exist"))
                continue
            i = starts[x.row_group] + x.row
            if keys[i] != x.key:
                out.append((x.key, f"row {x.row_group}/{x.row} holds {str(keys[i])[:80]!r}"))
            elif hashes[i] != x.sha256:
                out.append((x.key, "row's sample hash does not match the index"))
        return out

    def scan(self, keys: set[str]) -> list[tuple[str, str]]:
        import pyarrow as pa

        try:
            pf = self._pf()
            names = pf.schema_arrow.names
            stored = pf.read(columns=["key"]).column("key").to_pylist() if "key" in names else []
        except (FormatError, OSError, pa.ArrowException):
            return []  # unreadable: reported by the shard hash and the per-sample checks
        out = [(f"{self.path.name}:{c[:80]}", "column not in the shard schema") for c in names if c not in COLUMNS]
        out += [
            (f"{self.path.name}:{str(k)[:80]}", "row belongs to no sample in the index")
            for k in stored
            if k not in keys
        ]
        return out

    def close(self) -> None:
        self._file, self._group = None, None


def _array_rows(table: pa.Table) -> list[dict]:
    """Each row of a table of ``ARRAY_COLUMNS`` as ``_arrays`` takes it (None for a null): its float lists
    as slices of one numpy vector a column (a null value inside one is NaN, as ``as_py`` then ``asarray``
    makes it), its name lists as their lengths."""
    import numpy as np

    from dsbuild.core.arrow import to_numpy

    n, out = table.num_rows, {}
    for c in ARRAY_COLUMNS:
        col = table.column(c).combine_chunks()
        if c == "key":
            out[c] = col.to_pylist()
        elif c == "frames":
            out[c] = to_numpy(col, null=-1).tolist()
        else:
            at = to_numpy(col.offsets).tolist()
            if c in ("controls", "telemetry_channels"):
                out[c] = [range(b - a) for a, b in zip(at, at[1:])]
            else:
                values = to_numpy(col.values, null=np.nan)
                out[c] = [values[a:b] for a, b in zip(at, at[1:])]
        if col.null_count:
            out[c] = [None if null else v for v, null in zip(out[c], col.is_null().to_pylist())]
    return [{c: out[c][i] for c in ARRAY_COLUMNS} for i in range(n)]


class ParquetFormat(ShardFormat):
    name = "parquet"
    ext = "parquet"

    def __init__(self, row_group_samples: int = ROW_GROUP_SAMPLES):
        self.row_group_samples = row_group_samples

    def encode(self, key: str, sha256: str, members: Sequence[tuple[str, bytes | memoryview]]) -> Segment:
        return Segment(key, sha256, _frame(p for _, p in members), tuple(len(p) for _, p in members))

    def write(self, segments: Iterable[Segment], out: ByteSink) -> list[Entry]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from dsbuild.core.arrow import array

        rows: dict[str, list] = {c: [] for c in COLUMNS}
        entries = []
        for n, seg in enumerate(segments):
            meta, video, a, t, ts, events = _unframe(seg.data)
            doc = parse(bytes(meta))
            actions, telemetry = npy_load(bytes(a)), npy_load(bytes(t))
            for col, value in (
                ("key", seg.key),
                ("sha256", seg.sha256),
                ("meta", bytes(meta).decode()),
                ("video", bytes(video)),
                ("frames", len(actions)),
                ("controls", doc["controls"]),
                ("actions", actions.reshape(-1)),
                ("telemetry_channels", doc["telemetry_channels"]),
                ("telemetry", telemetry.reshape(-1)),
                ("timestamps", npy_load(bytes(ts))),
                ("events", bytes(events)),
            ):
                rows[col].append(value)
            entries.append(
                Entry(
                    seg.key,
                    seg.sha256,
                    row_group=n // self.row_group_samples,
                    row=n % self.row_group_samples,
                    member_bytes=seg.member_bytes,
                )
            )
        schema = _schema()
        table = pa.table({c: array(rows[c], schema.field(c).type) for c in COLUMNS}, schema=schema)
        sink = pa.BufferOutputStream()
        pq.write_table(
            table,
            sink,
            row_group_size=self.row_group_samples,
            compression=COMPRESSION,
            use_dictionary=list(_DICTIONARY),
            use_byte_stream_split=list(_FLOATS),
            write_statistics=["key"],
            store_schema=False,
        )
        out.write(sink.getvalue().to_pybytes())
        return entries

    def reader(self, path: Path) -> ParquetReader:
        return ParquetReader(path)


register_format(ParquetFormat())

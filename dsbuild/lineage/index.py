"""The per-sample index of a version: one Parquet row per sample, sorted by key.

It is both the loader's locator table (key -> shard + byte range and member sizes, or row group/row)
and the lineage table that duckdb queries in place (session fields, window, source video hash, sizes).
A value that does not apply is NULL (never -1): ``offset`` for a Parquet shard, ``fps`` of a clip
without a rate. Column types (documented in the README): ``conditions`` is ``MAP<VARCHAR, VARCHAR>``,
``started_at`` a UTC timestamp (NULL when the capture gives none or an unparseable one; the sample's
metadata keeps the original string). ``parent_version``/``parent_key`` name the sample a derived
version's sample was made from (NULL for samples converted from captures). ``blake3`` is the BLAKE3 of
the same canonical members as ``sha256`` (the loader's per-read check); an index written before it
existed reads it as NULL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields, replace
from datetime import datetime

from dsbuild.core.arrow import check_expansion
from dsbuild.core.errors import FormatError
from dsbuild.formats import Entry

INDEX_FILE = "index.parquet"
MAX_INDEX_BYTES = 4 << 30
MAX_INDEX_EXPANSION = 64  # decompressed / stored bytes an index may declare (beyond the floor); real ones: < 10
EXPANSION_FLOOR = 256 << 20


# (name, type) per column, in file order. Plain names, so commands that never read an index (`log`,
# `tag`) start without importing pyarrow.
_SCHEMA = (
    ("key", "string"),
    ("sha256", "string"),
    ("shard", "string"),
    ("byte_offset", "int64"),
    ("byte_length", "int64"),
    ("row_group", "int32"),
    ("row_index", "int32"),
    ("member_bytes", "list<int64>"),
    ("session_id", "string"),
    ("title", "string"),
    ("player", "string"),
    ("platform", "string"),
    ("build", "string"),
    ("started_at", "timestamp[us, UTC]"),
    ("conditions", "map<string, string>"),
    ("clip_index", "int32"),
    ("t_start", "float64"),
    ("t_end", "float64"),
    ("frames", "int32"),
    ("fps", "float64"),
    ("width", "int32"),
    ("height", "int32"),
    ("codec", "string"),
    ("has_audio", "bool"),
    ("n_controls", "int32"),
    ("n_channels", "int32"),
    ("video_bytes", "int64"),
    ("bytes", "int64"),
    ("action_events", "int32"),
    ("text_events", "int32"),
    ("source_video_sha256", "string"),
    ("parent_version", "string"),  # a derived version's sample: the version and key it was made from
    ("parent_key", "string"),
    ("blake3", "string"),
)
LATER_COLUMNS = ("blake3",)  # added after the first index format: an older index reads them as NULL
INDEX_COLUMNS = tuple(name for name, _ in _SCHEMA)


def index_schema():
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "int32": pa.int32(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "list<int64>": pa.list_(pa.int64()),
        "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
        "map<string, string>": pa.map_(pa.string(), pa.string()),
    }
    return pa.schema([(name, types[t]) for name, t in _SCHEMA])


# The columns that locate a sample in its shard: what split files and loaders carry.
LOCATOR_COLUMNS = ("key", "sha256", "shard", "byte_offset", "byte_length", "row_group", "row_index", "member_bytes")


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One sample's row (the typed form of what convert produces; the file is read as Arrow columns)."""

    key: str
    sha256: str
    shard: str
    session_id: str
    title: str
    player: str
    clip_index: int
    t_start: float
    t_end: float
    frames: int
    width: int
    height: int
    codec: str
    has_audio: bool
    n_controls: int
    n_channels: int
    video_bytes: int
    bytes: int
    action_events: int
    text_events: int
    source_video_sha256: str
    conditions: tuple[tuple[str, str], ...] = ()
    platform: str | None = None
    build: str | None = None
    started_at: datetime | None = None
    fps: float | None = None
    byte_offset: int | None = None
    byte_length: int | None = None
    row_group: int | None = None
    row_index: int | None = None
    member_bytes: tuple[int, ...] | None = None
    parent_version: str | None = None  # NULL for a sample converted from captures
    parent_key: str | None = None
    blake3: str | None = None  # NULL in versions made before it was recorded

    def entry(self) -> Entry:
        return Entry(
            self.key, self.sha256, self.byte_offset, self.byte_length, self.row_group, self.row_index, self.member_bytes
        )

    def located(self, shard: str, e: Entry) -> IndexRow:
        return replace(
            self,
            shard=shard,
            byte_offset=e.offset,
            byte_length=e.length,
            row_group=e.row_group,
            row_index=e.row,
            member_bytes=e.member_bytes,
        )


def index_bytes(rows: list[IndexRow]) -> bytes:
    """Deterministic Parquet bytes of the index rows (sorted by key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsbuild.core.arrow import array

    rows = sorted(rows, key=lambda r: r.key)
    schema = index_schema()
    names = [f.name for f in fields(IndexRow)]
    columns = {n: [getattr(r, n) for r in rows] for n in names}
    table = pa.table({n: array(columns[n], schema.field(n).type) for n in INDEX_COLUMNS}, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 17, store_schema=False)
    return sink.getvalue().to_pybytes()


def table_from_bytes(data: bytes, what: str, columns: list[str] | None = None):
    """The index table from its (already pinned) bytes; a foreign schema is a FormatError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = index_schema()
    wanted = list(INDEX_COLUMNS if columns is None else columns)
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        check_expansion(pf, wanted, range(pf.num_row_groups), MAX_INDEX_EXPANSION * len(data) + EXPANSION_FLOOR, what)
        absent = [c for c in wanted if c in LATER_COLUMNS and c not in pf.schema_arrow.names]
        # in this thread: a reader over Python bytes released by an Arrow worker as the interpreter
        # exits needs the GIL it can no longer take, and the process aborts (exit 134)
        table = pf.read(columns=[c for c in wanted if c not in absent] if absent else columns, use_threads=False)
    except (pa.ArrowException, OSError, KeyError) as e:
        raise FormatError(f"{what}: unreadable index ({str(e).splitlines()[0][:200]})") from None
    if absent:  # an index from before these columns: NULL, in their place
        for c in absent:
            table = table.append_column(schema.field(c), pa.nulls(table.num_rows, schema.field(c).type))
        table = table.select(wanted)
    expected = schema if columns is None else pa.schema([schema.field(c) for c in columns])
    if not table.schema.equals(expected):
        raise FormatError(f"{what}: index schema differs from the {INDEX_FILE} format")
    return table


def table_columns(table) -> dict[str, list]:
    """``table.to_pydict()``, except that ``started_at`` becomes UTC datetimes through ``core.arrow``:
    pyarrow converts a timezone-aware timestamp column by importing pandas (0.2 s of a command's start-up)."""
    from dsbuild.core.arrow import datetimes

    return {
        name: datetimes(table.column(name)) if name == "started_at" else table.column(name).to_pylist()
        for name in table.column_names
    }


def rows_from_table(table) -> list[IndexRow]:
    """Typed rows of an index table (for bookkeeping over a version: incremental builds, diff)."""
    data = table_columns(table)
    n = table.num_rows
    names = [f.name for f in fields(IndexRow)]
    out = []
    for i in range(n):
        values = {k: data[k][i] for k in names}
        values["conditions"] = tuple(values["conditions"] or ())
        values["member_bytes"] = tuple(values["member_bytes"]) if values["member_bytes"] is not None else None
        out.append(IndexRow(**values))
    return out


def entries_by_shard(table) -> dict[str, list[Entry]]:
    """Index rows as Entries, grouped by shard (one pass over the locator columns)."""
    cols = table.select(list(LOCATOR_COLUMNS)).to_pydict()
    out: dict[str, list[Entry]] = defaultdict(list)
    for i, shard in enumerate(cols["shard"]):
        mb = cols["member_bytes"][i]
        out[shard].append(
            Entry(
                cols["key"][i],
                cols["sha256"][i],
                cols["byte_offset"][i],
                cols["byte_length"][i],
                cols["row_group"][i],
                cols["row_index"][i],
                tuple(mb) if mb is not None else None,
            )
        )
    return out

"""The per-sample index of a version: one Parquet row per sample, sorted by key.

It is both the loader's locator table (key -> shard + byte range or row group/row) and the lineage
table that duckdb queries in place (session fields, window, source video hash, sizes).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dsbuild.errors import FormatError

INDEX_FILE = "index.parquet"
INDEX_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("sha256", pa.string()),
    ("shard", pa.string()),
    ("offset", pa.int64()),
    ("length", pa.int64()),
    ("row_group", pa.int32()),
    ("row", pa.int32()),
    ("session_id", pa.string()),
    ("title", pa.string()),
    ("player", pa.string()),
    ("platform", pa.string()),
    ("build", pa.string()),
    ("conditions", pa.string()),  # canonical JSON object
    ("clip_index", pa.int32()),
    ("t_start", pa.float64()),
    ("t_end", pa.float64()),
    ("frames", pa.int32()),
    ("fps", pa.float64()),
    ("width", pa.int32()),
    ("height", pa.int32()),
    ("codec", pa.string()),
    ("video_bytes", pa.int64()),
    ("bytes", pa.int64()),
    ("action_events", pa.int32()),
    ("text_events", pa.int32()),
    ("source_video_sha256", pa.string()),
])


# The columns that locate a sample in its shard: what split files and loaders carry.
LOCATOR_COLUMNS = ("key", "sha256", "shard", "offset", "length", "row_group", "row")


def index_bytes(rows: list[dict]) -> bytes:
    """Deterministic Parquet bytes of the index rows (sorted by key)."""
    rows = sorted(rows, key=lambda r: r["key"])
    table = pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in INDEX_SCHEMA},
                     schema=INDEX_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 17, store_schema=False)
    return sink.getvalue().to_pybytes()


def read_index(path: Path, columns: list[str] | None = None) -> pa.Table:
    """The index table; a damaged or foreign file is a FormatError naming it, not a pyarrow traceback."""
    try:
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise FormatError(f"{path}: unreadable index ({str(e).splitlines()[0][:200]})") from None
    expected = INDEX_SCHEMA if columns is None else pa.schema([INDEX_SCHEMA.field(c) for c in columns])
    if not table.schema.equals(expected):
        raise FormatError(f"{path}: index schema differs from {INDEX_FILE} format")
    return table

"""The split file encoding: one Parquet file per split, one row per sample, sorted by key.

Storage (immutable folders, atomic pointer swap) lives with the catalog in ``lineage.splitsets``.
"""

from __future__ import annotations

from dsbuild.lineage.index import LOCATOR_COLUMNS, index_schema


def split_schema():
    import pyarrow as pa

    schema = index_schema()
    return pa.schema(
        [schema.field(c) for c in LOCATOR_COLUMNS]
        + [
            ("session_id", pa.string()),
            ("group_value", pa.string()),  # not "group": that is an SQL keyword
            ("split", pa.string()),  # constant per file; lets one glob over all files answer per-split queries
        ]
    )


def table_bytes(table) -> bytes:
    """Deterministic Parquet bytes of one split (rows sorted by key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = split_schema()
    table = table.select(schema.names).cast(schema).sort_by("key")
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 17, store_schema=False)
    return sink.getvalue().to_pybytes()

"""SQL over a version with duckdb, reading the Parquet index and JSON manifests in place.

Views: ``samples`` (the per-sample index), ``shards`` and ``sources`` (from the manifest), ``lineage``
(every sample joined with its source files, config hash and tool version) and ``versions`` (every
version of the catalog). Nothing is loaded into Python but the query's result.
"""

from __future__ import annotations

from pathlib import Path

from dsbuild.errors import UsageError
from dsbuild.lineage.catalog import Catalog


def _lit(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def connect(catalog: Catalog, version_id: str):
    import duckdb

    vdir = catalog.version_dir(version_id)
    manifest = _lit(vdir / "manifest.json")
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE VIEW samples AS SELECT * FROM read_parquet({_lit(vdir / 'index.parquet')})")
    con.execute(f"CREATE VIEW _manifest AS SELECT * FROM read_json({manifest}, maximum_object_size=1073741824)")
    con.execute("CREATE VIEW shards AS SELECT unnest(shards, recursive := true) FROM _manifest")
    con.execute("CREATE VIEW sources AS SELECT unnest(sources, recursive := true) FROM _manifest")
    con.execute("""CREATE VIEW lineage AS
        SELECT s.key, s.sha256 AS sample_sha256, s.session_id, s.t_start, s.t_end, s.shard, s.offset, s.length,
               s.row_group, s.row, src.role, src.path AS source_path, src.sha256 AS source_sha256,
               m.config_hash, m.tool_version
        FROM samples s JOIN sources src ON src.session = s.session_id CROSS JOIN _manifest m""")
    pattern = _lit(catalog.root / "versions" / "*" / "manifest.json")
    con.execute(f"""CREATE VIEW versions AS
        SELECT regexp_extract(filename, '([0-9a-f]{{64}})/manifest.json$', 1) AS version_id, content_id,
               tool_version, config_hash, shard_format, stats.samples AS samples, stats.bytes AS bytes,
               stats.hours AS hours
        FROM read_json({pattern}, filename=true, union_by_name=true, maximum_object_size=1073741824)""")
    return con


def run_query(catalog: Catalog, version_id: str, sql: str) -> tuple[list[str], list[tuple]]:
    import duckdb

    con = connect(catalog, version_id)
    try:
        cur = con.execute(sql)
    except duckdb.Error as e:
        raise UsageError(f"query failed: {str(e).splitlines()[0]}") from None
    if cur.description is None:
        return [], []
    return [d[0] for d in cur.description], cur.fetchall()

"""`dsbuild query`: SQL (duckdb, sandboxed) over a version's samples, shards, sources, lineage and the versions."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild query catalog "select title, count(*) as clips from samples group by title"
  dsbuild query catalog@gold "select key from samples" --csv > keys.csv
Queries run sandboxed: file functions, COPY ... TO, ATTACH and INSTALL/LOAD fail. --unsafe lifts that
for your own queries on your own machine; never for SQL taken from a pull request."""


def query(
    ref: str = REF,
    sql: str = typer.Argument(
        ..., metavar="SQL", help="SQL over the views samples, shards, sources, lineage, versions."
    ),
    unsafe: bool = typer.Option(
        False, "--unsafe", help="Allow file access (read_csv, COPY TO, ATTACH): your own SQL only."
    ),
    as_csv: bool = typer.Option(False, "--csv", help="Print rows as CSV with a header."),
    as_json: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Rows only, tab-separated, no header."),
) -> None:
    """Run SQL (duckdb, sandboxed) over a version.

    Views: samples (the index), shards, sources, lineage, versions; read in place."""
    from dsbuild.core.errors import UsageError
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.query import run_query

    o = Out(as_json, quiet)
    catalog, version = open_ref(ref)
    columns, rows = run_query(catalog, version, sql, unsafe=unsafe)
    if as_json:
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:  # a JSON row is an object: one value a name
            raise UsageError(
                f"the result names {len(twice)} column(s) more than once ({', '.join(twice)}): a JSON "
                "row would keep one value of each",
                hint="name them apart with AS, e.g. select s.bytes as sample_bytes, sh.bytes as shard_bytes ...",
            )
        o.json([dict(zip(columns, r)) for r in rows])
    elif as_csv:
        o.csv(columns, rows)
    elif quiet:
        for r in rows:
            o.row(r)
    else:
        o.table(columns, [["NULL" if v is None else v for v in r] for r in rows])


def register(app: typer.Typer) -> None:
    app.command("query", epilog=EXAMPLES)(query)

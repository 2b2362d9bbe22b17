"""`dsbuild query`: SQL (duckdb) over a version's samples, shards, sources, lineage and the versions."""

from __future__ import annotations

import csv
import sys

import typer

from dsbuild.cli.render import console, print_json


def query(
    ref: str = typer.Argument(..., help="PATH[@VERSION]"),
    sql: str = typer.Argument(..., help="SQL over views samples, shards, sources, lineage, versions."),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print rows as CSV."),
) -> None:
    """Run SQL in place over the catalog's Parquet and JSON files."""
    from rich.table import Table

    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.query import run_query

    catalog, version = open_ref(ref)
    columns, rows = run_query(catalog, version, sql)
    if as_json:
        print_json([dict(zip(columns, r)) for r in rows])
    elif as_csv:
        w = csv.writer(sys.stdout)
        w.writerow(columns)
        w.writerows(rows)
    else:
        t = Table(*columns)
        for r in rows:
            t.add_row(*(str(v) for v in r))
        console.print(t)


def register(app: typer.Typer) -> None:
    app.command("query")(query)

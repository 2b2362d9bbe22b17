"""`dsbuild log`: the versions of a catalog, newest first."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def log(
    path: str = typer.Argument(..., help="Catalog folder or URL."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List versions: id, content id, tags, created, samples, bytes, parent and what changed."""
    from rich.table import Table

    from dsbuild.lineage.catalog import open_catalog
    from dsbuild.lineage.history import log_entries

    entries = log_entries(open_catalog(path))
    if as_json:
        print_json({"versions": entries})
        return
    t = Table("version", "content", "tags", "created", "samples", "bytes", "parent", "change", "split sets")
    for e in entries:
        splits = "; ".join(_split_line(s) for s in e["split_sets"])
        t.add_row(e["version_id"][:12], e["content_id"][:12], ",".join(e["tags"]), e["created_at"],
                  str(e["samples"]), f"{e['bytes']:,}", (e["parent"] or "-")[:12], e["change"], splits)
    console.print(t)


def _split_line(summary: dict) -> str:
    parts = ", ".join(f"{name} {r['samples']}" for name, r in summary["splits"].items())
    return f"{summary['name']} ({parts})"


def register(app: typer.Typer) -> None:
    app.command("log")(log)

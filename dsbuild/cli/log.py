"""`dsbuild log`: the versions of a catalog, newest first."""

from __future__ import annotations

import typer

from dsbuild.cli.params import CATALOG, JSON
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild log catalog
  dsbuild log catalog | cut -f1          # whole version ids when piped
  dsbuild log s3://datasets/cat --json"""


def log(
    path: str = CATALOG,
    no_trunc: bool = typer.Option(
        False, "--no-trunc", help="Whole ids on a terminal too (piped output always has them)."
    ),
    as_json: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the version ids, one per line."),
) -> None:
    """List the versions of a catalog, newest first.

    Id, tags, created, format, samples, bytes, parent, change and split sets."""
    from dsbuild.lineage.catalog import open_catalog
    from dsbuild.lineage.history import log_entries

    o = Out(as_json, quiet, no_trunc)
    entries = log_entries(open_catalog(path))
    if as_json:
        return o.json({"versions": entries})
    if quiet:
        for e in entries:
            o.value(e["version_id"])
        return
    rows = []
    for e in entries:
        c = e["change"]
        change = f"+{c.get('added', 0)} -{c.get('removed', 0)} ~{c.get('changed', 0)}" if c else "-"
        rows.append(
            (
                o.id(e["version_id"]),
                ",".join(e["tags"]),
                o.when(e["created_at"]),
                e["format"],
                e["samples"],
                o.size(e["bytes"]),
                o.id(e["parent"]),
                change,
                ",".join(s["name"] for s in e["split_sets"]),
            )
        )
    o.table(
        ["version", "tags", "created", "format", "samples", "bytes", "parent", "change", "split sets"],
        rows,
        wide=("version", "samples", "bytes", "parent", "change"),
    )


def register(app: typer.Typer) -> None:
    app.command("log", epilog=EXAMPLES)(log)

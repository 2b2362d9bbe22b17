"""`dsbuild gc`: remove shards that no version references."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def gc(
    path: str = typer.Argument(..., help="Catalog folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Delete unreferenced shards and stale build folders; every committed version stays whole."""
    from dsbuild.core.errors import UsageError
    from dsbuild.lineage.catalog import Catalog
    from dsbuild.lineage.remote import is_url

    if is_url(path):
        raise UsageError(f"{path}: gc of object-store catalogs is not supported yet; use the store's lifecycle rules")
    garbage = Catalog.open(path).gc(dry_run=dry_run)
    total = sum(size for _, size in garbage)
    if as_json:
        print_json({"dry_run": dry_run, "shards": [p for p, _ in garbage], "bytes": total})
        return
    for p, _ in garbage:
        console.print(f"{'would remove' if dry_run else 'removed'} {p}", highlight=False)
    console.print(f"{len(garbage)} shards, {total:,} bytes {'to free' if dry_run else 'freed'}")


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)

"""`dsbuild tag`: name a version (names are unique; moving one needs --force)."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def tag(
    ref: str = typer.Argument(..., help="PATH@VERSION to tag (or PATH with --delete)."),
    name: str = typer.Argument(..., help="Tag name."),
    force: bool = typer.Option(False, "--force", help="Move the tag if it points elsewhere."),
    delete: bool = typer.Option(False, "--delete", help="Delete the tag."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create, move or delete a tag."""
    from dsbuild.lineage.catalog import TAGS, open_catalog, parse_ref

    path, version = parse_ref(ref)
    catalog = open_catalog(path)
    target = catalog.set_tag(name, version, force=force, delete=delete)
    if catalog.remote is not None:
        catalog.remote.push_files(catalog, [TAGS])
    if as_json:
        print_json({"tag": name, "version_id": target, "deleted": delete})
    else:
        console.print(f"deleted tag {name}" if delete else f"{name} -> {target}")


def register(app: typer.Typer) -> None:
    app.command("tag")(tag)

"""`dsbuild tag`: name a version (names are unique; moving one needs --force)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild tag catalog gold                 # tag the newest version
  dsbuild tag catalog@3f2a9c01 gold --force
  dsbuild tag catalog gold --delete"""


def tag(
    ref: str = REF,
    name: str = typer.Argument(..., metavar="NAME", help="Tag name: a letter, then letters, digits, '.', '_' or '-'."),
    force: bool = typer.Option(False, "--force", help="Move the tag if it points at another version."),
    delete: bool = typer.Option(False, "--delete", help="Delete the tag (REF is then just the catalog)."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Create, move or delete a tag (local catalogs and object stores)."""
    from dsbuild.lineage.catalog import open_catalog, parse_ref

    o = Out(as_json, quiet)
    path, version = parse_ref(ref)
    target = open_catalog(path).set_tag(name, version, force=force, delete=delete)
    if as_json:
        o.json({"tag": name, "version_id": target, "deleted": delete})
    else:
        o.line(f"deleted tag {name}" if delete else f"{name} -> {target}")


def register(app: typer.Typer) -> None:
    app.command("tag", epilog=EXAMPLES)(tag)

"""`dsbuild pull`: copy a version from another catalog (the same operation as `push`, seen from here)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.push import copy_version

EXAMPLES = """\b
Examples:
  dsbuild pull s3://datasets/karts@gold catalog --tags --splits
Run the same command again to resume an interrupted pull."""


def pull(
    ref: str = REF,
    dest: str = typer.Argument(
        ..., metavar="DEST_CATALOG", help="Local (or any) catalog to copy into, created if needed."
    ),
    tags: bool = typer.Option(False, "--tags", help="Also copy the tags pointing at the version."),
    splits: bool = typer.Option(False, "--splits", help="Also copy the version's split sets."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Copy a version from another catalog (only what is missing here; manifest last)."""
    copy_version(ref, dest, tags, splits, as_json, quiet, "pull")


def register(app: typer.Typer) -> None:
    app.command("pull", epilog=EXAMPLES)(pull)

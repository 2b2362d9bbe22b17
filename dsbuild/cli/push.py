"""`dsbuild push` (and, through ``copy_version``, `dsbuild pull`): copy a version between catalogs on any
stores (local, s3://, ...).

Both are one operation (``lineage.transfer``): only shards the destination lacks are sent, each hashed
on the way; the manifest lands last, so an interrupted copy shows nothing and re-running resumes it."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out, Progress

PUSH_EXAMPLES = """\b
Examples:
  dsbuild push catalog@gold s3://datasets/karts --tags --splits
  dsbuild push catalog s3://datasets/karts --json
Run the same command again to resume an interrupted push."""


def copy_version(ref: str, dest: str, tags: bool, splits: bool, as_json: bool, quiet: bool, verb: str) -> None:
    from dsbuild.lineage.catalog import catalog_to_fill, open_catalog, parse_ref
    from dsbuild.lineage.transfer import transfer

    o = Out(as_json, quiet)
    path, version = parse_ref(ref)
    source = open_catalog(path)
    vid = source.resolve(version)
    source.manifest(vid)  # a ref or version that does not resolve leaves no empty catalog behind
    with catalog_to_fill(dest) as target, Progress(verb, o) as bar:
        r = transfer(
            source,
            vid,
            target,
            tags=tags,
            splits=splits,
            progress=lambda p: bar.update(p.done, p.total, stage="shards"),
        )
    if as_json:
        return o.json(r.to_json())
    if quiet:
        return o.value(r.version_id)
    state = "already there" if r.version_existed else "published"
    extras = "".join(
        [
            f"; tags {', '.join(r.tags)}" if r.tags else "",
            f"; split sets {', '.join(r.split_sets)}" if r.split_sets else "",
        ]
    )
    o.line(
        f"{verb}ed {o.id(r.version_id)} to ",
        r.destination,
        f": {r.shards_sent} shards sent ({r.bytes_sent:,} bytes), {r.shards_skipped} already there; "
        f"version {state}{extras}",
    )


def push(
    ref: str = REF,
    dest: str = typer.Argument(
        ..., metavar="DEST_CATALOG", help="Catalog to copy into (created if needed): a folder or any fsspec URL."
    ),
    tags: bool = typer.Option(False, "--tags", help="Also copy the tags pointing at the version."),
    splits: bool = typer.Option(False, "--splits", help="Also copy the version's split sets."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Copy a version to another catalog (only what it lacks; manifest last)."""
    copy_version(ref, dest, tags, splits, as_json, quiet, "push")


def register(app: typer.Typer) -> None:
    app.command("push", epilog=PUSH_EXAMPLES)(push)

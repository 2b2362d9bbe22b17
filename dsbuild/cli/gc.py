"""`dsbuild gc`: remove shards no version references and stale build folders."""

from __future__ import annotations

import typer

from dsbuild.cli.params import CATALOG, JSON, QUIET
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild gc catalog --dry-run     # what would go: shards, stale build folders, unpublished files
  dsbuild gc catalog"""


def gc(
    path: str = CATALOG,
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; remove nothing."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Remove unreferenced shards and stale build folders.

    Also unpublished version files, replaced split sets and temp files of writes a kill interrupted
    (older than an hour). On object stores (no locks) only files older
    than a day go: a build in progress may own younger ones. Every committed version stays whole."""
    from dsbuild.lineage.catalog import open_catalog
    from dsbuild.lineage.gc import collect

    o = Out(as_json, quiet)
    g = collect(open_catalog(path), dry_run=dry_run)
    if as_json:
        return o.json(g)
    verb = "would remove" if dry_run else "removed"
    o.table(
        ["action", "kind", "what", "bytes"],
        [(verb, "shard", s["path"], s["bytes"]) for s in g["shards"]]
        + [(verb, "stale build", b, "") for b in g["stale_builds"]]
        + [(verb, "unpublished", k, "") for k in g["unpublished_files"]]
        + [(verb, "replaced split set", k, "") for k in g["replaced_split_files"]]
        + [(verb, "interrupted write", k, "") for k in g["interrupted_writes"]]
        + [("kept (younger than the grace period)", "shard", k, "") for k in g["kept_young_shards"]]
        + [("kept (a push in progress holds it)", "shard", k, "") for k in g["kept_held_shards"]]
        + [
            ("kept its split sets (unreadable: which one is live?)", "split set pointer", k, "")
            for k in g["unreadable_split_pointers"]
        ],
    )
    o.line(
        f"{len(g['shards'])} shards ({g['bytes']:,} bytes), {len(g['stale_builds'])} stale build folders, "
        f"{len(g['unpublished_files'])} unpublished, {len(g['replaced_split_files'])} replaced split set and "
        f"{len(g['interrupted_writes'])} interrupted-write files "
        f"{'to remove' if dry_run else 'removed'}"
    )


def register(app: typer.Typer) -> None:
    app.command("gc", epilog=EXAMPLES)(gc)

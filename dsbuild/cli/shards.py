"""`dsbuild shards`: a version's shard files (or URLs) in order, one per line, for other readers."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild shards catalog@gold > shards.txt
  python -c "import webdataset as wds; print(sum(1 for _ in wds.WebDataset(open('shards.txt').read().split())))"
  dsbuild shards s3://datasets/cat --split main/train --urls
  dsbuild shards catalog --split main/val --materialize exports/val-tars"""


def shards(
    ref: str = REF,
    split: str = typer.Option(
        None,
        "--split",
        metavar="NAME/SPLIT",
        help="Only this split's samples: its shards, refused if one also holds other splits' (see --materialize).",
    ),
    materialize: str = typer.Option(
        None,
        "--materialize",
        metavar="DIR",
        help="With --split: write the split's own tars into DIR (catalog shards holding only it are linked) "
        "and list those.",
    ),
    urls: bool = typer.Option(False, "--urls", help="Print URLs (file:// for a local catalog) instead of paths."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Print a version's shard paths or URLs, one per line.

    Paths for a local catalog, URLs for an object store (or with --urls), in the version's order:
    content-addressed names cannot be written as a brace range, so hand this list to webdataset or wids.
    Every listed file holds only the split's samples."""
    from dsbuild.core.errors import UsageError
    from dsbuild.export.materialize import materialize_split
    from dsbuild.lineage.catalog import open_ref, parse_ref
    from dsbuild.lineage.history import shard_locations
    from dsbuild.lineage.verify import check_shards

    o = Out(as_json, quiet)
    if materialize is not None and split is None:
        raise UsageError("--materialize needs --split NAME/SPLIT: a version's own shards are listed without it")
    catalog, version = open_ref(ref)
    if materialize is not None:  # (the export checks the shards it reads)
        found = materialize_split(f"{parse_ref(ref)[0]}@{version}", split, materialize)
    else:
        found = shard_locations(catalog, version, split=split)
        # every listed shard is checked as `verify` checks it; an object store's come through the local
        # cache to be read (fetched once, hashed on arrival), as an export's and the loader's do
        listed = {s.sha256 for s in found}
        check_shards(catalog, version, [r for r in catalog.manifest(version).shards if r.sha256 in listed])
    if as_json:
        return o.json(
            {
                "version_id": version,
                "split": split,
                "materialized": materialize,
                "shards": [s.to_json() for s in found],
                "shardlist": [{"url": s.url, "nsamples": s.in_split} for s in found],
            }
        )
    for s in found:
        o.value(s.url if urls or s.path is None else s.path)


def register(app: typer.Typer) -> None:
    app.command("shards", epilog=EXAMPLES)(shards)

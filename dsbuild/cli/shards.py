"""`dsbuild shards`: a version's shard files (or URLs) in order, one per line, for other readers."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild shards catalog@gold > shards.txt
  python -c "import webdataset as wds; print(sum(1 for _ in wds.WebDataset(open('shards.txt').read().split())))"
  dsbuild shards s3://datasets/cat --split main/train --urls"""


def shards(
    ref: str = REF,
    split: str = typer.Option(
        None,
        "--split",
        metavar="NAME/SPLIT",
        help="Only shards holding samples of this split (shards may also hold other splits).",
    ),
    urls: bool = typer.Option(False, "--urls", help="Print URLs (file:// for a local catalog) instead of paths."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Print a version's shard paths or URLs, one per line.

    Paths for a local catalog, URLs for an object store (or with --urls), in the version's order:
    content-addressed names cannot be written as a brace range, so hand this list to webdataset or wids."""
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.history import shard_locations
    from dsbuild.lineage.verify import check_shards

    o = Out(as_json, quiet)
    catalog, version = open_ref(ref)
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
                "shards": [s.to_json() for s in found],
                "shardlist": [{"url": s.url, "nsamples": s.samples} for s in found],
            }
        )
    for s in found:
        o.value(s.url if urls or s.path is None else s.path)
    mixed = sum(s.in_split < s.samples for s in found)
    if split and mixed and not quiet:
        o.note(
            f"note: {mixed} of {len(found)} shards also hold samples of other splits; keep only the keys of "
            f"{split} (e.g. from `dsbuild query`) when reading them"
        )


def register(app: typer.Typer) -> None:
    app.command("shards", epilog=EXAMPLES)(shards)

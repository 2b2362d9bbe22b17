"""LitData: per split, an ``index.json`` and ``chunk-0-N.bin`` files (its PyTree chunk format), read with
``litdata.StreamingDataset(input_dir="DEST/<split>")``.

Chunks are written rather than pointing LitData's ``ParquetLoader`` at a Parquet version in place: a
split set's samples are spread over shards shared with other splits, a tar version has no Parquet to
point at, and one layout for every version keeps the items the same. Items are dicts of the sample's
canonical members under their tar names plus ``__key__``: ``json`` decodes to a dict, the other members
are the exact bytes the version holds (LitData returns ``bytes`` leaves as memoryviews).
"""

from __future__ import annotations

import json

from dsbuild import __version__
from dsbuild.core.hashing import sha256_json
from dsbuild.core.jsonio import pretty_json
from dsbuild.export.chunks import KEY, sample_file
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.formats.sample import MEMBERS

LEAVES = {KEY: "str", "json": "json", **{m: "bytes" for m in MEMBERS if m != "json"}}  # item order


def _data_spec() -> str:
    """torch's ``treespec_dumps`` of a flat dict with these keys (what LitData's writer records)."""
    leaf: dict[str, object] = {"type": None, "context": None, "children_spec": []}
    return json.dumps(
        [1, {"type": "builtins.dict", "context": json.dumps(list(LEAVES)), "children_spec": [leaf] * len(LEAVES)}]
    )


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    config = {
        "chunk_bytes": target,
        "chunk_size": None,
        "compression": None,
        "encryption": None,
        "data_format": list(LEAVES.values()),
        "data_spec": _data_spec(),
        "item_loader": "PyTreeLoader",
    }
    for split in source.splits:
        chunks = []
        for n, group in enumerate(source.chunks(split.entries(), target)):
            name = f"chunk-0-{n}.bin"
            rel = f"{split.name}/{name}"
            if not folder.has(rel):
                folder.adopt(rel, sample_file(source, group, list(LEAVES), folder.temp(f"{split.name}-{name}")))
            tick(len(group))
            chunks.append(
                {
                    "chunk_bytes": folder.path(rel).stat().st_size,
                    "chunk_size": len(group),
                    "dim": None,
                    "filename": name,
                }
            )
        # LitData names its local cache of a remote dataset by ``updated_at`` (its writer records the time):
        # one that stays the same across two publishes at one URL is served stale from that cache. Ours
        # names what the chunks hold, so the same export keeps its cache and another one never reuses it.
        updated = sha256_json(
            {
                "version": source.version_id,
                "split_hash": source.split_hash,
                "split": split.name,
                "chunk_bytes": target,
                "dsbuild": __version__,
            }
        )[:20]
        folder.put(f"{split.name}/index.json", pretty_json({"chunks": chunks, "config": config, "updated_at": updated}))

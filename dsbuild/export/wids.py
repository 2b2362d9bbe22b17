"""wids: one shard-list JSON per split, read with ``wids.ShardListDataset("DEST/<split>.json")``.

    DEST/<split>.json                    {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [...]}
    DEST/shards/<split>/<sha256>.tar     relative symlink to the catalog's shard (or a written tar)

wids maps a sample index to a shard by each entry's ``nsamples`` and reads every sample of a listed
tar, so a listed tar must hold exactly the split's samples: catalog shards shared by several splits are
written anew for each (a version without a split set links every shard). URLs are relative to the
JSON's folder and links relative to the catalog: the folder moves with its catalog, or alone once copied
with its links resolved.
"""

from __future__ import annotations

from dsbuild.core.jsonio import pretty_json
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.export.tars import split_tars


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    for split in source.splits:
        tars = split_tars(source, split, folder, tick, target=target)
        doc = {
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": f"{source.version_id[:12]}-{split.name}",
            "shardlist": [{"url": t.rel, "nsamples": len(t.samples)} for t in tars],
        }
        folder.put(f"{split.name}.json", pretty_json(doc))

"""Mosaic Streaming (MDS): per split, an ``index.json`` and ``shard.NNNNN.mds`` files, read with
``StreamingDataset(local=DEST, split="train")``.

Columns are the sample's canonical members under their tar names (``json``, ``mp4``, ``actions.npy``,
...) plus ``__key__``: ``json`` decodes to a dict, every other member stays the exact bytes the version
holds (``numpy.load`` reads the ``.npy`` members; MDS's own ``ndarray`` encoding cannot hold the empty
arrays of a session without telemetry). Shards are uncompressed, so Streaming reads them in place.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types

from dsbuild.core.errors import MissingDependency
from dsbuild.core.jsonio import pretty_json
from dsbuild.export.chunks import KEY, sample_file
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.formats.sample import MEMBERS

ENCODINGS = {KEY: "str", "json": "json", **{m: "bytes" for m in MEMBERS if m != "json"}}
COLUMNS = sorted(ENCODINGS)  # MDS lists columns sorted by name


def _config(target: int) -> dict:
    return {
        "column_encodings": [ENCODINGS[c] for c in COLUMNS],
        "column_names": COLUMNS,
        "column_sizes": [None] * len(COLUMNS),
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": target,
        "version": 2,
    }


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    config = _config(target)
    header = json.dumps(config, sort_keys=True).encode()  # what MDSWriter embeds in each shard
    for split in source.splits:
        shards = []
        for n, group in enumerate(source.chunks(split.entries(), target)):
            name = f"shard.{n:05d}.mds"
            rel = f"{split.name}/{name}"
            if not folder.has(rel):
                folder.adopt(rel, sample_file(source, group, COLUMNS, folder.temp(f"{split.name}-{name}"), header))
            tick(len(group))
            shards.append(
                {
                    **config,
                    "raw_data": {"basename": name, "bytes": folder.path(rel).stat().st_size, "hashes": {}},
                    "samples": len(group),
                    "zip_data": None,
                }
            )
        folder.put(f"{split.name}/index.json", pretty_json({"shards": shards, "version": 2}))


def streaming_dataset():
    """Mosaic's ``StreamingDataset`` class, imported without ``streaming/__init__.py``: that file imports
    torchvision (``streaming.vision``) and transformers (``streaming.base.dataloader``) at import time,
    which MDS reading needs neither of. ``make`` installs both (torchvision 0.16.2, whose Python parts
    import beside the pinned CPU torch: docs/interop.md), so ``from streaming import StreamingDataset``,
    the same class, works there; this route keeps the bench's baseline where they are absent."""
    if "streaming.base.dataset" in sys.modules:
        return sys.modules["streaming.base.dataset"].StreamingDataset
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("reading an MDS export", "peers", "mosaicml-streaming")
    root = spec.submodule_search_locations[0]
    for name, path in (("streaming", root), ("streaming.base", f"{root}/base")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__, package.__package__ = [path], name
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)  # find_spec reads it
            package.__spec__.submodule_search_locations = [path]
            sys.modules[name] = package
    from streaming.base.dataset import StreamingDataset

    return StreamingDataset

"""NVIDIA DALI: each split's tars with the index files ``fn.readers.webdataset`` reads instead of scanning
every tar at start-up, and one JSON per split naming its arguments.

    DEST/<split>.json                    {"paths": [...], "index_paths": [...], "ext": [...], "samples": N}
    DEST/shards/<split>/<sha256>.tar     relative symlink to the catalog's shard (or a written tar)
    DEST/shards/<split>/<sha256>.idx     the index ``wds2idx`` (shipped with DALI) writes for that tar

The reader returns every sample of a listed tar, so a listed tar holds exactly the split's samples: as for
wids, a catalog shard shared by several splits is written anew for each. Paths in the JSON are relative to
its folder. An index is DALI's text format ``v1.2``: a ``v1.2 <samples>`` line, then one line per sample
of ``<ext> <data offset> <size> <member name>`` for each member, offsets pointing at the member's data
(its header skipped): byte for byte what ``wds2idx`` writes for the same tar, made from the catalog's
index without reading a tar.
"""

from __future__ import annotations

from dsbuild.core.jsonio import pretty_json
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.export.tars import TarFile, framed, split_tars
from dsbuild.formats.sample import MEMBERS
from dsbuild.formats.webdataset import payload_offsets

INDEX_VERSION = "v1.2"  # the version line wds2idx writes and fn.readers.webdataset reads
KIND = "dsbuild-dali/1"


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    for split in source.splits:
        tars = split_tars(source, split, folder, tick, target=target)
        index_paths = []
        for t in tars:
            rel = index_path(t.rel)
            if not folder.has(rel):
                folder.put(rel, wds_index(t))
            index_paths.append(rel)
        doc = {
            "kind": KIND,
            "version_id": source.version_id,
            "split": split.name,
            "samples": sum(len(t.samples) for t in tars),
            "paths": [t.rel for t in tars],
            "index_paths": index_paths,
            "ext": list(MEMBERS),
        }
        folder.put(f"{split.name}.json", pretty_json(doc))


def index_path(tar_rel: str) -> str:
    """``<name>.idx`` beside ``<name>.tar``: the name ``wds2idx`` gives when no index path is passed."""
    return tar_rel.removesuffix(".tar") + ".idx"


def wds_index(t: TarFile) -> bytes:
    """DALI's index of one tar, from the sizes the catalog's index recorded (every sample of the tar:
    DALI's reader has no per-sample exclude)."""
    lines = [f"{INDEX_VERSION} {len(t.samples)}"]
    for e in t.samples:
        offset, _, sizes = framed(e)
        lines.append(
            " ".join(
                f"{ext} {offset + at} {size} {e.key}.{ext}"
                for ext, at, size in zip(MEMBERS, payload_offsets(sizes), sizes)
            )
        )
    return ("\n".join(lines) + "\n").encode()

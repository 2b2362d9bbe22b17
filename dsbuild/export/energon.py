"""Megatron-Energon: a prepared WebDataset folder for one version, read with ``get_train_dataset(DEST,
split_part="train")`` / ``get_val_dataset(DEST, split_part="val")``.

    DEST/shards/<split>/<sha256>.tar        relative symlink to the catalog's shard (or a written tar)
    DEST/shards/<split>/<sha256>.tar.idx    each sample's header offset, then the end of the samples
    DEST/.nv-meta/dataset.yaml              CrudeWebdataset (cook samples in your TaskEncoder)
    DEST/.nv-meta/split.json                split parts, and the samples each part skips
    DEST/.nv-meta/.info.json                samples per listed tar
    DEST/.nv-meta/index.sqlite, index.uuid  what ``energon prepare`` writes (joins, metadataset v2)

One folder per version is what keeps keys unique (``energon prepare`` on a catalog's ``shards/`` sees
every version's samples). A catalog shard holding samples of several splits is listed once per split,
under that split's folder, and each listing excludes the other splits' samples
(``<tar>/<key>`` excludes): every shard byte is shared, none is copied. ``split.json`` rather than
``split.yaml``: Energon reads both, and JSON parses fast even with a long exclude list.
"""

from __future__ import annotations

import sqlite3
import struct
import uuid

from dsbuild.core.jsonio import pretty_json
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.export.tars import TarFile, framed, split_tars
from dsbuild.formats.sample import MEMBERS
from dsbuild.formats.webdataset import payload_offsets

ENERGON_VERSION = "7.4.1"  # the layout this writes is the one Energon 7.4 prepares
DATASET_YAML = b"""__module__: megatron.energon
__class__: CrudeWebdataset
subflavors:
  source: dsbuild
"""


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    parts: dict[str, list[str]] = {}
    tars: list[TarFile] = []
    for split in source.splits:
        files = split_tars(source, split, folder, tick, partial="link", target=target)
        parts[split.name] = [t.rel for t in files]
        tars += files
    tars.sort(key=lambda t: t.rel)  # .info.json's key order (sorted) numbers the tars in index.sqlite
    for t in tars:
        if not folder.has(f"{t.rel}.idx"):
            folder.put(f"{t.rel}.idx", _idx(t))
    exclude = sorted(f"{t.rel}/{key}" for t in tars for key in t.foreign)
    folder.put(".nv-meta/split.json", pretty_json({"exclude": exclude, "split_parts": parts}))
    folder.put(
        ".nv-meta/.info.json",
        pretty_json({"energon_version": ENERGON_VERSION, "shard_counts": {t.rel: len(t.samples) for t in tars}}),
    )
    folder.put(".nv-meta/dataset.yaml", DATASET_YAML)
    db = folder.temp("index.sqlite")
    _sqlite(db, tars)
    folder.adopt(".nv-meta/index.sqlite", db)
    # Energon regenerates the uuid whenever the index changes; ours is a function of what was exported.
    name = f"dsbuild:{source.version_id}:{source.split_hash or ''}:{source.split_set or ''}"
    folder.put(".nv-meta/index.uuid", str(uuid.uuid5(uuid.NAMESPACE_URL, name)).encode())


def _idx(t: TarFile) -> bytes:
    """Energon's ``.tar.idx``: native uint64 header offset of every sample, then where the samples end."""
    offsets = [framed(e)[0] for e in t.samples]
    _, length, _ = framed(t.samples[-1])
    offsets.append(offsets[-1] + length)
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def _sqlite(path, tars: list[TarFile]) -> None:
    """The sample and part tables ``energon prepare`` writes; excluded samples are left out, so every
    key appears once although a shard may be listed under several splits."""
    con = sqlite3.connect(path)
    try:
        con.executescript("""
            PRAGMA journal_mode = OFF;
            CREATE TABLE samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE,
                                  sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER);
            CREATE TABLE sample_parts (tar_file_id INTEGER NOT NULL, sample_index INTEGER NOT NULL,
                                       part_name TEXT NOT NULL, content_byte_offset INTEGER,
                                       content_byte_size INTEGER);
        """)
        for tar_id, t in enumerate(tars):
            for i, e in enumerate(t.samples):
                if e.key in t.foreign:
                    continue
                offset, length, sizes = framed(e)
                con.execute("INSERT INTO samples VALUES (?, ?, ?, ?, ?)", (tar_id, e.key, i, offset, length))
                con.executemany(
                    "INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)",
                    [
                        (tar_id, i, name, offset + at, size)
                        for name, at, size in zip(MEMBERS, payload_offsets(sizes), sizes)
                    ],
                )
        con.executescript("""
            CREATE INDEX idx_samples_by_tar_and_idx ON samples (tar_file_id, sample_index);
            CREATE INDEX idx_sample_parts_seq ON sample_parts (tar_file_id, sample_index, content_byte_offset);
            CREATE INDEX idx_sample_parts_full ON sample_parts (tar_file_id, sample_index, part_name,
                                                               content_byte_offset, content_byte_size);
        """)
        con.commit()
    finally:
        con.close()

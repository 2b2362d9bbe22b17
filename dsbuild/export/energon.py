"""Megatron-Energon: a prepared WebDataset folder for one version, read with ``get_train_dataset(DEST,
split_part="train")`` / ``get_val_dataset(DEST, split_part="val")``.

    DEST/shards/<split>/<sha256>.tar        relative symlink to the catalog's shard (or a written tar)
    DEST/shards/<split>/<sha256>.tar.idx    each sample's header offset, then the end of the samples
    DEST/.nv-meta/split.yaml                each split part's tars, in key order (``prepare`` sorts them by name)
    DEST/.nv-meta/.info.json                samples per tar
    DEST/.nv-meta/index.sqlite, index.uuid  the sample and part tables (joins, metadataset v2)
    DEST/.nv-meta/dataset.yaml              typed: ``ClipSample`` (dsbuild.export.energon_sample) and its field map
    DEST/.nv-meta/crude.yaml                CrudeWebdataset, for a task encoder that cooks the raw parts itself

That is what ``energon prepare`` writes for the same tars (the same files and contents; its uuid Energon
draws at random, dsbuild derives from what was exported), so ``energon info`` and ``energon
lint`` accept the folder. One tar set per split: Energon's ``len()`` and its partition of samples over
ranks and workers count whole tars, so a split's tars hold exactly its samples. A catalog shard holding one
split's samples only is linked (no byte copied); the samples of shards shared by several splits are
written into tars of the split's own (as for wids). One folder per version keeps keys unique (``energon
prepare`` on a catalog's ``shards/`` sees every version's samples).

The two dataset configs are the user's once written: an edited one is kept as it is on a re-export (which
says so), never written over.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import uuid
from pathlib import Path

from dsbuild.core.jsonio import pretty_json
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.export.tars import TarFile, framed, split_tars
from dsbuild.formats.sample import MEMBERS
from dsbuild.formats.webdataset import payload_offsets

ENERGON_VERSION = "7.4.1"  # the layout this writes is the one Energon 7.4 prepares
# Energon's default decoder turns each part into a Python value by its extension: json -> dict, mp4 ->
# an AVDecoder (decoded when asked), npy -> ndarray; events.jsonl.zst stays bytes.
TYPED_YAML = b"""sample_type:
  __module__: dsbuild.export.energon_sample
  __class__: ClipSample
field_map:
  video: mp4
  meta: json
  actions: actions.npy
  telemetry: telemetry.npy
  timestamps: timestamps.npy
  events: events.jsonl.zst
  controls: json[controls]
  telemetry_channels: json[telemetry_channels]
  text: json[text]
subflavors:
  source: dsbuild
"""
CRUDE_YAML = b"""__module__: megatron.energon
__class__: CrudeWebdataset
subflavors:
  source: dsbuild
"""
# The dataset configs a user may edit (``get_train_dataset(..., dataset_config="crude.yaml")`` reads the other)
USER_FILES = {".nv-meta/dataset.yaml": TYPED_YAML, ".nv-meta/crude.yaml": CRUDE_YAML}


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    parts: dict[str, list[str]] = {}
    tars: list[TarFile] = []
    for split in source.splits:
        files = split_tars(source, split, folder, tick, target=target)
        parts[split.name] = [t.rel for t in files]
        tars += files
    tars.sort(key=lambda t: t.rel)  # .info.json's key order (sorted) numbers the tars in index.sqlite
    for t in tars:
        if not folder.has(f"{t.rel}.idx"):
            folder.put(f"{t.rel}.idx", _idx(t))
    folder.put(".nv-meta/split.yaml", split_yaml(parts))
    folder.put(
        ".nv-meta/.info.json",
        # (json.dump's layout, which ends without a newline)
        pretty_json({"energon_version": ENERGON_VERSION, "shard_counts": {t.rel: len(t.samples) for t in tars}})[:-1],
    )
    for rel, data in USER_FILES.items():
        folder.put(rel, data)  # (one the user edited is kept: ExportFolder's editable files)
    db = folder.temp("index.sqlite")
    _sqlite(db, tars)
    folder.adopt(".nv-meta/index.sqlite", db)
    # Energon regenerates the uuid whenever the index changes; ours is a function of what was exported.
    name = f"dsbuild:{source.version_id}:{source.split_hash or ''}:{source.split_set or ''}"
    folder.put(".nv-meta/index.uuid", str(uuid.uuid5(uuid.NAMESPACE_URL, name)).encode())


def split_yaml(parts: dict[str, list[str]]) -> bytes:
    """``split.yaml`` as ``energon prepare`` lays it out, every string double-quoted (JSON's quoting is
    YAML's: a split named ``yes`` or ``1`` stays a string)."""
    lines = ["split_parts:"]
    for name, tars in parts.items():
        lines.append(f"  {json.dumps(name)}:" + ("" if tars else " []"))
        lines += [f"  - {json.dumps(rel)}" for rel in tars]
    return ("\n".join(lines) + "\n").encode()


def _idx(t: TarFile) -> bytes:
    """Energon's ``.tar.idx``: native uint64 header offset of every sample, then where the samples end."""
    offsets = [framed(e)[0] for e in t.samples]
    _, length, _ = framed(t.samples[-1])
    offsets.append(offsets[-1] + length)
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def _sqlite(path: Path, tars: list[TarFile]) -> None:
    """The sample and part tables ``energon prepare`` writes (its DDL and indexes, rows in tar order)."""
    con = sqlite3.connect(path)
    try:
        con.executescript("""
            PRAGMA journal_mode = OFF;
            CREATE TABLE samples (
                    tar_file_id INTEGER NOT NULL,
                    sample_key TEXT NOT NULL UNIQUE,
                    sample_index INTEGER NOT NULL,
                    byte_offset INTEGER,
                    byte_size INTEGER
                );
            CREATE TABLE sample_parts (
                    tar_file_id INTEGER,
                    sample_index INTEGER,
                    part_name TEXT,
                    content_byte_offset INTEGER,
                    content_byte_size INTEGER
                );
        """)
        for tar_id, t in enumerate(tars):
            for i, e in enumerate(t.samples):
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
            CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index);
            CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset);
        """)
        con.execute(  # (Energon's DDL, whitespace included: the schema compares equal)
            "CREATE INDEX idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
            "content_byte_offset, content_byte_size)"
        )
        con.commit()
    finally:
        con.close()

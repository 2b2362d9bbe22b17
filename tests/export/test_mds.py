"""Mosaic Streaming reads the MDS export in place: every member byte-for-byte as the version holds it."""

from __future__ import annotations

import struct

import pytest

from dsbuild.core.errors import MissingDependency
from dsbuild.export.chunks import KEY
from dsbuild.export.mds import COLUMNS, streaming_dataset
from dsbuild.formats.sample import MEMBERS, members_sha256
from dsbuild.lineage.catalog import Catalog

from .conftest import SPLITS
from .peers import check_samples


def test_streaming_dataset_reads_every_split(exported, expected):
    try:
        StreamingDataset = streaming_dataset()
    except MissingDependency as e:
        pytest.skip(f"{e} (make test installs it)")
    root = exported("mds")
    for split in SPLITS:
        ds = StreamingDataset(local=str(root), split=split, shuffle=False, batch_size=1)
        rows = [ds[i] for i in range(len(ds))]
        assert [r["__key__"] for r in rows] == sorted(expected[split])  # key order, shuffle off
        check_samples({r["__key__"]: (r["json"], r["mp4"]) for r in rows}, expected[split])
        assert all(isinstance(r[m], bytes) for r in rows for m in MEMBERS if m != "json")


def test_mds_members_hash_to_the_sample_hash(exported, export_catalog):
    """Read the shard files back by MDS's layout: each item's members are the version's exact bytes."""
    cat, vid = export_catalog
    hashes = dict(zip(*Catalog.open(cat).index(vid, ["key", "sha256"]).to_pydict().values()))
    seen = 0
    for shard in sorted(exported("mds").rglob("shard.*.mds")):
        data = shard.read_bytes()
        (n,) = struct.unpack_from("<I", data)
        offsets = struct.unpack_from(f"<{n + 1}I", data, 4)
        assert offsets[-1] == len(data)
        for a, b in zip(offsets, offsets[1:]):
            sizes = struct.unpack_from(f"<{len(COLUMNS)}I", data, a)
            pos, fields = a + 4 * len(COLUMNS), {}
            for c, size in zip(COLUMNS, sizes):
                fields[c] = data[pos : pos + size]
                pos += size
            assert pos == b
            key = fields[KEY].decode()
            assert members_sha256([(m, fields[m]) for m in MEMBERS]) == hashes[key]
            seen += 1
    assert seen == len(hashes)

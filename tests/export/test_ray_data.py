"""Ray Data in and out, on a local Ray: read a split, re-encode every clip in ``map_batches``, write it
back as a derived version, verify it, load it, follow its lineage (and a chain) to the capture files."""

from __future__ import annotations

import io
import json
import shutil
import sys

import numpy as np
import pytest

from dsbuild.convert.derive import DerivedSample, derive
from dsbuild.formats import get_format
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.history import sample_lineage
from dsbuild.lineage.index import entries_by_shard
from dsbuild.lineage.verify import verify

from .peers import decoded_frames, peer

SIZE = (64, 48)


def reencode(batch: dict) -> dict:
    """Every clip re-encoded to 64x48 H.264 (all frames kept, so per-frame arrays still line up)."""
    import av

    videos, metas = [], []
    for video, meta in zip(batch["video"], batch["meta"]):
        doc = json.loads(meta)
        out = io.BytesIO()
        with av.open(io.BytesIO(video)) as src, av.open(out, "w", format="mp4") as dst:
            stream = dst.add_stream("libx264", rate=30)
            stream.width, stream.height, stream.pix_fmt = *SIZE, "yuv420p"
            stream.options = {"preset": "ultrafast", "threads": "1"}
            for frame in src.decode(video=0):
                for packet in stream.encode(frame.reformat(*SIZE, format="yuv420p")):
                    dst.mux(packet)
            for packet in stream.encode():
                dst.mux(packet)
        videos.append(out.getvalue())
        doc["video"].update(width=SIZE[0], height=SIZE[1], codec="h264")
        metas.append(json.dumps(doc))
    batch["video"] = np.array(videos, dtype=object)
    batch["meta"] = np.array(metas, dtype=object)
    return batch


@pytest.fixture(scope="module")
def ray_session():
    ray = peer("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the test package
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_a_ray_pipeline_commits_a_derived_version_whose_lineage_reaches_the_captures(
    ray_session, export_catalog, expected, tmp_path
):
    import dsbuild.ray as dray

    src, parent = export_catalog
    cat = tmp_path / "catalog"
    shutil.copytree(src, cat, symlinks=True)
    keys = sorted(expected["train"])

    ds = dray.read_version(f"{cat}@v1", split="main/train")
    assert [r["key"] for r in ds.iter_rows()] == keys  # one task per shard, key order kept
    assert ds.count() == len(keys)

    r = dray.write_version(
        ds.map_batches(reencode, batch_format="numpy", batch_size=3),
        cat,
        parent="v1",
        transform={"name": "reencode", "size": list(SIZE)},
    )
    assert (r.parent, r.samples, r.existed) == (parent, len(keys), False)
    # The same rows, partitioned differently by Ray, give the same version.
    again = dray.write_version(
        dray.read_version(f"{cat}@v1", split="main/train").map_batches(reencode, batch_format="numpy", batch_size=1),
        cat,
        parent="v1",
        transform={"name": "reencode", "size": list(SIZE)},
    )
    assert again.version_id == r.version_id and again.existed
    catalog = Catalog.open(cat)
    assert verify(catalog, r.version_id).ok
    assert catalog.commit_record(r.version_id).parent == parent

    # Loaded through the format layer: re-encoded clips that decode, every frame, metadata kept.
    m = catalog.manifest(r.version_id)
    index = catalog.index(r.version_id)
    assert index.column("parent_version").to_pylist() == [parent] * len(keys)
    assert index.column("parent_key").to_pylist() == keys
    by_shard = entries_by_shard(index)
    for rec in m.shards:
        with get_format(m.shard_format).reader(catalog.shard_file(rec)) as reader:
            for e in by_shard[rec.path]:
                s = reader.read(e)
                assert (s.meta.video.width, s.meta.video.height) == SIZE
                assert decoded_frames(s.video) == s.meta.clip.frames == len(s.actions)
                assert s.meta.session.conditions == expected["train"][s.key]["conditions"]

    # A chain: a version derived from the derived one, in process; lineage walks both steps back.
    def keep_first_clips():
        for rec in m.shards:
            with get_format(m.shard_format).reader(catalog.shard_file(rec)) as reader:
                for e in by_shard[rec.path]:
                    if e.key.endswith("__000000"):
                        yield DerivedSample(reader.read(e), e.key)

    grand = derive(catalog, r.version_id, keep_first_clips(), {"name": "first clips"})
    key = keys[0]
    info = sample_lineage(catalog, grand.version_id, key)
    assert [(d["version_id"], d["key"]) for d in info["derived_from"]] == [(r.version_id, key), (parent, key)]
    assert info["derived_from"][0]["config"]["transform"] == {"name": "reencode", "size": list(SIZE)}
    session = key.rsplit("__", 1)[0]
    roles = {s["role"] for s in info["sources"]}
    assert {"session", "video", "actions", "telemetry"} <= roles
    assert all(s["path"].startswith(f"{session}/") for s in info["sources"])
    capture_shas = {s["path"]: s["sha256"] for s in sample_lineage(catalog, parent, key)["sources"]}
    assert {s["path"]: s["sha256"] for s in info["sources"]} == capture_shas

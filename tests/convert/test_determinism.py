"""Same captures + same config => byte-identical shards, manifest and version id, whatever the worker
count, the absolute path of the captures, file mtimes, or an interrupted earlier attempt."""

from __future__ import annotations

import dataclasses
import os

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats.video import decoded_frame_count
from dsbuild.formats.webdataset import parse_members
from dsbuild.lineage.catalog import Catalog
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from tests.helpers import index_rows, tree_bytes

CONFIG = ConvertConfig(clip_seconds=3.0, shard_size=300_000)


def test_workers_paths_and_mtimes_do_not_change_a_byte(copy_captures, tmp_path):
    a, b = copy_captures("first"), copy_captures("elsewhere/second")
    for p in b.rglob("*"):
        os.utime(p, (1_000_000_000, 1_000_000_000), follow_symlinks=False)
    r1 = convert(a, tmp_path / "c1", CONFIG, executor=ExecutorSpec(workers=1))
    r2 = convert(b, tmp_path / "c2", CONFIG, executor=ExecutorSpec(workers=2))
    assert r1.version_id == r2.version_id and r1.content_id == r2.content_id
    assert r1.shards >= 3  # shards follow the 300 kB target across sessions
    assert tree_bytes(tmp_path / "c1") == tree_bytes(tmp_path / "c2")


def test_reconverting_into_the_same_catalog_is_a_no_op(copy_captures, tmp_path):
    src = copy_captures()
    first = convert(src, tmp_path / "cat", CONFIG, executor=ExecutorSpec(workers=1))
    again = convert(src, tmp_path / "cat", CONFIG, executor=ExecutorSpec(workers=1))
    assert (again.version_id, again.existed) == (first.version_id, True)
    assert len(Catalog.open(tmp_path / "cat").versions()) == 1
    assert again.parent is None  # its commit's (it reused itself: it was reported as its own parent)


def test_other_codecs_and_variable_frame_rate_are_cut_by_timestamps(tmp_path):
    videos = [
        VideoSpec(160, 120, 30, 30, codec="vp9"),
        VideoSpec(160, 120, 30, 30, codec="av1"),
        VideoSpec(160, 120, 30, 30, codec="hevc"),
        VideoSpec(160, 120, 30, 30, vfr_jitter=0.4),
    ]
    specs = [dataclasses.replace(session_spec(5, i, 4), video=v) for i, v in enumerate(videos)]
    generate(tmp_path / "cap", sessions=4, seconds=4, seed=5, specs=specs)
    r = convert(tmp_path / "cap", tmp_path / "cat", ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=1))
    assert r.quarantined == () and r.sessions == 4
    rows = index_rows(tmp_path / "cat", r.version_id)
    assert {row["codec"] for row in rows} == {"vp9", "av1", "hevc", "h264"}
    for row in rows:
        with open(tmp_path / "cat" / row["shard"], "rb") as f:
            f.seek(row["byte_offset"])
            video = dict(parse_members(f.read(row["byte_length"])))["mp4"]
        assert decoded_frame_count(video) == row["frames"]
        assert 1.5 <= row["t_end"] - row["t_start"] <= 2.5 or row["clip_index"] == 1


def test_keyframe_interval_longer_than_the_clip_gives_a_longer_clip_counted(tmp_path):
    spec = dataclasses.replace(session_spec(1, 0, 6), video=VideoSpec(160, 120, 30, 150))  # keyframe every 5 s
    generate(tmp_path / "cap", sessions=1, seconds=6, seed=1, specs=[spec])
    r = convert(tmp_path / "cap", tmp_path / "cat", ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=1))
    rows = index_rows(tmp_path / "cat", r.version_id)
    assert [round(x["t_end"] - x["t_start"], 3) for x in rows] == [5.0, 1.0]
    assert r.long_clips == 1

"""`dsbuild import lerobot` on datasets written by the real ``lerobot`` writer (sample_data/lerobot, made by
its make.py: v2.1 by lerobot 0.3.3, v3.0 by 0.4.4), through the real executable; values and times are
checked against the source parquet read with pyarrow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli.clitools import run

DATA = Path(__file__).resolve().parents[2] / "sample_data" / "lerobot"
FPS = 10
LENGTHS = {0: 12, 1: 15, 2: 10}
TASKS = {0: "pick the red cube", 1: "push the block to the left", 2: "pick the red cube"}
CAMERAS = ["observation.images.front", "observation.images.wrist"]

pytest.importorskip("av", reason="needs PyAV")


def _source_rows(version: str) -> dict[int, dict[str, np.ndarray]]:
    """episode -> timestamp, observation.state, action of the dataset's parquet, as the writer stored them."""
    tables = [pq.read_table(p) for p in sorted((DATA / version / "data").rglob("*.parquet"))]
    out = {}
    for ep in LENGTHS:
        rows = [
            r
            for t in tables
            for r in t.select(["episode_index", "timestamp", "observation.state", "action"]).to_pylist()
        ]
        mine = [r for r in rows if r["episode_index"] == ep]
        out[ep] = {
            k: np.array([r[k] for r in mine], dtype=np.float32) for k in ("timestamp", "observation.state", "action")
        }
    return out


@pytest.fixture(scope="module", params=["v21", "v30"])
def imported(request, tmp_path_factory):
    """(version, captures, catalog, the import's report): imported, converted and validated once."""
    version = request.param
    tmp = tmp_path_factory.mktemp(f"lerobot-{version}")
    report = json.loads(run("import", "lerobot", DATA / version, tmp / "caps", "--title", "Reach", "--json").stdout)
    run("convert", tmp / "caps", tmp / "cat", "--clip-seconds", "1", "--strict", "-q")
    run("validate", tmp / "cat", "--level", "full", "-q")
    return version, tmp / "caps", tmp / "cat", report


def test_each_episode_is_a_session_with_its_task_robot_and_cameras(imported):
    version, caps, _, report = imported
    assert report["failed"] == [] and report["dropped"] == {} and report["guessed"] == {}
    assert [s["session_id"] for s in report["sessions"]] == ["episode_000000", "episode_000001", "episode_000002"]
    for ep, s in enumerate(report["sessions"]):
        assert (s["actions"], s["telemetry"]) == (2 * LENGTHS[ep], LENGTHS[ep])
        doc = json.loads((caps / s["session_id"] / "session.json").read_text())
        assert doc["player"] == "synthetic_arm" and doc["conditions"] == {"task": TASKS[ep]}
        assert doc["lerobot"] == {
            "codebase_version": {"v21": "v2.1", "v30": "v3.0"}[version],
            "episode_index": ep,
            "fps": FPS,
            "cameras": CAMERAS,
        }
        assert doc["controls"] == {"action.0": {"kind": "continuous"}, "action.1": {"kind": "continuous"}}
        text = [json.loads(line) for line in (caps / s["session_id"] / "text.jsonl").read_text().splitlines()]
        assert text == [{"t": 0.0, "text": TASKS[ep]}]

    import av

    with av.open(str(caps / "episode_000001" / "video.mp4")) as c:
        streams = c.streams.video
        assert [(s.codec_context.name, s.width, s.height, s.frames) for s in streams] == [("h264", 64, 64, 15)] * 2
        times = [float(f.pts * f.time_base) for f in c.decode(streams[0])]
    assert times == [k / FPS for k in range(15)]  # (v3.0: cut out of the shared file, from 1.2 s on)


def test_each_version_loads_with_actions_and_telemetry_intact(imported):
    version, _, cat, _ = imported
    from dsbuild.loader import Loader

    source = _source_rows(version)
    loader = Loader(str(cat), decode="bytes", batch_size=1, shuffle="none").open()
    controls, channels = list(loader.controls), list(loader.channels)
    assert set(controls) == {"action.0", "action.1"}
    seen: dict[int, list[float]] = {ep: [] for ep in LENGTHS}
    for batch in loader:
        ep = int(batch["keys"][0].split("__")[0].removeprefix("episode_"))
        n = int(batch["lengths"][0])
        ts = batch["timestamps"][0, :n]
        rows = np.round(ts * FPS).astype(int)
        seen[ep] += ts.tolist()
        src = source[ep]
        np.testing.assert_array_equal(np.float32(ts), src["timestamp"][rows])  # the writer's float32 times
        for j in range(2):
            np.testing.assert_array_equal(
                batch["actions"][0, :n, controls.index(f"action.{j}")], src["action"][rows, j]
            )
        for j in range(3):
            col = channels.index(f"observation.state.{j}")
            np.testing.assert_array_equal(batch["telemetry"][0, :n, col], src["observation.state"][rows, j])
    assert {ep: len(ts) for ep, ts in seen.items()} == LENGTHS  # every frame of every episode
    assert max(np.abs(src["action"]).max() for src in source.values()) > 1  # robot units, kept beyond [-1, 1]


def test_importing_twice_gives_byte_identical_captures(imported, tmp_path):
    from dsbuild.importers.lerobot import LeRobotImport, import_lerobot

    version, caps, _, _ = imported
    import_lerobot(DATA / version, tmp_path / "again", LeRobotImport(title="Reach"))
    files = sorted(p.relative_to(caps) for p in caps.rglob("*") if p.is_file())
    assert sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file()) == files
    assert len(files) == 15
    for p in files:
        assert (caps / p).read_bytes() == (tmp_path / "again" / p).read_bytes(), p


@given(st.integers(1, 120), st.integers(0, 7200 * 120), st.floats(-0.4, 0.4))
def test_a_stored_timestamp_is_its_frame_on_the_fps_grid_and_an_off_grid_one_is_refused(fps, k, off):
    from dsbuild.importers.lerobot import GRID, grid

    k = k % (7200 * fps)  # up to two hours into an episode
    assert grid(float(np.float32(k / fps)), fps) == (k, False)  # as the writer stores it: exact
    moved = k / fps + off * GRID  # (within the tolerance: moved onto the grid, counted)
    if np.float32(moved) != np.float32(k / fps) and moved >= 0:
        assert grid(moved, fps) == (k, True)
    assert grid(k / fps + 0.4 / fps, fps) == (None, False)  # 0.4 of a frame off: no frame's time
    assert grid(float("nan"), fps) == grid(-1.0, fps) == grid(True, fps) == (None, False)


def test_an_unsupported_lerobot_version_is_refused_naming_it(tmp_path):
    src = tmp_path / "old"
    shutil.copytree(DATA / "v21", src)
    info = json.loads((src / "meta" / "info.json").read_text())
    (src / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    p = run("import", "lerobot", src, tmp_path / "caps", check=2)
    assert "meta/info.json: codebase_version 'v2.0' is not supported; supported: v2.1, v3.0" in p.stderr
    assert not (tmp_path / "caps").exists()


def test_a_missing_video_and_a_corrupt_parquet_are_named_and_the_rest_imported(tmp_path):
    src = tmp_path / "broken"
    shutil.copytree(DATA / "v21", src)
    (src / "videos" / "chunk-000" / "observation.images.front" / "episode_000001.mp4").unlink()
    (src / "data" / "chunk-000" / "episode_000002.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    p = run("import", "lerobot", src, tmp_path / "caps", "--strict", "--json", check=1)
    rep = json.loads(p.stdout)
    assert [s["session_id"] for s in rep["sessions"]] == ["episode_000000", "episode_000001"]
    assert rep["failed"][0]["file"] == "data/chunk-000/episode_000002.parquet"
    assert rep["failed"][0]["reason"].startswith("episode 2: not a readable parquet file")
    assert rep["dropped"] == {"cameras": 1}
    assert rep["sessions"][1]["problems"] == [
        "data/chunk-000/episode_000001.parquet: observation.images.front: "
        "videos/chunk-000/observation.images.front/episode_000001.mp4: no such file"
    ]
    doc = json.loads((tmp_path / "caps" / "episode_000001" / "session.json").read_text())
    assert doc["lerobot"]["cameras"] == ["observation.images.wrist"]  # the picture feature still makes the video
    assert "--strict: 1 file(s) refused and 1 value(s) dropped" in p.stderr


def test_a_corrupt_v3_data_file_fails_every_episode_it_holds_naming_it(tmp_path):
    from dsbuild.core.errors import UsageError
    from dsbuild.importers.lerobot import LeRobotImport, import_lerobot

    src = tmp_path / "broken"
    shutil.copytree(DATA / "v30", src)
    (src / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"PAR1" * 8)
    with pytest.raises(UsageError, match=r"^data/chunk-000/file-000.parquet: episode 0: not a readable parquet file"):
        import_lerobot(src, tmp_path / "caps", LeRobotImport())
    assert not (tmp_path / "caps").exists() and not list(tmp_path.glob(".caps.*"))

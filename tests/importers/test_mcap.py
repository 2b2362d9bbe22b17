"""`dsbuild import mcap`, through the real executable, on files written by the real ``mcap`` writers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli.clitools import run, run_json
from tests.importers.mcapfiles import FPS, T0, commands, json_mcap, protobuf_mcap, ros2_mcap, states

pytest.importorskip("mcap", reason="needs the importers extra (mcap)")
TOPICS = {
    "json": ("/camera", "/state", "/cmd", "state/joint.position.{}", "cmd/target.{}"),
    "ros2": ("/camera/compressed", "/joint_states", "/cmd", "joint_states/position.{}", "cmd/data.{}"),
    "protobuf": ("/camera", "/state", "/cmd", "state/position.{}", "cmd/position.{}"),
}


def _make(kind: str, path: Path) -> Path:
    if kind == "ros2":
        pytest.importorskip("mcap_ros2", reason="needs mcap-ros2-support")
        return ros2_mcap(path)
    if kind == "protobuf":
        pytest.importorskip("mcap_protobuf", reason="needs mcap-protobuf-support")
        return protobuf_mcap(path)
    return json_mcap(path)


def _import(src: Path, out: Path, kind: str, *extra: str, **kw):
    video, telemetry, action, _, _ = TOPICS[kind]
    args = ["--video-topic", video, "--telemetry-topic", telemetry, "--action-topic", action, *extra]
    return run("import", "mcap", src, out, "--title", "Reach", "--player", "arm-1", *args, **kw)


@pytest.mark.parametrize("kind", ["json", "ros2", "protobuf"])
def test_an_mcap_log_converts_validates_and_loads_with_its_log_times(tmp_path, kind):
    src = _make(kind, tmp_path / "run.mcap")
    rep = json.loads(_import(src, tmp_path / "caps", kind, "--json").stdout)
    events = 30 if kind == "protobuf" else 20  # (a protobuf message has every field: State's speed too)
    assert rep["dropped"] == {} and rep["failed"] == [] and rep["sessions"][0]["actions"] == events
    session = json.loads((tmp_path / "caps" / "run" / "session.json").read_text())
    assert session["started_at"] == "2026-11-01T10:00:00Z"
    run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "0.5", "--strict", "-q")
    run("validate", tmp_path / "cat", "--level", "full", "-q")

    from dsbuild.loader import Loader

    loader = Loader(str(tmp_path / "cat"), decode="bytes", batch_size=1, shuffle="none").open()
    _, _, _, telemetry, action = TOPICS[kind]
    assert not [c for c in loader.channels if "header" in c or "frame_id" in c]  # (a ROS header is no telemetry)
    want_frames = (np.arange(30) * (1e9 // FPS)) / 1e9
    seen = []
    for batch in loader:
        n = int(batch["lengths"][0])
        ts = batch["timestamps"][0, :n]
        seen += ts.tolist()
        for j in range(2):
            col = list(loader.controls).index(action.format(j))
            events = [((t - T0) / 1e9, p[j]) for t, p in commands(30)]
            want = [next((v for t, v in reversed(events) if t <= x), 0.0) for x in ts]
            np.testing.assert_array_equal(batch["actions"][0, :n, col], np.float32(want))
            col = list(loader.channels).index(telemetry.format(j))
            readings = [((t - T0) / 1e9, p[j]) for t, p, _ in states(30)]
            want = [next((v for t, v in reversed(readings) if t <= x), readings[0][1]) for x in ts]
            np.testing.assert_array_equal(batch["telemetry"][0, :n, col], np.float32(want))
    np.testing.assert_allclose(seen, want_frames, atol=1e-5)  # the log times, on the video's 1/90000 s clock


@pytest.mark.parametrize("kind", ["json", "ros2", "protobuf"])
def test_importing_an_mcap_twice_gives_byte_identical_captures(tmp_path, kind):
    src = _make(kind, tmp_path / "run.mcap")
    for out in ("one", "two"):
        _import(src, tmp_path / out, kind)
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert [str(p) for p in files] == ["run/actions.jsonl", "run/session.json", "run/telemetry.jsonl", "run/video.mp4"]
    for p in files:
        assert (tmp_path / "one" / p).read_bytes() == (tmp_path / "two" / p).read_bytes(), p


def test_a_topic_that_does_not_exist_lists_the_ones_that_do(tmp_path):
    src = json_mcap(tmp_path / "run.mcap")
    p = run("import", "mcap", src, tmp_path / "caps", "--video-topic", "/cam", check=2)
    assert (
        "topic /cam is not in the file; its topics: /camera (RawImage, 30), /state (State, 15), /cmd (State, 10)"
        in p.stderr
    )
    assert not (tmp_path / "caps").exists()


def test_a_sqlite_bag_and_an_idl_schema_are_refused_in_one_line(tmp_path):
    from mcap.writer import Writer

    bag = tmp_path / "bag"
    bag.mkdir()
    (bag / "bag_0.db3").write_bytes(b"SQLite format 3\x00")
    p = run("import", "mcap", bag, tmp_path / "caps", "--video-topic", "/camera", check=2)
    assert "bag_0.db3: a ROS 2 bag in sqlite3 storage is not supported (MCAP files with JSON" in p.stderr
    with open(tmp_path / "idl.mcap", "wb") as f:
        w = Writer(f)
        w.start()
        schema = w.register_schema("sensor_msgs/msg/Image", "ros2idl", b"module sensor_msgs {};")
        w.add_message(
            w.register_channel("/camera", "cdr", schema), log_time=T0, data=b"\x00\x01\x00\x00", publish_time=T0
        )
        w.finish()
    p = run("import", "mcap", tmp_path / "idl.mcap", tmp_path / "caps", "--video-topic", "/camera", check=2)
    assert (
        "topic /camera: message encoding 'cdr' with schema encoding 'ros2idl' is not supported; "
        "supported: json (jsonschema), cdr (ros2msg), protobuf"
    ) in p.stderr


def test_a_bad_file_beside_good_ones_is_named_and_the_rest_imported(tmp_path):
    (tmp_path / "logs").mkdir()
    json_mcap(tmp_path / "logs" / "a.mcap")
    (tmp_path / "logs" / "b.mcap").write_bytes(b"not an mcap file")
    rep = run_json("import", "mcap", tmp_path / "logs", tmp_path / "caps", "--video-topic", "/camera")
    assert [s["session_id"] for s in rep["sessions"]] == ["a"]
    assert rep["failed"][0]["file"] == "b.mcap" and "not a readable MCAP file" in rep["failed"][0]["reason"]
    assert rep["guessed"] == {"player_unknown": 1, "title_from_file": 1}
    run("import", "mcap", tmp_path / "logs", tmp_path / "caps2", "--video-topic", "/camera", "--strict", check=1)

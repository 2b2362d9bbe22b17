"""`dsbuild import mcap`, through the real executable, on files written by the real ``mcap`` writers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli.clitools import run, run_json
from tests.importers.mcapfiles import (
    FPS,
    GOP,
    T0,
    commands,
    h264_units,
    json_mcap,
    protobuf_mcap,
    ros2_mcap,
    states,
    video_mcap,
)

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


def _decoded(frames) -> list[np.ndarray]:
    return [f.to_ndarray(format="rgb24") for f in frames]


@pytest.mark.parametrize("kind", ["json", "protobuf", "ros2"])
def test_a_compressed_video_topic_is_remuxed_at_its_log_times_without_reencoding(tmp_path, kind):
    import av

    if kind != "json":
        pytest.importorskip(f"mcap_{kind}", reason=f"needs mcap-{kind}-support")
    src = video_mcap(tmp_path / "run.mcap", kind)
    rep = run_json("import", "mcap", src, tmp_path / "caps", "--video-topic", "/camera", "--player", "arm-1")
    assert rep["dropped"] == {} and rep["failed"] == [] and rep["sessions"][0]["duration"] == 1.45
    with av.open(str(tmp_path / "caps" / "run" / "video.mp4")) as c:
        stream = c.streams.video[0]
        packets = [p for p in c.demux(stream) if p.size]
        assert stream.codec_context.name == "h264"
        assert [float(p.pts * p.time_base) for p in packets] == pytest.approx([i / FPS for i in range(30)], abs=1e-5)
        assert [i for i, p in enumerate(packets) if p.is_keyframe] == list(range(0, 30, GOP))
        remuxed = _decoded(f for p in packets for f in stream.codec_context.decode(p))
        remuxed += _decoded(stream.codec_context.decode(None))
    decoder = av.CodecContext.create("h264", "r")  # the robot's own access units, decoded as they were logged
    logged = _decoded(f for data, _ in h264_units(30) for f in decoder.decode(av.Packet(data)))
    logged += _decoded(decoder.decode(None))
    assert len(remuxed) == len(logged) == 30
    assert all(np.array_equal(a, b) for a, b in zip(remuxed, logged))  # the same pictures: nothing re-encoded
    if kind == "json":  # (the other files have no other topic: the video alone converts as well)
        run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "0.5", "--strict", "-q")
        run("validate", tmp_path / "cat", "--level", "full", "-q")


def test_a_compressed_video_log_that_starts_inside_a_gop_imports_the_same_bytes_twice(tmp_path):
    src = video_mcap(tmp_path / "run.mcap", first=3)  # pictures 3-9 precede the first keyframe (picture 10)
    reports = [
        run_json("import", "mcap", src, tmp_path / out, "--video-topic", "/camera", "--action-topic", "/cmd")
        for out in ("one", "two")
    ]
    assert reports[0]["dropped"] == {"video_frames": 7}
    assert "run.mcap: /camera message 1: before the first keyframe" in reports[0]["sessions"][0]["problems"][0]
    session = json.loads((tmp_path / "one" / "run" / "session.json").read_text())
    assert session["started_at"] == "2026-11-01T10:00:00.500000Z"  # time zero: the first keyframe's log time
    for name in ("session.json", "actions.jsonl", "video.mp4"):
        assert (tmp_path / "one" / "run" / name).read_bytes() == (tmp_path / "two" / "run" / name).read_bytes()


def test_an_unsupported_compressed_video_format_is_refused_naming_the_topic_and_the_formats(tmp_path):
    src = video_mcap(tmp_path / "run.mcap", frames=2, fmt="vp9")
    p = run("import", "mcap", src, tmp_path / "caps", "--video-topic", "/camera", check=2)
    assert (
        "topic /camera: compressed video format 'vp9' is not supported; supported: h264, h265 (remuxed as they are)"
        in p.stderr
    )
    assert not (tmp_path / "caps").exists()


def test_keyframes_are_found_by_their_nal_unit_types():
    from dsbuild.importers.mcap import is_keyframe

    units = h264_units(12)
    assert [is_keyframe("h264", data) for data, _ in units] == [key for _, key in units]
    assert is_keyframe("hevc", b"\x00\x00\x00\x01\x26\x01") and not is_keyframe("hevc", b"\x00\x00\x01\x02\x01")
    assert not is_keyframe("h264", b"") and not is_keyframe("h264", b"\x00\x00\x01")

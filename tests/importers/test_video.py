"""`dsbuild import video`, through the real executable, on videos made by the ffmpeg CLI and by PyAV."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dsbuild.importers.common import staged
from dsbuild.importers.video import VideoImport, compile_pattern, import_videos
from tests.cli.clitools import run, run_json

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg CLI")


def ffmpeg(out: Path, seconds: float = 2, rate: int = 30, *extra: str) -> Path:
    """A moving test picture (grain: no clip is frozen) with B-frames, keyframes every second."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = f"testsrc2=size=64x48:rate={rate},noise=alls=40:allf=t"
    cmd = ["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", src, "-t", str(seconds), "-c:v", "libx264"]
    cmd += ["-bf", "2", "-g", str(rate), "-pix_fmt", "yuv420p", *extra, str(out)]
    subprocess.run(cmd, check=True)
    return out


def pyav_mp4(out: Path, frames: int = 40, rate: int = 20) -> Path:
    import av

    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with av.open(str(out), "w") as c:
        s = c.add_stream("libx264", rate=rate, options={"g": str(rate)})
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for _ in range(frames):
            img = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            c.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(s.encode())
    return out


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


INPUTS = "t,control,value\n0.0,button_a,down\n0.5,steer_x,-0.5\n1.0,button_a,up\n1.5,steer_x,0.25\n"
TELEMETRY = "t,speed,pos_x\n0,1.5,2\n0.75,2.5,\n1.25,3.5,-4\n"


def test_imported_video_converts_validates_and_loads_with_its_actions(tmp_path):
    video = ffmpeg(tmp_path / "rec" / "run1.mkv")
    write(video.with_name("run1.inputs.csv"), INPUTS)
    write(video.with_name("run1.telemetry.csv"), TELEMETRY)
    rep = run_json("import", "video", tmp_path / "rec", tmp_path / "caps", "--title", "Kart", "--player", "p1")
    assert [s["session_id"] for s in rep["sessions"]] == ["run1"]
    assert rep["dropped"] == {} and rep["guessed"] == {} and rep["failed"] == []
    assert rep["sessions"][0]["actions"] == 4 and rep["sessions"][0]["telemetry"] == 3
    run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "1", "--strict", "-q")
    run("validate", tmp_path / "cat", "--level", "full", "-q")

    from dsbuild.loader import Loader

    loader = Loader(str(tmp_path / "cat"), decode="bytes", batch_size=1, shuffle="none").open()
    assert list(loader.controls) == ["button_a", "steer_x"] and list(loader.channels) == ["pos_x", "speed"]
    events = {"button_a": [(0.0, 1.0), (1.0, 0.0)], "steer_x": [(0.5, -0.5), (1.5, 0.25)]}
    readings = {"speed": [(0, 1.5), (0.75, 2.5), (1.25, 3.5)], "pos_x": [(0, 2.0), (1.25, -4.0)]}
    frames = 0
    for batch in loader:
        n = int(batch["lengths"][0])
        ts = batch["timestamps"][0, :n]
        for col, name in enumerate(loader.controls):
            want = [next((v for t, v in reversed(events[name]) if t <= x), 0.0) for x in ts]
            np.testing.assert_array_equal(batch["actions"][0, :n, col], np.float32(want))
        for col, name in enumerate(loader.channels):
            want = [next((v for t, v in reversed(readings[name]) if t <= x), readings[name][0][1]) for x in ts]
            np.testing.assert_array_equal(batch["telemetry"][0, :n, col], np.float32(want))
        frames += n
    assert frames == 60


def test_importing_twice_gives_byte_identical_captures(tmp_path):
    ffmpeg(tmp_path / "rec" / "Kart" / "p1" / "a.mkv")
    pyav_mp4(tmp_path / "rec" / "Kart" / "p2" / "b.mp4")
    ffmpeg(tmp_path / "rec" / "Pong" / "p1" / "c.ts", 1.5, 25, "-f", "mpegts")
    write(tmp_path / "rec" / "Kart" / "p1" / "a.inputs.csv", INPUTS)
    pattern = "{title}/{player}/{session}.*"
    for out in ("one", "two"):
        run("import", "video", tmp_path / "rec", tmp_path / out, "--pattern", pattern, "--condition", "mode=solo")
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    assert one == two and sorted(one) == [
        "a/actions.jsonl",
        "a/session.json",
        "a/video.mkv",
        "b/session.json",
        "b/video.mp4",
        "c/session.json",
        "c/video.ts",
    ]
    c = json.loads(one["c/session.json"])
    assert (c["title"], c["player"], c["conditions"]) == ("Pong", "p1", {"mode": "solo"})
    run("convert", tmp_path / "one", tmp_path / "cat", "--clip-seconds", "1", "--strict", "-q")


def test_a_log_that_does_not_fit_the_video_is_named_with_file_and_line(tmp_path):
    video = ffmpeg(tmp_path / "rec" / "run1.mkv")
    write(
        video.with_name("run1.inputs.csv"),
        "t,control,value\n-0.5,a,1\n0.2,a,1\n0.1,a,0\n9,a,0\n0.4,a,sideways\n0.5,a,2\n",
    )
    p = run("import", "video", tmp_path / "rec", tmp_path / "caps", "--title", "K", "--strict", "--json", check=1)
    rep = json.loads(p.stdout)
    problems = rep["sessions"][0]["problems"]
    assert problems == [
        "run1.inputs.csv:2: t=-0.5 s is before the video's first frame",
        "run1.inputs.csv:4: t=0.1 s is earlier than line 3 (t=0.2 s): the log is not in time order",
        "run1.inputs.csv:5: t=9 s is after the video's end at 2.000 s",
        "run1.inputs.csv:6: value 'sideways' is not a number, down or up",
        "run1.inputs.csv:7: value 2 is outside [-1, 1] (see docs/capture-format.md)",
    ]
    assert rep["dropped"] == {"action_lines": 5} and rep["guessed"] == {"player_unknown": 1}
    assert "--strict" in p.stderr
    assert (tmp_path / "caps" / "run1" / "actions.jsonl").read_text() == '{"t": 0.2, "control": "a", "value": 1.0}\n'


def test_a_file_no_demuxer_opens_is_named_and_the_rest_imported(tmp_path):
    ffmpeg(tmp_path / "rec" / "good.mkv")
    write(tmp_path / "rec" / "broken.mp4", "not a video")
    write(tmp_path / "rec" / "notes.txt", "ignored")
    p = run("import", "video", tmp_path / "rec", tmp_path / "caps", "--title", "K", "--player", "p")
    assert "broken.mp4: no demuxer opens it" in p.stderr
    rep = run_json("import", "video", tmp_path / "rec", tmp_path / "caps2", "--title", "K", "--player", "p")
    assert [s["session_id"] for s in rep["sessions"]] == ["good"] and rep["ignored"] == 1
    assert rep["failed"][0]["file"] == "broken.mp4"
    run("import", "video", tmp_path / "rec", tmp_path / "caps3", "--title", "K", "--strict", check=1)


def test_jsonl_inputs_with_a_clock_and_a_pattern(tmp_path):
    video = pyav_mp4(tmp_path / "rec" / "Kart" / "run-7.mp4")
    lines = [
        {"t": "2026-11-01T10:00:00.5Z", "control": "b", "value": "down"},
        {"t": 1793527201.25, "control": "b", "value": 0},
    ]
    write(video.with_name("run-7.inputs.jsonl"), "".join(json.dumps(x) + "\n" for x in lines) + "{oops\n")
    rep = run_json(
        "import", "video", tmp_path / "rec", tmp_path / "caps", "--pattern", "{title}/{session}.mp4",
        "--clock", "2026-11-01T10:00:00Z", "--player", "p",
    )  # fmt: skip
    s = rep["sessions"][0]
    assert s["problems"] == [
        "Kart/run-7.inputs.jsonl:3: invalid JSON (Expecting property name enclosed in double quotes)"
    ]
    caps = tmp_path / "caps" / "run-7"
    assert json.loads((caps / "session.json").read_text())["started_at"] == "2026-11-01T10:00:00Z"
    assert [json.loads(x) for x in (caps / "actions.jsonl").read_text().splitlines()] == [
        {"t": 0.5, "control": "b", "value": 1.0},
        {"t": 1.25, "control": "b", "value": 0.0},
    ]


def test_an_interrupted_import_leaves_nothing(tmp_path):
    ffmpeg(tmp_path / "rec" / "a.mkv")
    ffmpeg(tmp_path / "rec" / "b.mkv")

    def interrupt(done, total, detail):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_videos(tmp_path / "rec", tmp_path / "caps", VideoImport(title="K"), interrupt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"]
    with pytest.raises(ValueError), staged(tmp_path / "caps") as tmp:
        (tmp / "x").write_text("half")
        raise ValueError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"]


def test_an_output_that_holds_something_is_refused(tmp_path):
    ffmpeg(tmp_path / "rec" / "a.mkv")
    (tmp_path / "caps").mkdir()
    write(tmp_path / "caps" / "x", "mine")
    p = run("import", "video", tmp_path / "rec", tmp_path / "caps", check=2)
    assert "not an empty folder" in p.stderr and (tmp_path / "caps" / "x").read_text() == "mine"


def test_pattern_fields_become_session_fields():
    rx, names = compile_pattern("{title}/{player}/*_{session}.mkv")
    assert names == ("title", "player", "session")
    m = rx.fullmatch("Kart Storm/p1/2026_run3.mkv")
    assert m is not None and m.groupdict() == {"title": "Kart Storm", "player": "p1", "session": "run3"}


def test_ctrl_c_during_an_import_leaves_nothing_beside_the_source(tmp_path):
    """The real executable, interrupted once its temporary folder holds a session: no CAPTURES, no
    temporary folder, and the one-line message says so. The import runs at a lower priority than this
    test, so the test's 5-ms look at the folder is not kept from the CPU until the import is done (seen on
    2 loaded cores); an import that still finished first is run again, at most three times."""
    import os
    import signal
    import time

    from tests.cli.clitools import argv, env

    first = ffmpeg(tmp_path / "rec" / "v000.mkv")
    for i in range(1, 80):
        shutil.copyfile(first, tmp_path / "rec" / f"v{i:03}.mkv")
    for _ in range(3):
        p = subprocess.Popen(
            [
                "nice",
                "-n",
                "10",
                *argv("import", "video", tmp_path / "rec", tmp_path / "caps", "--title", "K", "--player", "p"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(),
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            if any((d / "v001").is_dir() for d in tmp_path.glob(".caps.importing-*")):
                break
            time.sleep(0.005)
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate()
        if p.returncode != 0:
            break
        shutil.rmtree(tmp_path / "caps")  # (done before the interrupt: again)
    assert p.returncode == 130, err
    assert "nothing was written to CAPTURES" in err.decode()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["rec"]


def test_a_log_without_its_header_is_dropped_whole_and_counted_not_read_by_guess(tmp_path):
    video = ffmpeg(tmp_path / "rec" / "run1.mkv", 1)
    write(video.with_name("run1.inputs.csv"), "0.0,a,1\n0.5,a,0\n")
    write(video.with_name("run1.telemetry.csv"), "t,speed,speed\n0,1,2\n")
    rep = run_json("import", "video", tmp_path / "rec", tmp_path / "caps", "--title", "K", "--player", "p")
    assert rep["dropped"] == {"action_lines": 2, "telemetry_lines": 2}
    assert rep["sessions"][0]["problems"][0] == (
        "run1.inputs.csv:1: the header must be t, control, value (or state); no line of the file was read"
    )
    write(video.with_name("run1.inputs.csv"), "t,control,state\n0.0,a,down\n0.5,a,up\n")
    video.with_name("run1.telemetry.csv").unlink()
    rep = run_json("import", "video", tmp_path / "rec", tmp_path / "caps2", "--title", "K", "--player", "p")
    assert rep["dropped"] == {} and rep["sessions"][0]["actions"] == 2

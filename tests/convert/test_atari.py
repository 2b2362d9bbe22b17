"""Atari captures recorded with ale-py: they follow the capture contract and convert reproduces, frame by
frame, the action the policy pressed and the telemetry the emulator showed."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats.sample import npy_load
from dsbuild.formats.streams import hold
from dsbuild.formats.video import seconds
from dsbuild.formats.webdataset import parse_members
from dsbuild.samples.atari import NOOP, AtariOptions, action_events, frame_times, record, require_ale

FPS = 60
SHORT = AtariOptions(
    games=("Breakout", "Pong"), sessions=3, seconds=4.0, seed=3, policies=("random", "sticky", "scripted")
)
# A random Breakout player loses all five lives in ~13 s: this session holds an episode end and a reset.
LONG = AtariOptions(games=("Breakout",), sessions=1, seconds=15.0, seed=0, policies=("random",))


@pytest.fixture(scope="module")
def ale():
    return pytest.importorskip("ale_py")


def _build(root: Path, options: AtariOptions):
    recordings = record(root / "captures", options)
    result = convert(
        root / "captures", root / "catalog", ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=1)
    )
    return recordings, result, root / "catalog"


@pytest.fixture(scope="module")
def short(ale, tmp_path_factory):
    return _build(tmp_path_factory.mktemp("atari-short"), SHORT)


@pytest.fixture(scope="module")
def long(ale, tmp_path_factory):
    return _build(tmp_path_factory.mktemp("atari-long"), LONG)


def _clips(catalog: Path, version_id: str):
    """Yield (meta, {member ext: payload}) for every sample, read through the version's index."""
    import pyarrow.parquet as pq

    for row in pq.ParquetFile(catalog / "versions" / version_id / "index.parquet").read().to_pylist():
        with open(catalog / row["shard"], "rb") as f:
            f.seek(row["byte_offset"])
            members = parse_members(f.read(row["byte_length"]), key=row["key"])
        payload = dict(members)
        yield json.loads(payload["json"]), payload


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- pure parts ----


def test_events_held_at_frame_times_give_back_every_frames_action_on_convert_clock():
    rng = np.random.default_rng(0)
    names = ("FIRE", "LEFT", "RIGHT", "UPFIRE")
    played = [NOOP if k == 4 else names[k] for k in rng.integers(0, 5, size=3000)]
    times = frame_times(len(played), FPS)
    events = action_events(played, times)
    for reader_t in (
        np.array([seconds(i * 256, Fraction(1, 15360)) for i in range(len(played))]),
        np.array([seconds(i, Fraction(1, 60)) for i in range(len(played))]),
    ):
        pressed = {
            c: hold(
                np.array([e["t"] for e in events if e["control"] == c]),
                np.array([e["value"] for e in events if e["control"] == c]),
                reader_t,
                0.0,
            )
            for c in names
        }
        back = [next((c for c in names if pressed[c][i] == 1.0), NOOP) for i in range(len(played))]
        assert back == played
        assert all(sum(pressed[c][i] for c in names) <= 1 for i in range(len(played)))


def test_frame_times_stay_within_an_ulp_of_the_exact_frame_time():
    times = frame_times(100_000, FPS)
    exact = [Fraction(i, FPS) for i in range(len(times))]
    assert all(abs(Fraction(t) - x) <= Fraction(1, 2**50) * max(1, x) for t, x in zip(times, exact))
    assert all(b > a for a, b in zip(times, times[1:]))


def test_noop_is_no_pressed_control():
    assert action_events([NOOP, NOOP, "FIRE", NOOP], [0.0, 1.0, 2.0, 3.0]) == [
        {"t": 2.0, "control": "FIRE", "value": 1.0},
        {"t": 3.0, "control": "FIRE", "value": 0.0},
    ]


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="--policy"):
        AtariOptions(policies=("greedy",))
    with pytest.raises(UsageError, match="--upscale"):
        AtariOptions(upscale=0)
    with pytest.raises(UsageError, match="--seed"):
        AtariOptions(seed=-1)


def test_missing_ale_py_fails_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # what an absent package looks like to `import`
    with pytest.raises(UsageError, match=r"pip install 'dsbuild\[atari\]'"):
        require_ale()


# ---- recorded sessions ----


def test_sessions_follow_the_capture_contract(short):
    recordings, _, _ = short
    assert [r.session_id for r in recordings] == [
        "breakout-random-s3-0000",
        "breakout-sticky-s4-0001",
        "breakout-scripted-s5-0002",
        "pong-random-s3-0000",
        "pong-sticky-s4-0001",
        "pong-scripted-s5-0002",
    ]
    for rec in recordings:
        doc = json.loads((rec.path / "session.json").read_text())
        assert doc["format"] == "capture/1" and doc["title"] in ("Breakout", "Pong")
        assert doc["player"] == rec.player and doc["video"] == "video.mp4"
        assert doc["conditions"] == {
            "difficulty": "0",
            "mode": "0",
            "frameskip": "1",
            "repeat_action_probability": "0.0",
        }
        assert sorted(p.name for p in rec.path.iterdir()) == [
            "actions.jsonl",
            "session.json",
            "telemetry.jsonl",
            "text.jsonl",
            "video.mp4",
        ]
        telemetry = _read_jsonl(rec.path / "telemetry.jsonl")
        assert len(telemetry) == len(rec.actions) == 4 * FPS
        assert all(len(e["ram"]) == 128 and all(0 <= b < 256 for b in e["ram"]) for e in telemetry)
        assert [e["frame"] for e in telemetry] == list(range(4 * FPS))
        assert _read_jsonl(rec.path / "text.jsonl")[0]["text"] == "episode start"


def test_convert_takes_every_session_and_frame(short):
    recordings, result, catalog = short
    assert result.quarantined == () and result.sessions == len(recordings)
    frames: dict[str, int] = {}
    for meta, _ in _clips(catalog, result.version_id):
        sid = meta["session"]["session_id"]
        frames[sid] = frames.get(sid, 0) + meta["clip"]["frames"]
    assert frames == {r.session_id: len(r.actions) for r in recordings}


@pytest.mark.parametrize("which", ["short", "long"])
def test_each_clip_frame_holds_exactly_the_action_the_policy_pressed(which, request):
    recordings, result, catalog = request.getfixturevalue(which)
    played = {r.session_id: r.actions for r in recordings}
    checked = 0
    for meta, payload in _clips(catalog, result.version_id):
        controls = meta["controls"]
        actions, ts = npy_load(payload["actions.npy"]), npy_load(payload["timestamps.npy"])
        assert actions.shape == (len(ts), len(controls)) and set(np.unique(actions)) <= {0.0, 1.0}
        assert (actions.sum(axis=1) <= 1).all()  # one action meaning at a time
        frame = np.rint(ts * FPS).astype(int)
        back = [controls[int(np.argmax(row))] if row.any() else NOOP for row in actions]
        assert back == [played[meta["session"]["session_id"]][i] for i in frame]
        checked += len(frame)
    assert checked == sum(len(a) for a in played.values())


@pytest.mark.parametrize("which", ["short", "long"])
def test_clip_telemetry_is_the_frames_own_and_score_never_falls_within_an_episode(which, request):
    _, result, catalog = request.getfixturevalue(which)
    for meta, payload in _clips(catalog, result.version_id):
        channels = meta["telemetry_channels"]
        tel, ts = npy_load(payload["telemetry.npy"]), npy_load(payload["timestamps.npy"])
        col = {name: tel[:, channels.index(name)] for name in ("frame", "score", "episode", "reward", "lives")}
        assert (col["frame"] == np.rint(ts * FPS)).all()
        same = np.diff(col["episode"]) == 0
        assert (np.diff(col["score"])[same] >= 0).all()
        assert (np.diff(col["score"])[same] == col["reward"][1:][same]).all()


def test_an_episode_that_ends_is_reset_and_continued(long):
    recordings, _, _ = long
    (rec,) = recordings
    assert rec.episodes >= 2
    text = _read_jsonl(rec.path / "text.jsonl")
    telemetry = _read_jsonl(rec.path / "telemetry.jsonl")
    ends = [e["t"] for e in text if e["text"] == "episode end"]
    starts = [e["t"] for e in text if e["text"] == "episode start"]
    assert starts[0] == 0.0 and len(starts) == len(ends) + 1 == rec.episodes
    assert len([e for e in text if e["text"] == "life lost"]) >= 5
    by_t = {e["t"]: e for e in telemetry}
    for end, start in zip(ends, starts[1:]):
        last, first = by_t[end], by_t[start]
        assert first["frame"] == last["frame"] + 1 and first["episode"] == last["episode"] + 1
        assert first["score"] == 0 and first["lives"] == 5 and last["lives"] == 0
        assert rec.actions[last["frame"]] == NOOP  # the emulator is reset, not stepped, on the end frame
    for a, b in zip(telemetry, telemetry[1:]):
        if a["episode"] == b["episode"]:
            assert b["score"] == a["score"] + b["reward"] >= a["score"]


def test_same_arguments_give_byte_identical_captures_and_another_seed_does_not(ale, short, tmp_path):
    recordings, _, _ = short
    again = record(tmp_path / "again", SHORT)
    first_root = recordings[0].path.parent
    files = sorted(p.relative_to(first_root) for p in first_root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file())
    for rel in files:
        assert (first_root / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes(), rel
    assert [r.actions for r in again] == [r.actions for r in recordings]
    other = record(
        tmp_path / "other", AtariOptions(games=("Breakout",), sessions=1, seconds=4.0, seed=4, policies=("random",))
    )
    assert other[0].actions != recordings[0].actions


def test_upscale_repeats_pixels(ale, tmp_path):
    import av

    (rec,) = record(tmp_path, AtariOptions(games=("Pong",), sessions=1, seconds=0.5, upscale=2))
    with av.open(str(rec.path / "video.mp4")) as c:
        s = c.streams.video[0]
        assert (s.codec_context.width, s.codec_context.height) == (320, 420)
        assert sum(1 for _ in c.decode(s)) == 30


# ---- the command ----


def _dsbuild(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from dsbuild.cli.app import main; sys.argv[0] = 'dsbuild'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_cli_records_atari_sessions(ale, tmp_path):
    out = tmp_path / "caps"
    r = _dsbuild(
        "samples",
        str(out),
        "--source",
        "atari",
        "--games",
        "Breakout,MsPacman",
        "--sessions",
        "2",
        "--seconds",
        "1",
        "--policy",
        "sticky,scripted",
        "--seed",
        "7",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [Path(p).name for p in doc["sessions"]] == [
        "breakout-sticky-s7-0000",
        "breakout-scripted-s8-0001",
        "mspacman-sticky-s7-0000",
        "mspacman-scripted-s8-0001",
    ]
    assert json.loads((out / "mspacman-sticky-s7-0000" / "session.json").read_text())["title"] == "MsPacman"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--games", "NoSuchGame"], "unknown Atari game"),
        (["--damage", "bad_json"], "--damage"),
        (["--policy", "greedy"], "--policy"),
    ],
)
def test_cli_refuses_bad_atari_arguments_in_one_line(ale, tmp_path, args, message):
    r = _dsbuild("samples", str(tmp_path / "caps"), "--source", "atari", "--seconds", "1", *args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "caps").exists()


def test_cli_refuses_atari_options_for_synthetic_source(tmp_path):
    r = _dsbuild("samples", str(tmp_path / "caps"), "--games", "Pong")
    assert r.returncode == 2 and "--source atari" in r.stderr

"""MuJoCo robot captures (dm_control suite tasks rendered offscreen): they follow the capture contract,
convert and validate, and the loader gives back, frame by frame, the command each actuator was sent and
the joint state the physics showed. The policies' pure parts are property-tested without MuJoCo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import MissingDependency, UsageError
from dsbuild.samples.mujoco import (
    POLICIES,
    MujocoOptions,
    command_events,
    record,
    require_mujoco,
    scale,
)
from tests.cli.clitools import run, run_json

TINY = MujocoOptions(tasks=("walker-walk",), sessions=1, seconds=1.0, policies=("random",), seed=5, size=64)
SESSION = "walker-walk-random-s5-0000"
FPS = 40  # walker's control rate


@pytest.fixture(scope="module")
def renders():
    """dm_control importable and able to render here, else the module's recording tests skip."""
    pytest.importorskip("dm_control", reason="needs the mujoco extra (dm-control, mujoco)")
    try:
        suite = require_mujoco()
        suite.load("reacher", "easy").physics.render(16, 16, render_flag_overrides={"shadow": False})
    except MissingDependency as e:  # (MissingDevice too: no offscreen renderer on this machine)
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny(renders, tmp_path_factory):
    """One 1 s walker session recorded through the CLI, converted and validated at --level full."""
    root = tmp_path_factory.mktemp("mujoco")
    args = ["--tasks", "walker-walk", "--sessions", "1", "--seconds", "1", "--policy", "random", "--seed", "5"]
    doc = run_json("samples", root / "caps", "--source", "mujoco", *args, "--size", "64")
    assert [Path(p).name for p in doc["sessions"]] == [SESSION]
    run("convert", root / "caps", root / "cat", "--strict", "-q")
    run("validate", root / "cat", "--level", "full", "-q")
    return root


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_session_declares_its_actuators_as_continuous_controls(tiny):
    session = json.loads((tiny / "caps" / SESSION / "session.json").read_text())
    actuators = ["left_ankle", "left_hip", "left_knee", "right_ankle", "right_hip", "right_knee"]
    assert session["controls"] == {a: {"kind": "continuous", "range": [-1.0, 1.0]} for a in actuators}
    assert session["platform"] == "mujoco" and session["title"] == "walker-walk" and session["player"] == "random-s5"
    assert session["conditions"]["control_hz"] == str(FPS)
    telemetry = _lines(tiny / "caps" / SESSION / "telemetry.jsonl")
    assert [line["t"] for line in telemetry] == [i / FPS for i in range(FPS)]
    assert {"qpos/right_hip", "qvel/right_hip", "qpos/rootz", "reward", "episode"} <= set(telemetry[0])


def test_the_loader_gives_each_frame_its_command_and_joint_state_exactly(tiny):
    from dsbuild.loader import Loader

    events = _lines(tiny / "caps" / SESSION / "actions.jsonl")
    telemetry = _lines(tiny / "caps" / SESSION / "telemetry.jsonl")
    loader = Loader(str(tiny / "cat"), decode="bytes", batch_size=1, shuffle="none").open()
    seen = []
    for batch in loader:
        n = int(batch["lengths"][0])
        for k, t in enumerate(batch["timestamps"][0, :n].tolist()):
            i = round(t * FPS)
            seen.append(i)
            for control in ("right_hip", "left_ankle"):
                sent = [e["value"] for e in events if e["control"] == control and e["t"] <= i / FPS][-1]
                assert batch["actions"][0, k, list(loader.controls).index(control)] == np.float32(sent)
            for channel in ("qpos/right_knee", "qvel/left_hip"):
                got = batch["telemetry"][0, k, list(loader.channels).index(channel)]
                assert got == np.float32(telemetry[i][channel])
    assert seen == list(range(FPS))


def test_the_same_seed_records_byte_identical_captures(tiny, tmp_path):
    again = record(tmp_path / "caps", TINY)  # the library, in this process: the same bytes as the CLI's run
    files = sorted(p.name for p in again[0].path.iterdir())
    assert files == ["actions.jsonl", "session.json", "telemetry.jsonl", "text.jsonl", "video.mp4"]
    for name in files:
        assert (again[0].path / name).read_bytes() == (tiny / "caps" / SESSION / name).read_bytes(), name


def test_a_time_limit_inside_a_session_starts_a_new_episode_on_the_next_frame(renders, tmp_path):
    options = MujocoOptions(tasks=("reacher-easy",), sessions=1, seconds=0.5, size=16, episode_seconds=0.2)
    (recording,) = record(tmp_path, options)  # reacher steps at 50 Hz: episodes of 10 steps
    text = _lines(recording.path / "text.jsonl")
    assert recording.episodes == 3 and recording.frames == 25
    assert [(e["t"], e["text"]) for e in text] == [(0.0, "episode start")] + [
        (t, what) for t in (0.2, 0.4) for what in ("episode end", "episode start")
    ]
    episodes = [line["episode"] for line in _lines(recording.path / "telemetry.jsonl")]
    assert episodes == [0] * 10 + [1] * 10 + [2] * 5


def test_a_machine_that_cannot_render_gets_one_line_and_exit_3(renders, tmp_path):
    p = run("samples", tmp_path / "caps", "--source", "mujoco", extra_env={"MUJOCO_GL": "no-such-backend"}, check=3)
    assert p.stderr.startswith("error: --source mujoco cannot render offscreen with MUJOCO_GL=no-such-backend")
    assert "libosmesa6" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "caps").exists()


def test_missing_packages_fail_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "dm_control", None)  # what an absent package looks like to `import`
    with pytest.raises(MissingDependency, match=r"pip install 'dsbuild\[mujoco\]'"):
        require_mujoco()


def test_bad_options_are_refused_in_one_line():
    for kwargs, message in [
        ({"tasks": ("walker",)}, "DOMAIN-TASK"),
        ({"tasks": ("walker-walk", "walker-walk")}, "twice"),
        ({"policies": ("sticky",)}, "--policy"),
        ({"size": 63}, "--size"),
        ({"seed": -1}, "--seed"),
        ({"episode_seconds": 0.0}, "episode"),
    ]:
        with pytest.raises(UsageError, match=message):
            MujocoOptions(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=6),
    st.floats(-50.0, 0.0),
    st.floats(0.0, 50.0),
)
def test_commands_are_float32_within_the_actuators_range(unit, low, high):
    n = len(unit)
    value = scale(np.array(unit), np.full(n, low), np.full(n, high))
    assert value.dtype == np.float32 and (value >= np.float32(low)).all() and (value <= np.float32(high)).all()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from([-1.0, -0.25, 0.0, 0.5, 1.0]), min_size=3, max_size=3), min_size=1, max_size=8)
)
def test_a_hold_of_the_command_events_gives_back_every_steps_command(steps):
    names = ("a", "b", "c")
    commands = [np.array(s, np.float32) for s in steps]
    events = []
    for i, command in enumerate(commands):
        events += command_events(names, commands[i - 1] if i else None, command, i / FPS)
    for i, command in enumerate(commands):
        held = [[e["value"] for e in events if e["control"] == c and e["t"] <= i / FPS][-1] for c in names]
        assert np.array_equal(np.float32(held), command)
    assert len(POLICIES) == 3

"""Continuous controls (a robot's joint targets in their own units): a session declares them in
``controls``, their values are carried exactly as float32 outside [-1, 1], and every capture/1 session
without the field converts as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dsbuild.formats.capture import capture_schema, read_session, session_problems
from dsbuild.formats.streams import StreamReport, events
from tests.cli.clitools import run

ROOT = Path(__file__).resolve().parents[2]
VIDEO = ROOT / "sample_data" / "captures" / "ks-2-0000" / "video.mp4"  # 5 s at 30 fps
BASE = {"format": "capture/1", "session_id": "arm-1", "title": "Reach", "player": "robot-1", "video": "video.mp4"}
CONTROLS = {
    "joint_1": {"kind": "continuous", "unit": "rad", "range": [-3.14, 3.14]},
    "gripper": {"kind": "continuous", "unit": "m"},
}
EVENTS = [
    ("joint_1", 0.0, 2.75),
    ("gripper", 0.0, 0.04),
    ("button_a", 0.5, 1.0),
    ("joint_1", 1.0, -3.0999999046325684),
    ("gripper", 2.0, 123456.5),
    ("joint_1", 3.0, 0.1),
]


def _capture(root: Path, controls: dict | None) -> Path:
    d = root / "arm-1"
    d.mkdir(parents=True)
    shutil.copyfile(VIDEO, d / "video.mp4")
    doc = {**BASE, "streams": {"actions": "actions.jsonl"}}
    if controls is not None:
        doc["controls"] = controls
    (d / "session.json").write_text(json.dumps(doc))
    lines = [json.dumps({"t": t, "control": c, "value": v}) for c, t, v in sorted(EVENTS, key=lambda e: e[1])]
    (d / "actions.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_continuous_values_are_carried_exactly_and_validate(tmp_path):
    _capture(tmp_path / "caps", CONTROLS)
    run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "1", "--strict", "-q")
    run("validate", tmp_path / "cat", "--level", "full", "-q")

    from dsbuild.loader import Loader

    loader = Loader(str(tmp_path / "cat"), decode="bytes", batch_size=1, shuffle="none").open()
    assert list(loader.controls) == ["button_a", "gripper", "joint_1"]
    frames = 0
    for batch in loader:
        n = int(batch["lengths"][0])
        for col, name in enumerate(loader.controls):
            mine = [(t, v) for c, t, v in EVENTS if c == name]
            want = [next((v for t, v in reversed(mine) if t <= x), 0.0) for x in batch["timestamps"][0, :n]]
            np.testing.assert_array_equal(batch["actions"][0, :n, col], np.float32(want))
        frames += n
    assert frames == 150


def test_the_sample_metadata_carries_the_declaration(tmp_path):
    _capture(tmp_path / "caps", CONTROLS)
    run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "5", "-q")
    from dsbuild.loader import Loader

    batch = next(iter(Loader(str(tmp_path / "cat"), decode="bytes", batch_size=1, shuffle="none")))
    assert batch["keys"] == ["arm-1__000000"]
    meta = _sample_meta(tmp_path / "cat")
    assert meta["continuous"] == {"gripper": {"unit": "m"}, "joint_1": {"unit": "rad", "range": [-3.14, 3.14]}}


def _sample_meta(catalog: Path) -> dict:
    import tarfile

    shard = next(p for p in catalog.rglob("*.tar"))
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".json"))
        return json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]


def test_undeclared_values_outside_the_unit_range_are_still_dropped(tmp_path):
    _capture(tmp_path / "caps", None)
    p = run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", "1", "--strict", check=1)
    assert "'value' must be a finite number in [-1, 1]" in p.stderr
    assert "continuous" not in json.dumps(_sample_meta(tmp_path / "cat"))


def test_the_reader_holds_continuous_values_to_float32_only(tmp_path):
    path = tmp_path / "actions.jsonl"
    lines = [
        {"t": 0, "control": "j", "value": 1e30},
        {"t": 1, "control": "j", "value": 1e39},
        {"t": 2, "control": "a", "value": 2},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = StreamReport()
    assert list(events(path, "actions", report=report, continuous=frozenset({"j"}))) == [(0.0, "j", 1e30)]
    assert report.malformed == 2 and "within float32" in report.examples[0]


@pytest.mark.parametrize(
    ("controls", "problem"),
    [
        (CONTROLS, None),
        ({"j": {"kind": "continuous", "range": None, "unit": None}}, None),
        ({"j": {"kind": "axis"}}, "field 'controls.j.kind': expected one of continuous, found 'axis'"),
        ({"j": {}}, "missing required field 'controls.j.kind'"),
        ({"j": {"kind": "continuous", "range": [1]}}, "field 'controls.j.range': expected a list of 2 numbers"),
        ({"j": {"kind": "continuous", "range": [0, "1"]}}, "field 'controls.j.range.1': expected a finite number"),
        ({"j": {"kind": "continuous", "range": [0, 1e39]}}, "field 'controls.j.range.1': expected a finite number"),
        ({"j": {"kind": "continuous", "unit": ""}}, "field 'controls.j.unit': expected a non-empty string"),
        ({"j": "continuous"}, "field 'controls.j': expected an object"),
        ({"j": {"kind": "continuous", "range": [2, 1]}}, "field 'controls.j.range': 2 is above 1"),
    ],
)
def test_declarations_are_checked_by_the_published_schema(tmp_path, controls, problem):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (a dev extra) checks the schema itself")
    doc = {**BASE, "controls": controls}
    problems = session_problems(doc, tmp_path)
    assert (problem is None) == (problems == []) and all(problem in p for p in problems[:1]), problems
    schema_errors = list(jsonschema.Draft202012Validator(capture_schema("session")).iter_errors(doc))
    assert bool(schema_errors) == (problem is not None and "is above" not in problem)  # (no schema says low <= high)
    if problem is None:
        d = tmp_path / "s"
        d.mkdir()
        (d / "session.json").write_text(json.dumps(doc))
        assert read_session(d, tmp_path).continuous == frozenset(controls)

"""What `dsbuild convert` says about a capture that breaks the contract (docs/capture-format.md), through
the real executable: every problem of a session.json in one run, streams that lost more than 1% of their
lines (a warning; --strict: exit 1), long clips from sparse keyframes (one hint with the fix), and "missing"
only for a stream that session.json names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from tests.cli.clitools import run
from tests.helpers import session_records


def _edit(session: Path, change) -> None:
    doc = json.loads((session / "session.json").read_text())
    change(doc)
    (session / "session.json").write_text(json.dumps(doc))


def _convert_json(caps: Path, cat: Path, *args, check: int = 0) -> tuple[dict, str]:
    p = run("convert", caps, cat, "--clip-seconds", 2, "--workers", 1, "--json", *args, check=check)
    return json.loads(p.stdout), p.stderr


@pytest.fixture(scope="module")
def lossy(tmp_path_factory) -> tuple[Path, list[str]]:
    """(capture root, session ids) of three 3 s sessions: the first clean, the second with 4 bad lines in
    actions and telemetry (the `malformed_lines` damage), the third with one bad action line in 151
    (under 1%)."""
    root = tmp_path_factory.mktemp("lossy") / "caps"
    paths = generate(root, sessions=3, seconds=3, seed=5, damage={1: "malformed_lines"})
    actions = paths[2] / "actions.jsonl"
    good = actions.read_text().splitlines()
    actions.write_text("\n".join((good * 4)[:150] + ['{"t": 1.0, "control": "steer_x", "value": 7}']) + "\n")
    return root, [json.loads((p / "session.json").read_text())["session_id"] for p in paths]


def test_a_session_with_three_broken_fields_gets_three_messages_in_one_run(tmp_path):
    paths = generate(tmp_path / "caps", sessions=2, seconds=1, seed=3)

    def damage(doc: dict) -> None:
        del doc["title"], doc["player"]
        doc["session_id"] = "not valid!"

    _edit(paths[1], damage)
    report, _ = _convert_json(tmp_path / "caps", tmp_path / "cat")
    [q] = report["quarantined"]
    assert q["path"] == f"{paths[1].name}/session.json"
    assert q["reason"].startswith("3 problems: "), q
    for expected in (
        "missing required field 'title'",
        "missing required field 'player'",
        "field 'session_id': expected a string matching [A-Za-z0-9_-]{1,64}, found 'not valid!'",
        "(see docs/capture-format.md)",
    ):
        assert expected in q["reason"], q["reason"]


def test_a_stream_losing_over_one_percent_of_its_lines_is_warned_once_and_fails_strict(lossy, tmp_path):
    caps, ids = lossy
    report, stderr = _convert_json(caps, tmp_path / "cat")
    warned = [line for line in stderr.splitlines() if line.startswith("warning ")]
    assert [w.split(" lost ")[0] for w in warned] == [f"warning {ids[1]}: actions", f"warning {ids[1]}: telemetry"]
    for w in warned:
        assert "%, over 1%); first: line 2: invalid JSON" in w, w
        assert w.endswith("(see docs/capture-format.md)"), w
    assert [(s["session"], s["stream"], s["dropped"]) for s in report["lossy_streams"]] == [
        (ids[1], "actions", 4),
        (ids[1], "telemetry", 4),
    ]
    # a stream under 1% is counted in its session's record, not warned about
    records = {r["session_id"]: r for r in session_records(tmp_path / "cat", report["version_id"])["sessions"]}
    assert {k: records[ids[2]]["repairs"]["actions"][k] for k in ("lines", "malformed")} == {
        "lines": 151,
        "malformed": 1,
    }
    p = run("convert", caps, tmp_path / "cat", "--clip-seconds", 2, "--strict", check=1)
    assert "2 stream(s) lost over 1% of their lines and --strict is set" in p.stderr, p.stderr
    assert p.stderr.count(f"warning {ids[1]}: actions lost") == 1


def test_clips_longer_than_asked_for_from_sparse_keyframes_give_one_hint_with_the_fix(tmp_path):
    sparse = VideoSpec(160, 120, 30, 150)  # a keyframe every 5 s
    specs = [dataclasses.replace(session_spec(1, i, 6), video=sparse) for i in range(2)]
    generate(tmp_path / "caps", sessions=2, seconds=6, seed=1, specs=specs)
    report, stderr = _convert_json(tmp_path / "caps", tmp_path / "cat")
    hints = [line for line in stderr.splitlines() if "--transcode" in line]
    assert len(hints) == 1, stderr
    assert hints[0].startswith("warning 2 clip(s) came out over 1.5x --clip-seconds 2"), hints
    assert "up to 5 s (150 frames) apart" in hints[0] and "a keyframe every 60 frames (ffmpeg -g 60)" in hints[0]
    assert report["keyframe_hint"] == hints[0].removeprefix("warning ")
    report, stderr = _convert_json(tmp_path / "caps", tmp_path / "cat5", "--clip-seconds", 5)  # (the last wins)
    assert report["long_clips"] == 0 and report["keyframe_hint"] is None and "keyframe" not in stderr


def test_missing_is_said_only_of_a_stream_session_json_names(tmp_path):
    paths = generate(tmp_path / "caps", sessions=2, seconds=1, seed=4)

    def no_telemetry(doc: dict) -> None:
        del doc["streams"]["telemetry"]

    _edit(paths[0], no_telemetry)  # a session that records no telemetry: nothing to report
    (paths[0] / "telemetry.jsonl").unlink()
    (paths[1] / "text.jsonl").unlink()  # named, but not there: missing
    p = run("convert", tmp_path / "caps", tmp_path / "cat", "--clip-seconds", 1, "--workers", 1)
    repairs = next(line for line in p.stdout.splitlines() if line.startswith("repairs and drops"))
    assert "telemetry" not in repairs and "text: 1 missing" in repairs, repairs

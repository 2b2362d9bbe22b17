"""The capture contract is published as JSON Schemas (``dsbuild schema capture``) and those schemas are what
the checker enforces: session.json is validated by the schema itself, and a property test proves that the
stream readers keep exactly the lines the stream schemas accept (the per-line hot path cannot afford a
schema validator)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import CaptureError
from dsbuild.formats.capture import SCHEMAS, capture_schema, read_session, session_problems
from dsbuild.formats.streams import StreamReport, events
from tests.cli.clitools import run, run_json

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (a dev extra) checks the schemas themselves")

GOOD = {
    "format": "capture/1",
    "session_id": "ks-20261101-0007",
    "title": "Kart Storm",
    "platform": "pc",
    "build": "1.4.2",
    "player": "p-7f3a91",
    "started_at": "2026-11-01T10:00:00Z",
    "conditions": {"track": "harbor", "weather": "rain", "difficulty": "hard"},
    "video": "video.mp4",
    "streams": {"actions": "actions.jsonl", "telemetry": "telemetry.jsonl", "text": "text.jsonl"},
}


@functools.cache
def _validator(name: str):
    schema = capture_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _session(tmp_path: Path, doc: dict) -> Path:
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True, exist_ok=True)
    (d / "session.json").write_text(json.dumps(doc))
    return d


def test_every_schema_is_a_valid_json_schema_and_the_documented_example_passes_it(tmp_path):
    for name in SCHEMAS:
        _validator(name)
    assert not list(_validator("session").iter_errors(GOOD))
    assert read_session(_session(tmp_path, GOOD), tmp_path / "root").conditions["track"] == "harbor"
    for name, line in [
        ("actions", {"t": 0.033, "control": "button_a", "value": 1.0}),
        ("telemetry", {"t": 0.0, "pos": [1.0, 2.0, 0.5], "speed": 12.5}),
        ("text", {"t": 1.5, "speaker": "p-7f3a91", "text": "nice line"}),
        ("text", {"t": 2.0, "text": "race start"}),
    ]:
        assert not list(_validator(name).iter_errors(line)), (name, line)


def test_a_session_with_three_broken_fields_gets_three_messages_at_once(tmp_path):
    doc = {k: v for k, v in GOOD.items() if k not in ("title", "player")} | {"session_id": "has space"}
    with pytest.raises(CaptureError) as e:
        read_session(_session(tmp_path, doc), tmp_path / "root")
    reason = e.value.reason
    assert reason.startswith("3 problems: ") and reason.endswith("(see docs/capture-format.md)"), reason
    assert "missing required field 'title'" in reason and "missing required field 'player'" in reason
    assert "field 'session_id': expected a string matching [A-Za-z0-9_-]{1,64}, found 'has space'" in reason


def test_path_problems_are_reported_beside_field_problems(tmp_path):
    doc = {**GOOD, "video": "../x.mp4", "streams": {"actions": "/abs.jsonl", "text": "ok.jsonl"}, "title": 3}
    problems = session_problems(doc, _session(tmp_path, doc))
    assert len(problems) == 3, problems
    assert problems[0].startswith("field 'title': expected a non-empty string")
    assert "field 'video': the path '../x.mp4' escapes" in problems[1]
    assert "field 'streams.actions': the path '/abs.jsonl' is absolute" in problems[2]


# -- session.json: the package's validator and a reference validator agree on every document --------------
_TEXT = st.text(max_size=6) | st.sampled_from(["", "x" * 1025, "has space", "ok-1", "capture/1"])
_VALUE = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_FIELD = _VALUE | st.lists(_VALUE, max_size=2) | st.dictionaries(_TEXT, _VALUE, max_size=3)
_STREAMS = st.dictionaries(st.sampled_from(["actions", "telemetry", "text", "video2"]), _VALUE, max_size=3)


@st.composite
def session_docs(draw) -> dict:
    """Documents near a valid session.json: fields dropped, replaced by anything, or extra."""
    doc = dict(GOOD)
    for key in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=4, unique=True)):
        if draw(st.booleans()):
            del doc[key]
        else:
            doc[key] = draw(_STREAMS if key == "streams" else _FIELD)
    doc.update(draw(st.dictionaries(st.sampled_from(["extra", "notes"]), _FIELD, max_size=1)))
    if "started_at" in doc and isinstance(doc["started_at"], str) and doc["started_at"]:
        doc["started_at"] = GOOD["started_at"]  # (date-time formats differ between validators: ISO 8601 here)
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_docs())
def test_session_json_is_checked_by_its_published_schema(tmp_path, doc):
    """Valid for the reference validator <=> no problem found (paths aside: the schema cannot say where a
    file lies), and the fields the reference validator names are the ones named in the messages."""
    errors = list(_validator("session").iter_errors(doc))
    ours = [p for p in session_problems(doc, tmp_path) if "the path" not in p]
    assert bool(errors) == bool(ours), (doc, [e.message for e in errors], ours)


# -- the streams: the per-line readers keep exactly the lines their schema accepts ----------------------------
_NUMBER = (
    st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-1, 0, 1, 1.0, -1.0, 1.0000001, 3.4028234663852886e38, 3.5e38])
)
_ANY = st.none() | st.booleans() | _NUMBER | st.text(max_size=4) | st.lists(_NUMBER, max_size=3)
_T = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-100, 100) | _ANY


def _kept(kind: str, line: dict, tmp_path: Path) -> bool:
    """Whether the reader keeps the line whole (telemetry: no channel dropped from it)."""
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(json.dumps(line).encode() + b"\n")
    report = StreamReport()
    evs = list(events(path, kind, report=report))
    return len(evs) == 1 and report.malformed == 0 and report.dropped_fields == 0


def _agree(kind: str, line: dict, tmp_path: Path) -> None:
    valid = not list(_validator(kind).iter_errors(line))
    assert _kept(kind, line, tmp_path) == valid, (kind, line, [e.message for e in _validator(kind).iter_errors(line)])


LIVE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def near(base: dict, fields: dict) -> st.SearchStrategy[dict]:
    """Lines near a valid one: up to two of its fields removed or replaced by anything from ``fields``."""

    @st.composite
    def build(draw) -> dict:
        line = dict(base)
        for key in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
            if key in line and draw(st.booleans()) and not draw(st.booleans()):
                del line[key]
            else:
                line[key] = draw(fields[key])
        return line

    return build()


@LIVE
@given(
    near(
        {"t": 0.5, "control": "button_a", "value": 1},
        {"t": _T, "control": st.sampled_from(["", "steer_x", "c" * 128, "c" * 129]) | _ANY, "value": _ANY, "x": _ANY},
    )
)
def test_the_action_reader_keeps_exactly_the_lines_its_schema_accepts(tmp_path, line):
    _agree("actions", line, tmp_path)


@LIVE
@given(near({"t": 1.5, "speaker": "p-1", "text": "gg"}, {"t": _T, "speaker": _ANY, "text": _ANY, "x": _ANY}))
def test_the_text_reader_keeps_exactly_the_lines_its_schema_accepts(tmp_path, line):
    _agree("text", line, tmp_path)


_CHANNEL = _ANY | st.lists(_ANY, max_size=3) | st.lists(_NUMBER, max_size=3)


@LIVE
@given(
    near(
        {"t": 0.0, "pos": [1.0, 2.0, 0.5], "speed": 12.5},
        {"t": _T, "pos": _CHANNEL, "speed": _CHANNEL, "": _NUMBER, "n" * 129: _NUMBER, "n" * 128: _NUMBER},
    )
)
def test_the_telemetry_reader_keeps_exactly_the_readings_its_schema_accepts(tmp_path, line):
    _agree("telemetry", line, tmp_path)


# -- dsbuild schema capture ----------------------------------------------------------------------------------
def test_dsbuild_schema_capture_prints_the_shipped_schemas():
    assert run_json("schema", "capture") == {name: capture_schema(name) for name in SCHEMAS}
    assert json.loads(run("schema", "capture", "session").stdout) == capture_schema("session")
    human = run("schema", "capture").stdout
    assert all(f"dsbuild schema capture {name}" in human for name in SCHEMAS)
    assert run("schema", "capture", "-q").stdout.split() == list(SCHEMAS)
    p = run("schema", "capture", "sesion", check=2)
    assert "unknown file" in p.stderr and "session, actions, telemetry, text" in p.stderr

"""The capture reader treats every file as untrusted: bounded, type-checked, confined to its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dsbuild.core.errors import CaptureError
from dsbuild.formats.capture import discover_sessions, read_session
from dsbuild.formats.streams import MAX_LINE_BYTES, read_actions, read_telemetry, read_text

GOOD = {"format": "capture/1", "session_id": "s-1", "title": "T", "player": "p", "video": "video.mp4",
        "conditions": {"track": "a"}, "streams": {"actions": "actions.jsonl"}}


def _session(tmp_path: Path, doc) -> Path:
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True, exist_ok=True)
    (d / "session.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def test_a_valid_session_reads_with_relative_paths(tmp_path):
    d = _session(tmp_path, GOOD)
    s = read_session(d, tmp_path / "root")
    assert (s.session_id, s.rel, s.rel_of(s.video)) == ("s-1", "s", "s/video.mp4")


@pytest.mark.parametrize("change, reason", [
    ({"session_id": "has space"}, "must match"),
    ({"session_id": "x" * 65}, "must match"),
    ({"format": "capture/2"}, "expected 'capture/1'"),
    ({"title": 7}, "field 'title'"),
    ({"conditions": {"a": 1}}, "must map to a string"),
    ({"conditions": {str(i): "v" for i in range(2000)}}, "exceeds the limit"),
    ({"streams": {"video2": "x"}}, "unknown stream"),
    ({"video": "a/../../x.mp4"}, "escapes"),
    ({"video": "/etc/passwd"}, "absolute"),
    ({"video": "bad\nname.mp4"}, "control character"),
])
def test_bad_session_fields_are_named(tmp_path, change, reason):
    d = _session(tmp_path, {**GOOD, **change})
    with pytest.raises(CaptureError, match=reason):
        read_session(d, tmp_path / "root")


def test_deep_nesting_and_huge_files_are_refused(tmp_path):
    d = _session(tmp_path, '{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(CaptureError, match="exceeds the limit|nested deeper"):
        read_session(d, tmp_path / "root")
    d = _session(tmp_path, "[" * 1000 + "]" * 1000)
    with pytest.raises(CaptureError, match="nested deeper"):
        read_session(d, tmp_path / "root")


def test_symlinked_folders_are_not_walked(tmp_path):
    real = _session(tmp_path, GOOD)
    (tmp_path / "root" / "link").symlink_to(real)
    assert discover_sessions(tmp_path / "root") == [real]


def test_a_gigabyte_line_costs_the_bound_not_the_line(tmp_path):
    p = tmp_path / "a.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"t": 0.0, "control": "a", "value": 1}\n')
        f.write(b'{"t": 1, "pad": "' + b"x" * (3 * MAX_LINE_BYTES) + b'"}\n')
        f.write(b'{"t": 2.0, "control": "a", "value": 0}\n')
    actions, report = read_actions(p)
    assert report.malformed == 1 and len(actions.t) == 2 and "longer than" in report.examples[0]


def test_actions_are_sorted_stably_and_values_checked(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in [
        {"t": 1.0, "control": "b", "value": 1}, {"t": 0.5, "control": "a", "value": 1},
        {"t": 0.5, "control": "a", "value": 0}, {"t": 0.7, "control": "a", "value": 3},
        {"t": 0.8, "control": "a", "value": True}]))
    a, rep = read_actions(p)
    assert a.controls == ("a", "b") and list(a.t) == [0.5, 0.5, 1.0] and list(a.value) == [1, 0, 1]
    assert rep.out_of_order == 1 and rep.malformed == 2


def test_telemetry_lists_become_indexed_channels_and_bad_fields_are_counted(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"t":0,"pos":[1,2],"speed":1,"name":"x"}\n{"t":1,"pos":[3,4],"speed":NaN}\n')
    tel, rep = read_telemetry(p)
    assert tel.channels == ("name", "pos.0", "pos.1", "speed") or tel.channels == ("pos.0", "pos.1", "speed")
    assert rep.dropped_fields == 2


def test_text_keeps_unicode_and_drops_invalid_utf8(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes('{"t":1,"text":"ünï"}\n'.encode() + b'{"t":2,"text":"\xff"}\n')
    events, rep = read_text(p)
    assert [e.text for e in events] == ["ünï"] and rep.malformed == 1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_stream_readers_never_crash_on_arbitrary_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fuzz") / "s.jsonl"
    p.write_bytes(data)
    for reader in (read_actions, read_telemetry, read_text):
        _, rep = reader(p)
        assert rep.events + rep.malformed <= rep.lines + 1


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3)))
def test_session_reader_raises_only_capture_errors(tmp_path_factory, doc):
    root = tmp_path_factory.mktemp("r")
    (root / "session.json").write_text(json.dumps(doc))
    try:
        read_session(root, root)
    except CaptureError:
        pass

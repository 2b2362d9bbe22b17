"""The capture reader treats every file as untrusted: bounded, type-checked, confined to its folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import CaptureError
from dsbuild.formats.capture import discover_sessions, read_session
from tests.helpers import unprivileged

GOOD = {
    "format": "capture/1",
    "session_id": "s-1",
    "title": "T",
    "player": "p",
    "video": "video.mp4",
    "conditions": {"track": "a"},
    "streams": {"actions": "actions.jsonl"},
}


def _session(tmp_path: Path, doc) -> Path:
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True, exist_ok=True)
    (d / "session.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def test_a_valid_session_reads_with_relative_paths(tmp_path):
    d = _session(tmp_path, GOOD)
    s = read_session(d, tmp_path / "root")
    assert (s.session_id, s.rel, s.rel_of(s.video)) == ("s-1", "s", "s/video.mp4")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"session_id": "has space"}, "field 'session_id': expected a string matching"),
        ({"session_id": "x" * 65}, "expected a string matching"),
        ({"format": "capture/2"}, "expected 'capture/1'"),
        ({"title": 7}, "field 'title'"),
        ({"conditions": {"a": 1}}, "field 'conditions.a': expected a string"),
        ({"conditions": {str(i): "v" for i in range(2000)}}, "2000 entries, expected at most 1024"),
        ({"streams": {"video2": "x"}}, "key 'video2' is not allowed; expected one of actions"),
        ({"video": "a/../../x.mp4"}, "escapes"),
        ({"video": "/etc/passwd"}, "absolute"),
        ({"video": "bad\nname.mp4"}, "control character"),
        ({"streams": False}, "field 'streams': expected an object of strings, found false"),
        ({"conditions": 0}, "field 'conditions': expected an object of strings"),
        ({"started_at": "yesterday"}, "expected an ISO 8601 time"),
    ],
)
def test_bad_session_fields_are_named(tmp_path, change, reason):
    d = _session(tmp_path, {**GOOD, **change})
    with pytest.raises(CaptureError, match=reason):
        read_session(d, tmp_path / "root")


def test_a_repeated_key_is_refused_not_resolved_by_the_parser(tmp_path):
    """JSON parsers keep the last of a repeated key: a session.json naming two session ids is refused."""
    d = _session(tmp_path, json.dumps(GOOD)[:-1] + ', "session_id": "s-2"}')
    with pytest.raises(CaptureError, match="'session_id' appears more than once"):
        read_session(d, tmp_path / "root")
    d = _session(tmp_path, {**GOOD, "started_at": None, "conditions": None, "streams": None})
    s = read_session(d, tmp_path / "root")  # null is the same as absent
    assert s.started_at is None and s.conditions == {} and s.streams == {}
    assert read_session(_session(tmp_path, {**GOOD, "started_at": "2026-11-01 10:00:00"}), tmp_path / "root")


def test_deep_nesting_and_huge_files_are_refused(tmp_path):
    d = _session(tmp_path, '{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(CaptureError, match="exceeds the limit|nested deeper"):
        read_session(d, tmp_path / "root")
    d = _session(tmp_path, "[" * 1000 + "]" * 1000)
    with pytest.raises(CaptureError, match="nested deeper"):
        read_session(d, tmp_path / "root")


def test_symlinked_folders_are_not_walked_and_one_leading_out_to_sessions_is_reported(tmp_path):
    """(One leading to sessions outside was dropped silently: neither converted nor quarantined. A link
    into the root, or to a folder without sessions, is nothing lost: not reported.)"""
    real = _session(tmp_path, GOOD)
    (tmp_path / "root" / "link").symlink_to(real)
    outside = tmp_path / "elsewhere" / "deep" / "s-9"
    outside.mkdir(parents=True)
    (outside / "session.json").write_text(json.dumps(GOOD))
    (tmp_path / "root" / "out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "root" / "thumbnails").symlink_to(tmp_path / "empty")
    found, skipped = discover_sessions(tmp_path / "root")
    assert found == [real] and [rel for rel, _ in skipped] == ["out"] and "not followed" in skipped[0][1]


def test_a_fifo_session_json_is_refused_without_hanging(tmp_path):
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True)
    os.mkfifo(d / "session.json")  # opening it for reading would block forever without O_NONBLOCK
    with pytest.raises(CaptureError, match="FIFO"):
        read_session(d, tmp_path / "root")


def test_a_device_or_a_symlink_to_a_secret_is_never_read(tmp_path):
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True)
    (d / "session.json").symlink_to("/dev/zero")
    with pytest.raises(CaptureError, match="outside|device"):
        read_session(d, tmp_path / "root")
    (d / "session.json").unlink()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(GOOD))
    (d / "session.json").symlink_to(secret)
    with pytest.raises(CaptureError, match="outside"):
        read_session(d, tmp_path / "root")


def test_an_unreadable_folder_is_reported_not_skipped(tmp_path):
    _session(tmp_path, GOOD)
    locked = tmp_path / "root" / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        out = unprivileged(
            "import json, sys; from pathlib import Path; from dsbuild.formats.capture import "
            "discover_sessions; f, u = discover_sessions(Path(sys.argv[1])); print(json.dumps(u))",
            tmp_path / "root",
        )
    finally:
        locked.chmod(0o755)
    unreadable = json.loads(out.stdout)
    assert [rel for rel, _ in unreadable] == ["locked"] and "cannot be read" in unreadable[0][1], out.stderr


def test_a_huge_string_field_is_cut_in_the_reason(tmp_path):
    d = _session(tmp_path, {**GOOD, "session_id": "x" * 900_000})
    with pytest.raises(CaptureError) as e:
        read_session(d, tmp_path / "root")
    assert len(e.value.reason) < 400 and "900000 characters" in e.value.reason


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    )
)
def test_session_reader_raises_only_capture_errors(tmp_path_factory, doc):
    root = tmp_path_factory.mktemp("r")
    (root / "session.json").write_text(json.dumps(doc))
    try:
        read_session(root, root)
    except CaptureError:
        pass

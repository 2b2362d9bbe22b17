"""Every kind of damaged capture: unusable sessions are quarantined with a precise reason and the build
goes on; recoverable damage is repaired and counted in the manifest; user mistakes exit 2."""

from __future__ import annotations

import json

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.samples.synthetic import generate
from tests.helpers import cli, lose_a_frames_tail, manifest, session_records

CONFIG = ConvertConfig(clip_seconds=2.0)
QUARANTINE = {
    "zero_video": "not a readable video",
    "not_video": "not a readable video",
    "bad_json": "invalid JSON",
    "missing_field": "missing required field 'player'",
    "escape_dotdot": "escapes the session folder",
    "escape_absolute": "is absolute",
    "escape_symlink": "resolves outside the session folder",
    "duplicate_id": "duplicate session_id",
}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """One clean session, then one session per damage kind (the first duplicates the clean one's id)."""
    kinds = sorted(QUARANTINE, key=lambda k: k != "duplicate_id") + [
        "truncated_video",
        "malformed_lines",
        "out_of_order",
        "nan_telemetry",
        "bad_utf8",
        "missing_streams",
    ]
    root = tmp_path_factory.mktemp("damaged") / "cap"
    # 2-s sessions: the truncated one still keeps a clip before its damage, and every line the damage
    # kinds add or swap lies inside the video
    paths = generate(root, sessions=len(kinds) + 1, seconds=2, seed=2, damage={i + 1: k for i, k in enumerate(kinds)})
    out = root.parent / "cat"
    r = convert(root, out, CONFIG, executor=ExecutorSpec(workers=2))
    return (
        {k: paths[i + 1].name for i, k in enumerate(kinds)},
        r,
        {**manifest(out, r.version_id), **session_records(out, r.version_id)},
    )


@pytest.mark.parametrize("kind", sorted(QUARANTINE))
def test_unusable_session_is_quarantined_with_a_precise_reason(damaged, kind):
    folders, result, _ = damaged
    hits = [q for q in result.quarantined if q.path.startswith(folders[kind] + "/")]
    assert hits, f"{kind} was not quarantined: {result.quarantined}"
    assert any(QUARANTINE[kind] in q.reason for q in hits), hits


def test_the_build_goes_on_and_counts_everything(damaged):
    _folders, result, m = damaged
    # duplicate_id quarantines both holders of the id; all other damage quarantines one session
    assert len(result.quarantined) == len(QUARANTINE) + 1
    assert result.sessions == 6 and result.samples > 0
    assert m["stats"]["quarantined"] == len(result.quarantined)


def _repairs(damaged, kind):
    folders, _, m = damaged
    return next(s["repairs"] for s in m["sessions"] if s["path"] == folders[kind])


def test_truncated_video_keeps_the_clips_before_the_damage(damaged):
    video = _repairs(damaged, "truncated_video")["video"]
    assert video["truncated"] or video["dropped_undecodable"] > 0


def test_malformed_lines_are_dropped_and_counted(damaged):
    r = _repairs(damaged, "malformed_lines")
    assert r["actions"]["malformed"] == 4 and r["telemetry"]["malformed"] == 4
    assert any("invalid JSON" in e for e in r["actions"]["examples"])


def test_out_of_order_events_are_sorted_and_counted(damaged):
    assert _repairs(damaged, "out_of_order")["actions"]["out_of_order"] >= 1


def test_nan_and_non_numeric_telemetry_fields_are_dropped_and_counted(damaged):
    assert _repairs(damaged, "nan_telemetry")["telemetry"]["dropped_fields"] == 3


def test_invalid_utf8_text_line_is_dropped_and_counted(damaged):
    r = _repairs(damaged, "bad_utf8")["text"]
    assert r["malformed"] == 1 and "invalid UTF-8" in r["examples"][0]


def test_missing_streams_are_recorded_not_fatal(damaged):
    r = _repairs(damaged, "missing_streams")
    assert r["actions"]["missing"] and r["text"]["missing"] and not r["telemetry"]["missing"]


def test_events_in_no_clip_are_counted_per_stream(tmp_path):
    """Text before the video and events after its end reach no clip: counted, not silently dropped (and
    not a repair: input loggers run a little past the video)."""
    import json

    paths = generate(tmp_path / "cap", sessions=1, seconds=2, seed=6)
    d = paths[0]
    doc = json.loads((d / "session.json").read_text())
    base = convert(tmp_path / "cap", tmp_path / "before", CONFIG, executor=ExecutorSpec(workers=1))
    clean = session_records(tmp_path / "before", base.version_id)["sessions"][0]["repairs"]
    text = d / doc["streams"]["text"]
    text.write_text('{"t": -5, "text": "before"}\n' + text.read_text() + '{"t": 500, "text": "after"}\n')
    with open(d / doc["streams"]["actions"], "a") as f:
        f.write('{"t": 500, "control": "late", "value": 1}\n')
    r = convert(tmp_path / "cap", tmp_path / "after", CONFIG, executor=ExecutorSpec(workers=1))
    repairs = session_records(tmp_path / "after", r.version_id)["sessions"][0]["repairs"]
    assert repairs["text"]["outside_video"] == clean["text"]["outside_video"] + 2
    assert repairs["actions"]["outside_video"] == clean["actions"]["outside_video"] + 1
    assert r.repaired_sessions == base.repaired_sessions


def test_strict_turns_quarantine_into_exit_1(tmp_path):
    generate(tmp_path / "cap", sessions=2, seconds=2, seed=4, damage={1: "zero_video"})
    loose = cli("convert", tmp_path / "cap", tmp_path / "a", "--workers", "1")
    strict = cli("convert", tmp_path / "cap", tmp_path / "b", "--workers", "1", "--strict", "--json")
    assert loose.returncode == 0 and strict.returncode == 1
    assert '"quarantined": [' in strict.stdout and "not a readable video" in strict.stdout


@pytest.fixture(scope="module")
def one_session(tmp_path_factory):
    """A capture folder of one clean 1-s session (read only: every convert given it here is refused)."""
    cap = tmp_path_factory.mktemp("one") / "cap"
    generate(cap, sessions=1, seconds=1, seed=0)
    return cap


@pytest.mark.parametrize("case", ["missing", "out_is_file", "empty", "bad_size", "bad_format"])
def test_user_mistakes_get_one_line_and_exit_2(one_session, tmp_path, case):
    cap, out, extra = one_session, tmp_path / "out", []
    if case == "empty":
        cap = tmp_path / "cap"
        cap.mkdir()
    elif case == "missing":
        cap = tmp_path / "nope"
    elif case == "out_is_file":
        out.write_text("x")
    elif case == "bad_size":
        extra = ["--shard-size", "lots"]
    elif case == "bad_format":
        extra = ["--format", "csv"]
    r = cli("convert", cap, out, *extra)
    assert r.returncode == 2, r.stderr
    assert not out.is_dir()  # refused before anything was written
    lines = r.stderr.strip().splitlines()  # one error line, and a hint line when there is something to do
    assert lines[0].startswith("error:") and "Traceback" not in r.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: "))


def test_all_sessions_quarantined_is_exit_1_names_every_reason_and_commits_nothing(tmp_path):
    """The error named the first session and hinted "`--json` lists every reason", which it did not: with
    nothing committed there is no report. The message names up to five, then counts the rest."""
    generate(tmp_path / "cap", sessions=7, seconds=1, seed=0, damage=dict.fromkeys(range(7), "not_video"))
    r = cli("convert", tmp_path / "cap", tmp_path / "out", "--json")
    assert r.returncode == 1 and r.stdout == ""
    error = json.loads(r.stderr)
    assert error["error"].startswith("all 7 sessions were quarantined: ") and error["error"].endswith("; and 2 more")
    assert error["error"].count("not a readable video") == 5 and error["hint"] is None
    assert not (tmp_path / "out").exists()  # a first build that failed left an empty catalog behind
    (tmp_path / "empty").mkdir()
    assert cli("convert", tmp_path / "cap", tmp_path / "empty", "-q").returncode == 1
    assert not any((tmp_path / "empty").iterdir())  # an empty folder given stays empty


def _edit_during(monkeypatch, name: str, edit) -> None:
    """Run ``edit(session)`` inside the build at the moment ``dsbuild.convert.session.<name>`` is called."""
    import dsbuild.convert.session as work

    real = getattr(work, name)

    def hooked(*args, **kwargs):
        out = real(*args, **kwargs)
        if name == "scan" and args[1] == "actions":
            edit(args[0].parent)
        return out

    def hooked_hash(session, root):
        edit(session.directory)
        return real(session, root)

    monkeypatch.setattr(work, name, hooked_hash if name == "hash_sources" else hooked)


@pytest.mark.parametrize("when", ["hash_sources", "scan"])
def test_a_capture_edited_between_its_read_and_its_hash_is_quarantined(tmp_path, monkeypatch, when):
    """session.json is parsed when the build starts and hashed later, in the worker; a stream is read
    while the video is still being hashed. A file saved in between was committed with its old contents
    under its new hash: no quarantine, and every later build reused the stale samples (the hash
    matched). Now the file must be the same when read, when hashed and at the end."""
    import json

    _, d = generate(tmp_path / "cap", sessions=2, seconds=2, seed=3)

    def edit(folder):
        if folder != d:
            return
        if when == "hash_sources":  # the session was parsed already: its player changes on disk
            doc = json.loads((folder / "session.json").read_text())
            (folder / "session.json").write_text(json.dumps({**doc, "player": "p-edited"}))
        else:  # actions were read: one more line is saved
            with open(folder / "actions.jsonl", "a") as f:
                f.write('{"t": 0.5, "control": "late", "value": 1.0}\n')

    _edit_during(monkeypatch, when, edit)
    r = convert(tmp_path / "cap", tmp_path / "cat", CONFIG, executor=ExecutorSpec(workers=1))
    [q] = r.quarantined
    assert "changed while reading" in q.reason and q.path.endswith(
        "session.json" if when == "hash_sources" else "actions.jsonl"
    ), q
    monkeypatch.undo()
    again = convert(tmp_path / "cap", tmp_path / "cat", CONFIG, executor=ExecutorSpec(workers=1))
    fresh = convert(tmp_path / "cap", tmp_path / "fresh", CONFIG, executor=ExecutorSpec(workers=1))
    assert again.quarantined == () and again.version_id == fresh.version_id


def test_folder_names_that_are_not_utf8_never_crash_a_build(tmp_path):
    """A session folder named in Latin-1 (``café`` as the bytes caf\\xe9) crashed the whole build after
    all its work (exit 70: not canonical JSON), as did a capture root named so: the session is now
    quarantined with the name shown escaped, and the root is recorded escaped."""
    import os

    root = tmp_path / os.fsdecode(b"caps-\xe9t\xe9")
    generate(root, sessions=2, seconds=2.0, seed=3)
    first = sorted(root.iterdir())[0]
    first.rename(root / os.fsdecode(b"caf\xe9"))
    p = cli("convert", root, tmp_path / "cat", "--clip-seconds", "1", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["sessions"] == 1 and [q["path"] for q in report["quarantined"]] == ["caf\\xe9"]
    assert "not valid UTF-8" in report["quarantined"][0]["reason"]
    assert cli("verify", tmp_path / "cat").returncode == 0


def test_the_all_quarantined_message_names_sessions_in_id_order_whatever_order_they_finished_in():
    """Sessions finish in any order with several workers: the message (and which five it shows) changed
    from run to run."""
    from dsbuild.convert.build import _refuse_all_quarantined
    from dsbuild.convert.session import SessionResult
    from dsbuild.core.errors import CheckFailed
    from dsbuild.lineage.manifest import Quarantined

    ids = [f"s-{i}" for i in (4, 1, 6, 0, 3, 5, 2)]
    results = [SessionResult(i, i, quarantine=Quarantined(i, f"{i}/video.mp4", "not a video")) for i in ids]
    with pytest.raises(CheckFailed) as e:
        _refuse_all_quarantined(results, [])
    shown = [part.split("/")[0] for part in str(e.value).split(": ", 1)[1].split("; ")[:5]]
    assert shown == ["s-0", "s-1", "s-2", "s-3", "s-4"] and "and 2 more" in str(e.value)


def test_a_transcode_refuses_concealed_damage_the_same_way_every_run(tmp_path):
    """A frame's tail lost inside the H.264 stream, which FFmpeg alone would conceal and decode on: a transcode
    must not encode the damage, so the session is quarantined naming the clip, in every run. With frame
    threads the decoder lost the concealed flag in some processes, and could hang for good: freed after
    the refusal, it waited for a frame thread that held one of our packets, whose release needs the GIL."""
    (session,) = generate(tmp_path / "cap", sessions=1, seconds=6, seed=3)
    video = session / "video.mp4"
    video.write_bytes(lose_a_frames_tail(video.read_bytes()))
    for run in range(3):
        p = cli("convert", tmp_path / "cap", tmp_path / f"cat{run}", "--clip-seconds", "2", "--transcode", "h264:gop8")
        assert p.returncode == 1, p.stderr
        assert "does not decode for transcoding" in p.stderr and "is damaged" in p.stderr, p.stderr

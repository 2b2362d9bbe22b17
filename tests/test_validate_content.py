"""Content checks (--level full): clean versions pass; undecodable, frozen and black clips, bad arrays,
events and text are each named by their own check."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import zstandard

from dsbuild.validators import ValidateOptions, validate
from dsbuild.validators.checks.content import (
    analyse_video,
    array_problems,
    dhash,
    events_problems,
    text_problems,
    video_problems,
)
from dsbuild.validators.spec import default_spec
from tests.helpers import index_rows
from tests.test_validate_support import build, copy_catalog, reseal, write_moving_session, write_still_session

CONTENT = ("decode", "frame_count", "fps", "resolution", "duration", "black_clips", "frozen_clips", "audio",
           "actions", "telemetry", "timestamps", "action_events", "text")


def _session_with_audio(root: Path, session_id: str) -> None:
    """A capture whose video file also has an AAC track (convert carries it into every clip)."""
    import av

    d = root / session_id
    d.mkdir(parents=True)
    with av.open(str(d / "video.mp4"), "w", format="mp4") as c:
        v = c.add_stream("libx264", rate=30)
        v.width, v.height, v.pix_fmt = 96, 64, "yuv420p"
        v.options = {"g": "30", "keyint_min": "30", "sc_threshold": "0"}
        a = c.add_stream("aac", rate=48000)
        for i in range(60):
            img = np.zeros((64, 96, 3), np.uint8)
            img[:, (i * 3) % 96:] = 200
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in v.encode(f):
                c.mux(p)
        for i in range(90):
            af = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            af.sample_rate, af.pts = 48000, i * 1024
            for p in a.encode(af):
                c.mux(p)
        for s in (v, a):
            for p in s.encode():
                c.mux(p)
    (d / "session.json").write_text(json.dumps({"format": "capture/1", "session_id": session_id, "title": "Loud",
                                                "player": "p-loud", "video": "video.mp4"}))


@pytest.fixture(scope="module")
def stills(tmp_path_factory):
    """Two moving sessions, a still (frozen) one, a black one and one with an audio track; 1 s clips."""
    root = tmp_path_factory.mktemp("stills")
    caps = root / "caps"
    write_moving_session(caps, "mv-a", "Kart Storm", "p-1", seed=1)
    write_moving_session(caps, "mv-b", "Sky Rally", "p-2", seed=2)
    gray = np.zeros((120, 160, 3), np.uint8)
    gray[:, :, 1] = np.arange(160, dtype=np.uint8)[None, :]
    write_still_session(caps, "still", gray)
    write_still_session(caps, "black", np.zeros((120, 160, 3), np.uint8), title="Kart Storm")
    _session_with_audio(caps, "loud")
    return build(caps, root / "cat", clip_seconds=1.0)


@pytest.mark.parametrize("fixture, workers", [("wds_catalog", 2), ("parquet_catalog", 1)])
def test_clean_versions_pass_every_content_check(fixture, workers, request):
    cat, vid = request.getfixturevalue(fixture)
    report = validate(cat, vid, options=ValidateOptions(level="full", workers=workers))
    assert {c.name: c.status for c in report.checks if c.name in CONTENT} == dict.fromkeys(CONTENT, "pass")
    assert report.summary["checked_content"] == report.summary["samples"] > 0
    assert report.summary["decoded_frames"] == sum(r["frames"] for r in index_rows(cat, vid))


def test_frozen_and_black_clips_are_named_and_carried_audio_passes(stills):
    cat, vid = stills
    report = validate(cat, vid, options=ValidateOptions(level="full", workers=1))
    keys = [r["key"] for r in index_rows(cat, vid)]
    black = {k for k in keys if k.startswith("black__")}
    frozen = black | {k for k in keys if k.startswith("still__")}
    assert set(o.item for o in report.check("frozen_clips").offenders) == frozen
    assert set(o.item for o in report.check("black_clips").offenders) == black
    assert report.check("frozen_clips").status == report.check("black_clips").status == "fail"
    assert report.check("frozen_clips").measured == round(len(frozen) / len(keys), 6)
    assert report.check("audio").status == "pass"  # "loud" carries its AAC track, in sync
    others = {c.name for c in report.checks if c.status == "fail"} - {"frozen_clips", "black_clips"}
    assert not others
    assert report.check("near_duplicates").status == "warn"  # still clips look alike: reported, not rejected


def test_undecodable_video_fails_decode_naming_the_sample(stills, tmp_path):
    cat = copy_catalog(stills[0], tmp_path / "cat")
    victim = [r["key"] for r in index_rows(cat, stills[1])][2]

    def edit(key, members):
        return [(n, (b"\x00\x00\x00\x18ftypisom" + bytes(range(256)) * (len(p) // 256)) if n.endswith(".mp4")
                 and key == victim else p) for n, p in members]

    vid = reseal(cat, stills[1], edit)
    report = validate(cat, vid, options=ValidateOptions(level="full", workers=1))
    decode = report.check("decode")
    assert decode.status == "fail" and [o.item for o in decode.offenders] == [victim]
    assert [o.item for o in report.check("frame_count").offenders] == [victim]
    for name in ("manifest", "shard_hashes", "index", "members"):
        assert report.check(name).status == "pass"


def _encode(frames: list[np.ndarray], fps: int = 30) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=fps)
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = "yuv420p"
        for i, img in enumerate(frames):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def test_analyse_video_measures_motion_darkness_rate_and_size():
    moving = [np.full((48, 64, 3), (i * 8) % 256, np.uint8) for i in range(32)]
    v = analyse_video(_encode(moving), 32)
    assert v["error"] is None and v["decoded"] == 32 and v["sizes"] == [(64, 48)]
    assert abs(v["fps"] - 30) < 1e-6 and abs(v["span"] - 32 / 30) < 1e-6 and v["motion"] > 5
    assert v["audio"] is False and len(v["phash"]) == 4
    still = analyse_video(_encode([np.zeros((48, 64, 3), np.uint8)] * 20), 20)
    assert still["motion"] < 0.1 and still["luma_max"] < 1
    junk = analyse_video(b"not a video at all" * 10, 10)
    assert junk["decoded"] == 0 and junk["error"].startswith("not a readable video")


def test_bitstream_damage_that_ffmpeg_would_conceal_is_a_decode_failure():
    import av

    rng = np.random.default_rng(3)
    data = bytearray(_encode([rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(32)]))
    for pos in (len(data) // 3, len(data) // 2, 2 * len(data) // 3):
        data[pos] ^= 0xFF
    lenient = 0
    with av.open(io.BytesIO(bytes(data))) as c:
        try:
            for _ in c.decode(video=0):
                lenient += 1
        except av.error.FFmpegError:
            pass
    v = analyse_video(bytes(data), 32)
    assert v["error"] and v["error"].startswith("decode error after")
    assert v["decoded"] < lenient  # FFmpeg alone conceals the damage and goes on decoding


def test_video_problems_apply_the_spec_tolerances():
    spec = default_spec()
    v = {"decoded": 30, "error": None, "sizes": [(64, 48)], "fps": 30.0, "span": 1.0, "audio": False,
         "luma_max": 100.0, "motion": 40.0}
    expect = {"frames": 30, "fps": 30.0, "width": 64, "height": 48, "duration": 1.0}
    assert video_problems(v, expect, spec, audio_expected=False) == []
    bad = video_problems({**v, "fps": 25.0, "span": 1.2, "sizes": [(64, 48), (32, 24)]}, {**expect, "frames": 31},
                         spec, audio_expected=True)
    assert [c for c, _ in bad] == ["frame_count", "fps", "resolution", "duration", "audio"]


def test_dhash_is_stable_under_small_noise_and_differs_for_other_images():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (48, 64)).astype(np.float32)
    noisy = img + rng.normal(0, 1, img.shape)
    other = rng.integers(0, 255, (48, 64)).astype(np.float32)
    assert bin(dhash(img) ^ dhash(noisy)).count("1") <= 6
    assert bin(dhash(img) ^ dhash(other)).count("1") > 16


def _meta(frames=3, t0=0.0, t1=0.1, action_events=1, text=()):
    return {"clip": {"frames": frames, "t_start": t0, "t_end": t1}, "controls": ["a", "x"],
            "telemetry_channels": ["speed"], "action_events": action_events, "text": list(text)}


def test_array_problems_name_shape_range_finiteness_and_order():
    meta = _meta()
    good = (np.zeros((3, 2), np.float32), np.zeros((3, 1), np.float32), np.array([0.0, 0.03, 0.06]))
    assert array_problems(meta, *good) == []
    bad = array_problems(meta, np.full((3, 2), 2, np.float32), np.full((3, 1), np.nan, np.float32),
                         np.array([0.0, 0.06, 0.03]))
    assert [c for c, _ in bad] == ["actions", "telemetry", "timestamps"]
    assert "outside [-1, 1]" in bad[0][1] and "non-finite" in bad[1][1] and "not strictly increasing" in bad[2][1]
    shape = array_problems(meta, np.zeros((2, 2), np.float32), good[1], np.array([0.0, 0.03, 0.2]))
    assert "expected float32 [3, 2]" in shape[0][1] and "outside the window" in shape[1][1]


def test_events_problems_check_window_controls_values_count_and_bounds():
    z = zstandard.ZstdCompressor()
    ok = z.compress(b'{"control":"a","t":0.01,"value":1.0}\n')
    assert events_problems(_meta(), ok) == []
    late = z.compress(b'{"control":"a","t":0.5,"value":1.0}\n{"control":"q","t":0.02,"value":1.0}\n')
    found = events_problems(_meta(), late)
    assert "outside the window" in found[0][1] and "(and 1 more)" in found[0][1] and "2 events" in found[1][1]
    assert "do not decompress" in events_problems(_meta(), b"plain bytes")[0][1]
    bomb = zstandard.ZstdCompressor(level=1).compress(b"\n" * (65 << 20))
    assert "over" in events_problems(_meta(), bomb)[0][1]


def test_text_problems_catch_lone_surrogates_and_events_outside_the_window():
    good = {"t": 0.05, "speaker": "p", "text": "ünïcödé ok"}
    assert text_problems(_meta(text=[good])) == []
    assert text_problems(_meta(text=[{"t": 0.05, "text": "no speaker"}, {**good, "speaker": None}])) == []
    assert "string fields" in text_problems(_meta(text=[{**good, "speaker": 3}]))[0][1]
    surrogate = json.loads('{"t": 0.05, "speaker": "p", "text": "bad \\udcff"}')
    assert "not valid UTF-8" in text_problems(_meta(text=[surrogate]))[0][1]
    assert "outside the window" in text_problems(_meta(text=[{**good, "t": 3.0}]))[0][1]

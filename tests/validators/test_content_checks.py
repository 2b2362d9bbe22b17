"""Content checks (level full): clean versions pass; what convert makes from valid captures passes
(variable frame rate, text without a speaker); undecodable, frozen and black clips, clocks that disagree,
bad arrays, events and text are each named by their own check."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dsbuild.core.errors import FormatError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats.probe import frame_rate
from dsbuild.formats.sample import SampleMeta, npy_bytes, npy_load
from dsbuild.validators import ValidateOptions, parse_spec, render_html, to_json, validate
from dsbuild.validators.checks.content import (
    action_problems,
    analyse_video,
    dhash,
    events_problems,
    median,
    span,
    telemetry_problems,
    text_problems,
    timestamp_problems,
    video_problems,
)
from dsbuild.validators.spec import default_spec
from tests.helpers import lose_a_frames_tail
from tests.validators.support import (
    build,
    copy_catalog,
    reseal,
    rows,
    write_moving_session,
    write_still_session,
    write_vfr_session,
)

CONTENT = (
    "decode",
    "frame_count",
    "fps",
    "resolution",
    "duration",
    "black_clips",
    "frozen_clips",
    "audio",
    "actions",
    "telemetry",
    "timestamps",
    "action_events",
    "text",
)
FULL = ValidateOptions(level="full")
ONE = ExecutorSpec(workers=1)


def statuses(report, names=CONTENT) -> dict[str, str]:
    return {c.name: c.status for c in report.checks if c.name in names}


@pytest.fixture(scope="module")
def stills(tmp_path_factory):
    """Two moving sessions, a still (frozen) one and a black one; 1 s clips."""
    root = tmp_path_factory.mktemp("stills")
    caps = root / "caps"
    write_moving_session(caps, "mv-a", "Kart Storm", "p-1", seed=1)
    write_moving_session(caps, "mv-b", "Sky Rally", "p-2", seed=2)
    gray = np.zeros((120, 160, 3), np.uint8)
    gray[:, :, 1] = np.arange(160, dtype=np.uint8)[None, :]
    write_still_session(caps, "still", gray)
    write_still_session(caps, "black", np.zeros((120, 160, 3), np.uint8), title="Kart Storm")
    return build(caps, root / "cat", clip_seconds=1.0)


@pytest.mark.parametrize("fixture, workers", [("wds_catalog", 2), ("parquet_catalog", 1)])
def test_clean_versions_pass_every_content_check(fixture, workers, request):
    cat, vid = request.getfixturevalue(fixture)
    report = validate(cat, vid, options=FULL, executor=ExecutorSpec(workers=workers))
    assert statuses(report) == dict.fromkeys(CONTENT, "pass")
    assert report.summary.checked_content == report.summary.samples > 0
    assert report.summary.decoded_frames == sum(r.frames for r in rows(cat, vid))


def test_what_convert_makes_from_vfr_captures_and_speakerless_text_passes(tmp_path):
    caps = tmp_path / "caps"
    write_vfr_session(caps, "vfr", [33] * 45 + [67] * 45 + [20] * 60)  # 30, then 15, then 50 fps
    write_moving_session(
        caps,
        "narrated",
        "Kart Storm",
        "p-1",
        text=[{"t": 0.4, "text": "race start"}, {"t": 1.2, "speaker": "p-1", "text": "go"}],
    )
    cat, vid = build(caps, tmp_path / "cat", clip_seconds=1.0)
    metas = {r.key: r for r in rows(cat, vid) if r.session_id == "vfr"}
    assert len({round(r.fps, 3) for r in metas.values()}) == 1  # one stream rate for every clip...
    report = validate(cat, vid, options=FULL, executor=ONE)
    assert statuses(report) == dict.fromkeys(CONTENT, "pass"), [c.message for c in report.checks if c.failed]
    fps = report.check("fps").distribution
    assert max(fps.values) < 1e-6 and fps.threshold == 0.02  # ...while the clips' own rates are 30, 15, 50


def test_frozen_and_black_clips_are_named_and_plotted_against_their_threshold(stills):
    cat, vid = stills
    report = validate(cat, vid, options=FULL, executor=ONE)
    keys = [r.key for r in rows(cat, vid)]
    black = {k for k in keys if k.startswith("black__")}
    frozen = black | {k for k in keys if k.startswith("still__")}
    assert {o.item for o in report.check("frozen_clips").offenders} == frozen
    assert {o.item for o in report.check("black_clips").offenders} == black
    assert report.check("frozen_clips").status == report.check("black_clips").status == "fail"
    assert report.check("frozen_clips").measured == round(len(frozen) / len(keys), 6)
    motion = report.check("frozen_clips").distribution
    assert motion.threshold_key == "frozen_motion" and motion.bad == "below" and len(motion.values) == len(keys)
    assert sum(v < motion.threshold for v in motion.values) == len(frozen)
    assert {c.name for c in report.checks if c.failed} == {"frozen_clips", "black_clips"}
    assert report.check("near_duplicates").status == "warn"  # still clips look alike: reported, not rejected


def test_near_duplicates_decode_the_clips_even_with_every_content_check_off(stills):
    off = "[severity]\n" + "".join(f'{n} = "off"\n' for n in CONTENT)
    report = validate(*stills, parse_spec(off, "off.toml"), FULL, executor=ONE)
    assert all(report.check(n).status == "skip" for n in CONTENT)
    assert report.check("near_duplicates").status == "warn" and "(8 hashed)" in report.check("near_duplicates").message


def test_undecodable_video_fails_decode_naming_the_sample(stills, tmp_path):
    cat = copy_catalog(stills[0], tmp_path / "cat")
    victim = [r.key for r in rows(cat, stills[1])][2]

    def edit(key, members):
        return [
            (
                e,
                b"\x00\x00\x00\x18ftypisom" + bytes(range(256)) * (len(p) // 256)
                if e == "mp4" and key == victim
                else p,
            )
            for e, p in members
        ]

    vid = reseal(cat, stills[1], edit)
    report = validate(cat, vid, options=FULL, executor=ONE)
    assert [o.item for o in report.check("decode").offenders] == [victim]
    assert [o.item for o in report.check("frame_count").offenders] == [victim]
    assert all(report.check(n).status == "pass" for n in ("manifest", "shard_hashes", "index", "members"))


def test_timestamps_that_disagree_with_the_clip_fail_fps_and_duration(stills, tmp_path):
    cat = copy_catalog(stills[0], tmp_path / "cat")
    victim = next(r.key for r in rows(cat, stills[1]))

    def edit(key, members):
        if key != victim:
            return members
        out = []
        for e, p in members:
            if e == "timestamps.npy":
                ts = npy_load(p)
                p = npy_bytes(ts[0] + (ts - ts[0]) * 0.5)  # a clock running at half speed: still in the window
            out.append((e, p))
        return out

    vid = reseal(cat, stills[1], edit)
    report = validate(cat, vid, options=FULL, executor=ONE)
    assert [o.item for o in report.check("fps").offenders] == [victim]
    assert "the sample's timestamps give" in report.check("fps").offenders[0].detail
    assert [o.item for o in report.check("duration").offenders] == [victim]
    assert report.check("timestamps").status == "pass"


def test_a_duration_label_that_is_not_the_clip_window_fails_timestamps(stills, tmp_path):
    """A version whose metadata said a clip lasts 999 s passed --level full: no check read the label."""
    cat = copy_catalog(stills[0], tmp_path / "cat")
    victim = rows(cat, stills[1])[0].key

    def edit(key, members):
        if key != victim:
            return members
        doc = json.loads(dict(members)["json"])
        doc["clip"]["duration"] = 999.0
        return [(e, json.dumps(doc).encode() if e == "json" else p) for e, p in members]

    report = validate(cat, reseal(cat, stills[1], edit), options=FULL, executor=ONE)
    [offender] = report.check("timestamps").offenders
    assert offender.item == victim and "metadata duration 999.000000 s" in offender.detail


def test_hostile_arrays_are_findings_never_crashes(stills, tmp_path):
    cat = copy_catalog(stills[0], tmp_path / "cat")
    keys = [r.key for r in rows(cat, stills[1])]
    pair = [("t", "<f8"), ("u", "<f8")]
    odd = {
        keys[0]: {"timestamps.npy": np.zeros(30, dtype=pair), "actions.npy": np.zeros((30, 2), dtype=pair)},
        keys[1]: {"timestamps.npy": np.full(30, np.nan), "telemetry.npy": np.full((30, 1), np.inf, np.float32)},
    }

    def edit(key, members):
        return [(e, npy_bytes(odd[key][e]) if e in odd.get(key, {}) else p) for e, p in members]

    vid = reseal(cat, stills[1], edit)
    report = validate(cat, vid, options=FULL, executor=ONE)
    found = {c.name: {o.item for o in c.offenders} for c in report.checks if c.offenders}
    assert found["timestamps"] == {keys[0], keys[1]} and found["actions"] == {keys[0]}
    assert found["telemetry"] == {keys[1]} and keys[0] not in found.get("fps", set())
    assert all(np.isfinite(report.check(n).distribution.values).all() for n in ("fps", "duration"))
    assert 'id="verdict">REJECTED' in render_html(report) and json.loads(to_json(report))["verdict"] == "rejected"


def _encode(frames: list[np.ndarray], fps: int = 30, audio_seconds: float | None = None) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=fps)
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = "yuv420p"
        a = c.add_stream("aac", rate=48000) if audio_seconds else None
        for i, img in enumerate(frames):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for i in range(int(audio_seconds * 48000 / 1024) if a else 0):
            af = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            af.sample_rate, af.pts = 48000, i * 1024
            for p in a.encode(af):
                c.mux(p)
        for stream in (s, a) if a else (s,):
            for p in stream.encode():
                c.mux(p)
    return buf.getvalue()


def test_analyse_video_measures_motion_darkness_rate_span_and_audio():
    moving = [np.full((48, 64, 3), (i * 8) % 256, np.uint8) for i in range(32)]
    v = analyse_video(_encode(moving), 32)
    assert v["error"] is None and v["decoded"] == 32 and v["sizes"] == [(64, 48)]
    assert abs(v["fps"] - 30) < 1e-6 and abs(v["span"] - 32 / 30) < 1e-6 and v["motion"] > 5
    assert v["audio"] is False and len(v["phash"]) == 4
    still = analyse_video(_encode([np.zeros((48, 64, 3), np.uint8)] * 20), 20)
    assert still["motion"] < 0.1 and still["luma_max"] < 1
    junk = analyse_video(b"not a video at all" * 10, 10)
    assert junk["decoded"] == 0 and junk["error"].startswith("not a readable video") and junk["audio"] is None
    loud = analyse_video(_encode(moving, audio_seconds=32 / 30), 32)["audio"]
    assert loud["codec"] == "aac" and loud["sample_rate"] == 48000 and loud["packets"] > 40
    assert abs(loud["frame_seconds"] - 1024 / 48000) < 1e-6
    assert abs(loud["start"]) <= loud["frame_seconds"] and abs(loud["end"] - 32 / 30) <= 2 * loud["frame_seconds"]


def test_bitstream_damage_that_ffmpeg_would_conceal_is_a_decode_failure():
    import av

    rng = np.random.default_rng(3)
    data = lose_a_frames_tail(_encode([rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(32)]))
    lenient = 0
    with av.open(io.BytesIO(data)) as c:
        try:
            for _ in c.decode(video=0):
                lenient += 1
        except av.error.FFmpegError:
            pass
    v = analyse_video(data, 32)
    assert v["error"] and v["error"].startswith("decode error after")
    assert v["decoded"] < lenient  # FFmpeg alone conceals the damage and goes on decoding


def test_rates_and_spans_come_from_frame_times_the_way_convert_computes_them():
    cfr = np.arange(30) / 30
    assert frame_rate(cfr) == pytest.approx(30) and span(cfr) == pytest.approx(1.0)
    vfr = np.concatenate([np.arange(10) / 30, 10 / 30 + np.arange(1, 11) / 15])
    assert frame_rate(vfr) == pytest.approx(19 / vfr[-1]) and span(vfr) == pytest.approx(20 / frame_rate(vfr))
    assert frame_rate(np.array([1.0])) is None and span(np.array([1.0])) is None


VIDEO = {
    "decoded": 30,
    "error": None,
    "sizes": [(64, 48)],
    "fps": 30.0,
    "span": 1.0,
    "audio": False,
    "luma_max": 100.0,
    "motion": 40.0,
}
EXPECT = {"frames": 30, "fps": 30.0, "width": 64, "height": 48, "duration": 1.0, "t_start": 0.0, "audio": None}


def test_video_problems_apply_the_spec_tolerances():
    spec = default_spec()
    assert video_problems(VIDEO, EXPECT, spec, audio_expected=False) == []
    assert video_problems({**VIDEO, "fps": 30.5, "span": 1.04}, EXPECT, spec, False) == []  # within 2%, 1.5 frames
    bad = video_problems(
        {**VIDEO, "fps": 25.0, "span": 1.2, "sizes": [(64, 48), (32, 24)]},
        {**EXPECT, "frames": 31},
        spec,
        audio_expected=True,
    )
    assert [c for c, _ in bad] == ["frame_count", "fps", "resolution", "duration", "audio"]
    dark = video_problems({**VIDEO, "luma_max": 3.0, "motion": 0.5}, EXPECT, spec, False)
    assert [c for c, _ in dark] == ["black_clips", "frozen_clips"]
    # a window over a gap in the recording (a capture card that lost its signal), as convert cut it before
    assert video_problems(VIDEO, {**EXPECT, "window_end": 1.0}, spec, False) == []
    [(check, why)] = video_problems(VIDEO, {**EXPECT, "window_end": 58.9}, spec, False)
    assert check == "duration" and "past its last frame" in why


def test_audio_must_start_and_end_with_the_video_and_where_the_metadata_says():
    spec, frame = default_spec(), 1024 / 48000
    audio = {
        "codec": "aac",
        "sample_rate": 48000,
        "start": 0.0,
        "end": 1.0,
        "frame_seconds": frame,
        "packets": 47,
        "error": None,
    }
    placed = {**EXPECT, "window_end": 1.0, "audio": {"start": 0.0, "duration": 1.0}}
    assert video_problems({**VIDEO, "audio": audio}, placed, spec, audio_expected=True) == []
    assert video_problems({**VIDEO, "audio": {**audio, "start": frame / 2}}, placed, spec, True) == []
    late = video_problems({**VIDEO, "audio": {**audio, "start": 0.1, "end": 1.1}}, placed, spec, True)
    assert (
        [c for c, _ in late] == ["audio", "audio"] and "starts +0.1000 s" in late[0][1] and "out of sync" in late[1][1]
    )
    short = video_problems({**VIDEO, "audio": {**audio, "end": 0.5}}, placed, spec, True)
    assert "lasts 0.5000 s, metadata says 1.0000 s" in short[0][1]
    assert "no packets" in video_problems({**VIDEO, "audio": {**audio, "start": None}}, placed, spec, True)[0][1]
    broken = {**audio, "error": "audio packet 3 does not decode"}
    assert video_problems({**VIDEO, "audio": broken}, placed, spec, True) == [("audio", broken["error"])]
    assert video_problems({**VIDEO, "audio": audio}, EXPECT, spec, False)[0][1].startswith("clip has an audio stream")


def test_dhash_is_stable_under_small_noise_and_differs_for_other_images():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (48, 64)).astype(np.float32)
    noisy = img + rng.normal(0, 1, img.shape)
    other = rng.integers(0, 255, (48, 64)).astype(np.float32)
    assert bin(dhash(img) ^ dhash(noisy)).count("1") <= 6
    assert bin(dhash(img) ^ dhash(other)).count("1") > 16


def _meta(frames=3, t0=0.0, t1=0.1, action_events=1, text=()) -> SampleMeta:
    return SampleMeta.from_json(
        {
            "format": "dsbuild.sample/2",
            "key": "s__000000",
            "session": {"session_id": "s", "title": "T", "player": "p"},
            "clip": {"index": 0, "t_start": t0, "t_end": t1, "frames": frames, "duration": t1 - t0},
            "video": {"codec": "h264", "width": 8, "height": 8, "fps": 30.0},
            "controls": ["a", "x"],
            "telemetry_channels": ["speed"],
            "text": list(text),
            "action_events": action_events,
            "sources": {},
        },
        "test",
    )


def test_array_problems_name_shape_range_finiteness_and_order():
    meta = _meta()
    assert action_problems(meta, np.zeros((3, 2), np.float32)) == []
    assert telemetry_problems(meta, np.zeros((3, 1), np.float32)) == []
    assert timestamp_problems(meta, np.array([0.0, 0.03, 0.06])) == []
    assert "outside [-1, 1]" in action_problems(meta, np.full((3, 2), 2, np.float32))[0]
    assert "expected float32 [3, 2]" in action_problems(meta, np.zeros((2, 2), np.float32))[0]
    assert "non-finite" in telemetry_problems(meta, np.full((3, 1), np.nan, np.float32))[0]
    assert "not strictly increasing" in timestamp_problems(meta, np.array([0.0, 0.06, 0.03]))[0]
    assert "outside the window" in timestamp_problems(meta, np.array([0.0, 0.03, 0.2]))[0]


def test_events_problems_check_window_controls_values_count_and_the_loaders_bound():
    z = zstandard.ZstdCompressor()
    assert events_problems(_meta(), z.compress(b'{"control":"a","t":0.01,"value":1.0}\n')) == []
    late = z.compress(b'{"control":"a","t":0.5,"value":1.0}\n{"control":"q","t":0.02,"value":1.0}\n')
    found = events_problems(_meta(), late)
    assert "outside the window" in found[0] and "(and 1 more)" in found[0] and "2 events" in found[1]
    assert "do not decompress" in events_problems(_meta(), b"plain bytes")[0]
    bomb = zstandard.ZstdCompressor(level=1).compress(b"\n" * (65 << 20))  # 65 MiB is within the loader's bound
    assert "over" not in " ".join(events_problems(_meta(action_events=0), bomb))
    # within that bound, 250 MiB of "{}" lines cost 5.8 GB and 92 s (a list of lines, one parse each)
    lines = zstandard.ZstdCompressor(level=1).compress(b"{}\n" * ((1 << 22) + 1))
    assert events_problems(_meta(), lines) == ["events hold more than 4194304 lines (over the limit)"]


def test_text_events_need_no_speaker_but_must_lie_in_the_window():
    assert (
        text_problems(_meta(text=[{"t": 0.05, "text": "narration"}, {"t": 0.06, "speaker": "p", "text": "ok"}])) == []
    )
    assert "outside the window" in text_problems(_meta(text=[{"t": 3.0, "speaker": "p", "text": "late"}]))[0][1]
    with pytest.raises(FormatError, match=r"text\[0\]: speaker"):  # types are proven when the metadata is read
        _meta(text=[{"t": 0.05, "speaker": 7, "text": "x"}])


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(0, 255, width=32)))
def test_median_is_numpys_to_the_bit(x):
    """The motion statistic's median (numpy's imports numpy.ma in every worker) equals np.median exactly."""
    ours, theirs = median(x), np.median(x)
    assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()

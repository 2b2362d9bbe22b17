"""Captures written by real encoders (the ffmpeg CLI, as OBS, capture cards and consoles write them)
convert without re-encoding into MP4 clips that decode completely with PyAV and with ffprobe, carry their
audio in sync, and pass validation at --level full."""

from __future__ import annotations

import io
import json
import math
import shutil
import tarfile
from collections import defaultdict
from pathlib import Path

import av
import numpy as np
import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats.audio import decode_audio
from dsbuild.formats.probe import probe_clip
from dsbuild.formats.sample import npy_load
from dsbuild.formats.transcode import TranscodeSpecError, parse_transcode
from dsbuild.formats.video import DemuxReport, VideoSource
from dsbuild.loader import Loader
from dsbuild.validators import ValidateOptions, validate
from tests.helpers import manifest, session_records, shard_files
from tests.recorders import RECORDERS, SECONDS, ffmpeg, ffprobe_frames, record, write_streams

CLIP = 0.5  # seconds: four clips per 2 s capture, so every kind has cuts inside it
SLACK = 1e-3  # seconds beyond one audio frame


def _samples(catalog: Path, vid: str) -> dict[str, list[dict]]:
    """Samples of a WebDataset version by session: {"json": meta, "<ext>": bytes, ...} in key order."""
    by_key: dict[str, dict] = defaultdict(dict)
    for shard in shard_files(catalog, vid):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                by_key[key][ext] = tf.extractfile(m).read()
    out: dict[str, list[dict]] = defaultdict(list)
    for key in sorted(by_key):
        s = by_key[key]
        s["json"] = json.loads(s["json"])
        s["timestamps"] = np.load(io.BytesIO(s["timestamps.npy"]), allow_pickle=False)
        out[s["json"]["session"]["session_id"]].append(s)
    return out


def _convert_capture(tmp_path: Path, name: str, video: bytes, ext: str = "ts") -> tuple:
    """One capture session ``name`` whose video file holds ``video``, converted in 0.5-s clips:
    (the convert result, the session's record)."""
    d = tmp_path / "caps" / name
    d.mkdir(parents=True)
    (d / f"video.{ext}").write_bytes(video)
    write_streams(d, f"video.{ext}", name)
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    return r, session


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Every recorder kind, converted once (0.5 s clips) and validated once at --level full."""
    root = tmp_path_factory.mktemp("recorders")
    for kind in RECORDERS:
        record(root / "caps", kind)
    r = convert(root / "caps", root / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    report = validate(
        root / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    return root, r, report, _samples(root / "cat", r.version_id)


def _session(recorded, kind: str) -> Path:
    """The module's recording of ``kind`` (what ``record`` writes: the encoder runs once a module); copy it
    before changing it."""
    return recorded[0] / "caps" / kind.replace("_", "-")


def test_no_session_is_quarantined_and_validation_passes_every_check(recorded):
    _, r, report, samples = recorded
    assert r.quarantined == () and set(samples) == {k.replace("_", "-") for k in RECORDERS}
    failed = {c.name: c.message for c in report.checks if c.status == "fail"}
    assert failed == {}


@pytest.mark.parametrize("kind", sorted(RECORDERS))
def test_every_clip_is_mp4_and_decodes_fully_with_pyav_and_ffprobe(recorded, kind, tmp_path):
    _, _, _, samples = recorded
    clips = samples[kind.replace("_", "-")]
    assert len(clips) >= 3  # cut inside the capture, not one clip
    for s in clips:
        meta = s["json"]
        assert set(s) >= {"mp4"} and not {"webm", "mkv"} & set(s)
        assert meta["video"]["container"] == "mp4"
        frames = meta["clip"]["frames"]
        probe = probe_clip(s["mp4"])
        assert probe.error is None and probe.frames == frames == len(s["timestamps"])
        path = tmp_path / "clip.mp4"
        path.write_bytes(s["mp4"])
        assert ffprobe_frames(path)[0] == frames
        ts = s["timestamps"]
        assert np.all(np.diff(ts) > 0) and meta["clip"]["t_start"] <= ts[0] and ts[-1] < meta["clip"]["t_end"]
        # the decoded frame times are the recorded ones, shifted to start at 0
        np.testing.assert_allclose(probe.frame_t, ts - ts[0], atol=1e-3)


@pytest.mark.parametrize("kind", sorted(k for k, r in RECORDERS.items() if r.audio))
def test_audio_is_carried_in_sync_within_one_audio_frame(recorded, kind):
    _, _r, _, samples = recorded
    clips = samples[kind.replace("_", "-")]
    for s in clips:
        video = s["json"]["video"]
        assert video["has_audio"] and video["audio"]["sample_rate"] == 48000 and video["audio"]["channels"] == 1
        a = probe_clip(s["mp4"]).audio
        # MP4 has one object type for MPEG-1 audio: MP2 reads back as "mp3" (and decodes, layer II intact)
        assert a is not None and a.error is None and a.codec == {"mp2": "mp3"}.get(*[video["audio"]["codec"]] * 2)
        assert -SLACK <= a.start <= a.frame_seconds + SLACK  # starts with the first frame, never before it
    # ends agree with the window's end too, except where the recording's audio itself stops (the last clip)
    for s in clips[:-1]:
        a, c = probe_clip(s["mp4"]).audio, s["json"]["clip"]
        assert -SLACK <= a.end - (c["t_end"] - c["t_start"]) <= a.frame_seconds + SLACK
    session = next(x for x in session_records(*_cat(recorded))["sessions"] if x["session_id"] == kind.replace("_", "-"))
    assert session["repairs"]["audio_not_carried"] is False
    audio = session["repairs"]["video"]["audio"]
    assert audio["clips_with_audio"] == len(clips) and audio["undecodable"] == audio["clips_without_audio"] == 0


def _cat(recorded) -> tuple[Path, str]:
    root, r, _, _ = recorded
    return root / "cat", r.version_id


def test_hevc_tags_survive_and_untagged_hevc_gets_hvc1(recorded, tmp_path):
    _, _, _, samples = recorded
    for kind in ("x265-hvc1-mov", "x265-mkv", "x265-ts"):
        for s in samples[kind]:
            (tmp_path / "c.mp4").write_bytes(s["mp4"])
            assert ffprobe_frames(tmp_path / "c.mp4")[1] == "hvc1" == s["json"]["video"]["codec_tag"]
    d = tmp_path / "caps" / "hev1"
    d.mkdir(parents=True)
    ffmpeg(
        "-i",
        str(_session(recorded, "x265_hvc1_mov") / "video.mov"),
        "-c",
        "copy",
        "-tag:v",
        "hev1",
        str(d / "hev1.mov"),
    )
    write_streams(d, "hev1.mov", "hev1")
    with VideoSource(d / "hev1.mov") as src:
        assert src.info.codec_tag == "hev1"
        clip = next(src.clips(CLIP, DemuxReport()))
    (tmp_path / "h.mp4").write_bytes(clip.data)
    assert ffprobe_frames(tmp_path / "h.mp4")[1] == "hev1"


def test_open_gop_leading_frames_are_dropped_counted_and_shorten_the_previous_window(recorded):
    _, _, _, samples = recorded
    sessions = {s["session_id"]: s for s in session_records(*_cat(recorded))["sessions"]}
    for kind in ("x264-opengop-ts", "x265-mkv", "mpeg2-ts"):
        clips = samples[kind]
        dropped = sessions[kind]["repairs"]["video"]["dropped_leading"]
        assert dropped > 0
        fps = 30
        recorded_frames = sum(s["json"]["clip"]["frames"] for s in clips)
        assert recorded_frames + dropped == round(2.0 * fps)
        for a, b in zip(clips, clips[1:]):
            # a window ends where its last carried frame ends: dropped frames leave a gap, never a frame short
            assert a["json"]["clip"]["t_end"] <= b["json"]["clip"]["t_start"]
            assert abs(a["json"]["clip"]["t_end"] - a["timestamps"][-1] - 1 / fps) < 2e-3


def test_mkv_without_dts_and_vfr_keep_their_timestamps(recorded):
    _, _, _, samples = recorded
    vfr = samples["vfr-aac-mp4"]
    steps = np.diff(np.concatenate([s["timestamps"] for s in vfr]))
    assert steps.max() > 1.5 * np.median(steps)  # the dropped frames are still gaps: VFR stays VFR
    assert sum(s["json"]["clip"]["frames"] for s in vfr) == 60 - 60 // 7 - 1


def test_codec_mp4_cannot_hold_is_a_one_line_quarantine_and_transcode_rescues_it(recorded, tmp_path):
    caps = tmp_path / "caps"
    d = caps / "vp8"
    d.mkdir(parents=True)
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=30:duration=1",
        "-c:v",
        "libvpx",
        "-g",
        "15",
        str(d / "video.webm"),
    )
    write_streams(d, "video.webm", "vp8")
    shutil.copytree(_session(recorded, "silent_x264_mp4"), caps / "silent-x264-mp4")
    r = convert(caps, tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [q] = r.quarantined
    assert "\n" not in q.reason and all(w in q.reason for w in ("vp8", "matroska", "MP4", "transcode"))
    ok = convert(
        caps,
        tmp_path / "cat2",
        ConvertConfig(clip_seconds=CLIP, transcode="h264:gop15"),
        executor=ExecutorSpec(workers=1),
    )
    assert ok.quarantined == () and ok.samples == 2 + 4


def test_broken_audio_keeps_the_video_and_is_a_counted_repair(recorded, tmp_path):
    caps = tmp_path / "caps"
    good = _session(recorded, "obs_x264_mkv")
    d = caps / "broken-audio"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with av.open(str(good / "video.mkv")) as src, av.open(str(d / "video.mkv"), "w") as dst:
        vs, as_ = src.streams.video[0], src.streams.audio[0]
        ov, oa = dst.add_stream_from_template(vs), dst.add_stream_from_template(as_)
        for p in src.demux(vs, as_):
            if p.size == 0:
                continue
            if p.stream is as_:  # same sizes and times, garbage payload
                q = av.Packet(rng.integers(0, 256, p.size, dtype=np.uint8).tobytes())
                q.pts, q.dts, q.duration, q.time_base = p.pts, p.dts, p.duration, p.time_base
                q.stream = oa
                dst.mux(q)
            else:
                p.stream = ov
                dst.mux(p)
    write_streams(d, "video.mkv", "broken-audio")
    r = convert(caps, tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    assert r.quarantined == () and r.samples >= 3
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    audio = session["repairs"]["video"]["audio"]
    assert audio["undecodable"] > 0 and audio["clips_without_audio"] > 0
    assert audio["clips_with_audio"] + audio["clips_without_audio"] == r.samples
    for s in _samples(tmp_path / "cat", r.version_id)["broken-audio"]:
        probe = probe_clip(s["mp4"])
        assert probe.error is None and probe.frames == s["json"]["clip"]["frames"]
        assert s["json"]["video"]["has_audio"] == (probe.audio is not None)
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.check("audio").status == "pass" and report.check("decode").status == "pass"


def test_a_recording_cut_short_keeps_only_clips_whose_audio_covers_them(tmp_path):
    """A recording whose audio stops inside its last clip (a capture card's TS cut short, an audio device
    that went away): that clip used to carry audio ending early, which validate then refused, and with
    it the version. It is carried without audio instead, counted."""
    caps = tmp_path / "caps"
    d = caps / "cut-short"
    d.mkdir(parents=True)
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=160x120:rate=30:duration={SECONDS}",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency=440:sample_rate=48000:duration={SECONDS - 0.6}",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-bf",
        "2",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        str(d / "video.ts"),
    )
    write_streams(d, "video.ts", "cut-short")
    r = convert(caps, tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    assert r.quarantined == () and r.samples >= 2
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    audio = session["repairs"]["video"]["audio"]
    assert audio["partial_clips"] >= 1 and audio["clips_with_audio"] + audio["clips_without_audio"] == r.samples
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.check("audio").status == "pass" and report.check("decode").status == "pass"


def test_a_recording_whose_clock_goes_back_ends_there_counted_never_an_inverted_window(tmp_path):
    """Two recordings in one TS (a capture card that restarted): the second's timestamps start over. Its
    packets used to count as open-GOP leading frames and give a window ending before it starts."""
    one = tmp_path / "one.ts"
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=160x120:rate=30:duration={SECONDS}",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency=440:sample_rate=48000:duration={SECONDS}",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-bf",
        "2",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        str(one),
    )
    r, session = _convert_capture(tmp_path, "restarted", one.read_bytes() * 2)
    assert r.quarantined == () and r.repaired_sessions == 1
    video = session["repairs"]["video"]
    assert "timestamps go back" in video["truncated"] and video["dropped_after_restart"] >= SECONDS * 30
    assert video["dropped_leading"] == 0
    windows = sorted(
        (s["json"]["clip"]["t_start"], s["json"]["clip"]["t_end"])
        for s in _samples(tmp_path / "cat", r.version_id)["restarted"]
    )
    assert all(a < b for a, b in windows) and windows[-1][1] <= SECONDS + 0.05
    # the second recording's audio (its clock restarted too) was mixed into the last clip: twice its samples
    assert "audio timestamps go back" in video["audio"]["error"]
    for s in _samples(tmp_path / "cat", r.version_id)["restarted"]:
        if "mp4" in s and s["json"]["video"]["has_audio"]:
            window = s["json"]["clip"]["t_end"] - s["json"]["clip"]["t_start"]
            assert len(decode_audio(s["mp4"], 16000)) / 16000 < window + 0.05
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.accepted, [c.name for c in report.checks if c.failed]


def _x264_aac(seconds: float, out: Path, *extra: str) -> None:
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=160x120:rate=30:duration={seconds}",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency=440:sample_rate=48000:duration={seconds}",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-bf",
        "3",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        *extra,
        str(out),
    )


def test_an_mp4_trimmed_without_reencoding_keeps_the_clock_players_show(tmp_path):
    """``ffmpeg -ss 1.3 -c copy`` (LosslessCut and the like) writes an edit list: packets before the cut
    stay in the file, flagged discard, and players start at the cut. They were kept as frames, and the
    session's clock started on the first hidden one: every frame, and the actions held against it, sat
    0.3 s late. Now they are dropped and counted, and each delivered frame is the one a player shows at
    its timestamp."""
    long = tmp_path / "long.mp4"
    _x264_aac(4.0, long)
    d = tmp_path / "caps" / "trimmed"
    d.mkdir(parents=True)
    ffmpeg("-ss", "1.3", "-i", str(long), "-c", "copy", str(d / "video.mp4"))
    write_streams(d, "video.mp4", "trimmed")
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    assert session["repairs"]["video"]["dropped_edit_list"] > 0
    with av.open(str(d / "video.mp4")) as c:
        shown = {round(float(f.pts * f.time_base), 4): f.to_ndarray(format="rgb24") for f in c.decode(video=0)}
    assert min(shown) == 0.0  # the player's clock
    delivered = 0
    with Loader(tmp_path / "cat", decode="frames", batch_size=1, shuffle="none", num_workers=1) as loader:
        for b in loader:
            n = int(b["lengths"][0])
            for frame, t in zip(b["frames"][0][:n], b["timestamps"][0][:n]):
                assert np.array_equal(frame, shown[round(float(t), 4)]), t
                delivered += 1
    assert delivered >= len(shown) - 30  # at most the hidden keyframe's GOP is lost (counted)


def test_a_gap_in_the_recording_ends_the_window_at_its_last_frame_counted(tmp_path):
    """A capture card that lost its signal: the TS timestamps jump 30 s forward. The clip before the jump
    had a window over the whole gap (0.5 s of video, a 28.5 s window holding every action logged
    meanwhile) and validate accepted it. Now it ends where its last frame ends, and the gap is counted."""
    a, b = tmp_path / "a.ts", tmp_path / "b.ts"
    _x264_aac(SECONDS, a)
    _x264_aac(SECONDS, b, "-output_ts_offset", "30")
    r, session = _convert_capture(tmp_path, "signal-lost", a.read_bytes() + b.read_bytes())
    assert session["repairs"]["video"]["gaps"] == 1
    frame = 1 / 30
    for s in _samples(tmp_path / "cat", r.version_id)["signal-lost"]:
        clip, ts = s["json"]["clip"], s["timestamps"]
        assert clip["t_end"] - clip["t_start"] <= CLIP + 2 * frame  # no window stretched over the gap
        assert abs(clip["t_end"] - (ts[-1] - ts[0] + clip["t_start"]) - frame) < frame / 2 + SLACK
    windows = sorted(
        (s["json"]["clip"]["t_start"], s["json"]["clip"]["t_end"])
        for s in _samples(tmp_path / "cat", r.version_id)["signal-lost"]
    )
    assert any(later - end > 25 for (_, end), (later, _) in zip(windows, windows[1:]))  # the gap stays on the clock
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.accepted, [c.name for c in report.checks if c.failed]


def test_audio_false_drops_audio_as_a_recorded_choice(recorded, tmp_path):
    shutil.copytree(_session(recorded, "obs_x264_mkv"), tmp_path / "caps" / "obs-x264-mkv")
    r = convert(
        tmp_path / "caps",
        tmp_path / "cat",
        ConvertConfig(clip_seconds=CLIP, audio=False),
        executor=ExecutorSpec(workers=1),
    )
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    assert session["repairs"]["audio_not_carried"] is True
    for s in _samples(tmp_path / "cat", r.version_id)["obs-x264-mkv"]:
        assert probe_clip(s["mp4"]).audio is None and s["json"]["video"]["has_audio"] is False
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.check("audio").status == "pass"


def test_transcode_is_deterministic_and_validates(recorded, tmp_path):
    shutil.copytree(_session(recorded, "vfr_aac_mp4"), tmp_path / "caps" / "vfr-aac-mp4")
    config = ConvertConfig(clip_seconds=CLIP, transcode="h264:64x48:20fps:gop8")
    a = convert(tmp_path / "caps", tmp_path / "a", config, executor=ExecutorSpec(workers=1))
    b = convert(tmp_path / "caps", tmp_path / "b", config, executor=ExecutorSpec(workers=1))
    assert a.version_id == b.version_id
    assert [p.read_bytes() for p in shard_files(tmp_path / "a", a.version_id)] == [
        p.read_bytes() for p in shard_files(tmp_path / "b", b.version_id)
    ]
    m = manifest(tmp_path / "a", a.version_id)
    assert m["config"]["transcode"] == "h264:64x48:20fps:gop8:crf23:yuv420p"
    assert m["config"]["transcode_encoder"]["encoder"] == "libx264"
    for s in _samples(tmp_path / "a", a.version_id)["vfr-aac-mp4"]:
        probe = probe_clip(s["mp4"])
        c = s["json"]["clip"]
        assert probe.sizes == ((64, 48),) and probe.frames == c["frames"] == math.ceil((c["t_end"] - c["t_start"]) * 20)
        np.testing.assert_allclose(np.diff(s["timestamps"]), 1 / 20)
        assert b"x264 - core" not in s["mp4"] and b"Lavf" not in s["mp4"]
        assert probe.audio is not None
    report = validate(
        tmp_path / "a", a.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert {c.name: c.message for c in report.checks if c.status == "fail"} == {}


@pytest.mark.parametrize("spec", ["hevc:64x48:gop4", "av1:64x48:10fps", "vp9:64x48", "mjpeg:64x48:10fps:crf5"])
def test_every_transcode_codec_gives_the_same_bytes_twice(recorded, spec):
    d = _session(recorded, "obs_x264_mkv")

    def clips():
        with VideoSource(d / "video.mkv", transcode=spec) as src:
            return [c.data for c in src.clips(1.0, DemuxReport())]

    first = clips()
    assert first == clips()
    assert all(probe_clip(c).error is None for c in first)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("h263", ["codec", "h264"]),
        ("h264:256x", ["cannot read", "WxH"]),
        ("h264:15x16", ["even"]),
        ("h264:30fps:25fps", ["second time"]),
        ("av1:bf2", ["h264 and hevc"]),
        ("h264:crf60", ["0..51"]),
        ("h264:gop0", ["1..1000"]),
        ("h264:rgb24", ["pixel format", "yuv420p"]),
        ("vp9:0fps", ["1..240"]),
    ],
)
def test_bad_transcode_specs_name_the_bad_part(bad, words):
    with pytest.raises(TranscodeSpecError) as e:
        parse_transcode(bad)
    assert isinstance(e.value, ValueError) and all(w in str(e.value) for w in words)


def test_transcode_spec_round_trips_through_its_canonical_string():
    spec = parse_transcode("H264:GOP8:256x144:30000/1001fps:bf2:yuv444p")
    assert str(spec) == "h264:256x144:30000/1001fps:gop8:crf23:bf2:yuv444p"
    assert parse_transcode(str(spec)) == spec and spec.to_json()["fps"] == "30000/1001"
    settings = spec.encoder_settings()
    assert json.loads(json.dumps(settings)) == settings and settings["options"]["threads"] == "1"


def test_decode_audio_is_deterministic_and_resamples(recorded):
    _, _, _, samples = recorded
    for kind in ("vp9-opus-webm", "pcm-mov", "obs-x264-mkv"):
        clip = samples[kind][1]["mp4"]
        a, b = decode_audio(clip, 16000, 2), decode_audio(clip, 16000, 2)
        assert a.dtype == np.float32 and a.shape[1] == 2 and np.array_equal(a, b)
        span = probe_clip(clip).audio
        assert abs(len(a) / 16000 - (span.end - span.start)) < 0.03
        assert 0.05 < np.abs(a).max() <= 1.0  # the tone (lavfi sine: amplitude 1/8, -3 dB per upmixed channel)


def test_validate_names_audio_that_is_misplaced_missing_or_undecodable(recorded):
    from dsbuild.validators.checks.content import analyse_video, video_problems
    from dsbuild.validators.spec import default_spec

    _, _, _, samples = recorded
    s = samples["obs-x264-mkv"][1]
    c, video = s["json"]["clip"], s["json"]["video"]
    v = analyse_video(s["mp4"], c["frames"])
    ts = npy_load(s["timestamps.npy"])
    audio = {"start": video["audio"]["start"], "duration": video["audio"]["duration"]}
    expect = {
        "frames": c["frames"],
        "fps": 30.0,
        "width": 160,
        "height": 120,
        "duration": c["t_end"] - c["t_start"],
        "t_start": c["t_start"],
        "window_end": c["t_end"] - float(ts[0]),
        "audio": audio,
    }
    assert video_problems(v, expect, default_spec(), audio_expected=True) == []
    late = {**expect, "audio": {**audio, "start": audio["start"] + 0.05}}
    assert "audio starts" in video_problems(v, late, default_spec(), True)[0][1]
    short = {**expect, "audio": {**audio, "duration": audio["duration"] - 0.05}}
    assert "audio lasts" in video_problems(v, short, default_spec(), True)[0][1]
    unsynced = {**expect, "window_end": expect["window_end"] + 0.1}
    assert "out of sync" in video_problems(v, unsynced, default_spec(), True)[0][1]
    assert video_problems(v, expect, default_spec(), False)[0] == (
        "audio",
        "clip has an audio stream the metadata does not announce",
    )
    broken = {**v, "audio": {**v["audio"], "error": "audio packet 3 does not decode (Invalid data)"}}
    assert video_problems(broken, expect, default_spec(), True) == [("audio", broken["audio"]["error"])]


@pytest.mark.parametrize("kind", ["obs_x264_mkv", "x264_opengop_ts", "x264_flv", "pcm_mov"])
def test_damaged_recorder_files_fail_only_with_one_line_format_errors(recorded, kind, tmp_path):
    """Flipped bytes, cuts and overwritten runs: clips come out (damage inside a clip is validate's to find:
    convert decode-checks only a truncated file's tail) or a one-line FormatError says why, nothing else."""
    from dsbuild.core.errors import FormatError

    root = recorded[0]
    src = next((root / "caps" / kind.replace("_", "-")).glob("video.*"))
    data = src.read_bytes()
    rng = np.random.default_rng(7)
    for k in range(9):
        d = bytearray(data)
        if k % 3 == 0:
            for pos, value in zip(rng.integers(0, len(d), 20), rng.integers(0, 256, 20)):
                d[int(pos)] = int(value)
        elif k % 3 == 1:
            d = d[: int(rng.integers(1, len(d)))]
        else:
            i = int(rng.integers(0, len(d)))
            d[i : i + 2000] = rng.integers(0, 256, len(d[i : i + 2000]), dtype=np.uint8).tobytes()
        path = tmp_path / src.name
        path.write_bytes(bytes(d))
        try:
            with VideoSource(path) as s:
                for clip in s.clips(CLIP, DemuxReport()):
                    assert probe_clip(clip.data).codec is not None  # an MP4 FFmpeg opens
        except FormatError as e:
            assert "\n" not in str(e)


def test_h264_transcode_bytes_do_not_depend_on_memory_state():
    """The same frames encoded 200 times, amid freed memory full of random bytes, give the same bytes. (With
    x264's macroblock-tree rate control, which reads memory it never wrote when a clip ends inside its
    lookahead, about 1 encode in 20 of these grainy frames differed.)"""
    from fractions import Fraction

    from dsbuild.formats.mp4 import Mp4Writer
    from dsbuild.formats.transcode import ClipEncoder
    from dsbuild.samples.synthetic import frames as synthetic_frames
    from dsbuild.samples.writer import VideoSpec

    rgb = list(synthetic_frames(VideoSpec(64, 48, 20, 8), 12, np.random.default_rng(0), noise=16))
    spec = parse_transcode("h264:64x48:20fps:gop8")
    outputs, noise = set(), np.random.default_rng()
    for _ in range(200):
        garbage = [noise.bytes(int(n)) for n in noise.integers(1 << 8, 1 << 16, 64)]
        del garbage  # freed memory full of random bytes: what an encoder reading unwritten memory would see
        w = Mp4Writer()
        enc = ClipEncoder(w, spec, (64, 48), Fraction(20), Fraction(1, 20))
        frames = [
            (Fraction(k, 20), av.VideoFrame.from_ndarray(a, format="rgb24").reformat(format="yuv420p"))
            for k, a in enumerate(rgb)
        ]
        enc.encode(iter(frames), Fraction(0), Fraction(12, 20))
        outputs.add(w.close())
    assert len(outputs) == 1


def _decoded(container) -> tuple[list[str], int]:
    """(sha256 of every video frame's pixels, audio samples) of a whole container, decoded with PyAV."""
    import hashlib

    frames, samples = [], 0
    for packet in container.demux():
        for f in packet.decode():
            if isinstance(f, av.VideoFrame):
                frames.append(hashlib.sha256(f.to_ndarray(format="rgb24").tobytes()).hexdigest())
            else:
                samples += f.samples
    return frames, samples


def test_clips_opened_without_probing_decode_to_the_same_frames_and_samples(recorded, tmp_path):
    """``open_clip`` skips FFmpeg's probing decode (the MP4 header already says what the streams are): on
    every recorder kind's clips (B-frames, open GOPs, each audio codec) the decoders built from the header
    give every frame and sample that a fully probed open gives; bytes that are not MP4 are refused."""
    from dsbuild.formats.probe import open_clip

    _, _, _, samples = recorded
    for kind, clips in samples.items():
        for s in clips:
            with av.open(io.BytesIO(s["mp4"])) as probed, open_clip(s["mp4"]) as fast:
                expected = _decoded(probed)
                assert expected[0] and _decoded(fast) == expected, kind
    mkv = tmp_path / "clip.mkv"
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=1", "-c:v", "libx264", str(mkv))
    with pytest.raises(av.error.FFmpegError):
        open_clip(mkv.read_bytes())


def test_a_frame_stamped_like_the_one_before_is_kept_and_every_frame_decodes_as_recorded(tmp_path):
    """A recorder stamping frames by arrival on a millisecond clock gives two frames one timestamp. The
    second was dropped: a reference frame, so every later frame of its GOP decoded to other pictures, and
    validate passed. It is now moved to the next free tick (counted), and every delivered frame is the
    source's frame of the same rank."""
    from fractions import Fraction

    n, fps, twin = 90, 30, 40
    stamps = [round(i * 1000 / fps) for i in range(n)]
    stamps[twin] = stamps[twin - 1]
    d = tmp_path / "caps" / "ms-clock"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with av.open(str(d / "video.mkv"), "w") as out:
        vs = out.add_stream("libx264", rate=fps)
        vs.width, vs.height, vs.pix_fmt, vs.time_base = 64, 48, "yuv420p", Fraction(1, 1000)
        vs.codec_context.time_base = Fraction(1, 1000)  # (frame i has pts i: mapped to the clock below)
        vs.codec_context.options = {"bf": "0", "g": "30", "preset": "veryfast", "sc_threshold": "0"}
        for i in range(n + 1):
            frame = (
                None
                if i == n
                else av.VideoFrame.from_ndarray(
                    rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), format="rgb24"
                ).reformat(format="yuv420p")
            )
            if frame is not None:
                frame.pts, frame.time_base = i, Fraction(1, 1000)
            for p in vs.encode(frame):
                p.pts = p.dts = stamps[p.pts]  # the recorder's clock
                out.mux(p)
    with av.open(str(d / "video.mkv")) as c:
        source = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(source) == n
    write_streams(d, "video.mkv", "ms-clock")
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    assert session["repairs"]["video"]["restamped_duplicate_pts"] == 1
    delivered = []
    with Loader(tmp_path / "cat", decode="frames", batch_size=1, shuffle="none", num_workers=1) as loader:
        for b in loader:
            delivered += list(b["frames"][0][: int(b["lengths"][0])])
    assert len(delivered) == n and all(np.array_equal(a, b) for a, b in zip(delivered, source))


@pytest.mark.parametrize("container, args", [("ts", ()), ("mp4", ("-movflags", "frag_keyframe+empty_moov"))])
def test_a_recording_cut_inside_its_last_frame_is_trimmed_where_the_container_cannot_tell(tmp_path, container, args):
    """A capture card's TS (or OBS's fragmented MP4) killed mid-write ends inside a frame. These
    containers declare no frame count and their demuxers hand the cut frame over as a whole packet: it
    was stored, and `validate --level full` rejected the version ("decode error after 10 frames"). The
    last clip of such a container is now decode-checked and trimmed, counted as a truncation."""
    import subprocess

    d = tmp_path / "caps" / f"cut-{container}"
    d.mkdir(parents=True)
    video = d / f"video.{container}"
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=320x240:rate=30:duration={SECONDS}",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-bf",
        "0",
        "-b:v",
        "4M",
        "-pix_fmt",
        "yuv420p",
        *args,
        str(video),
    )
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "packet=pos,size",
            "-of",
            "json",
            str(video),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    last = json.loads(out)["packets"][-3]  # inside the third frame from the end
    video.write_bytes(video.read_bytes()[: int(last["pos"]) + int(last["size"]) // 2])
    write_streams(d, video.name, d.name)
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    repairs = session["repairs"]["video"]
    assert repairs["truncated"] and repairs["dropped_undecodable"] >= 1
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.check("decode").status == "pass", report.check("decode").offenders


def test_a_capture_card_whose_input_switched_resolution_labels_each_clip_with_its_own_size(tmp_path):
    """A TS whose picture size changes mid-recording (the card's input switched) was labelled with the
    first size throughout: validate rejected it ("decoded 320x240, metadata says 160x120") and the loader's
    resolution buckets mixed sizes. A changed in-band sequence header now has the clip's first frame
    decoded to learn its size, counted (`resolution_changes`)."""
    from tests.helpers import index_rows

    a, b = tmp_path / "a.ts", tmp_path / "b.ts"
    for out, size, offset in ((a, "160x120", "0"), (b, "320x240", str(SECONDS))):
        ffmpeg(
            "-f",
            "lavfi",
            "-i",
            f"testsrc2=size={size}:rate=30:duration={SECONDS}",
            "-c:v",
            "libx264",
            "-g",
            "15",
            "-bf",
            "0",
            "-pix_fmt",
            "yuv420p",
            "-output_ts_offset",
            offset,
            str(out),
        )  # (one clock: no B-frame delay)
    r, session = _convert_capture(tmp_path, "switched", a.read_bytes() + b.read_bytes())
    assert session["repairs"]["video"]["resolution_changes"] == 1
    sizes = [
        (row["width"], row["height"])
        for row in sorted(index_rows(tmp_path / "cat", r.version_id), key=lambda row: row["t_start"])
    ]
    assert sizes == [(160, 120)] * 4 + [(320, 240)] * 4  # 2 s of each in 0.5-s clips
    report = validate(
        tmp_path / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.accepted, [(c.name, c.offenders[:2]) for c in report.checks if c.failed]


def test_copied_audio_with_a_hole_inside_a_clip_is_not_carried_there_counted(tmp_path):
    """AAC copied by packet with 0.8 s missing inside a clip: MP4 closes the hole up, so everything after
    it played 0.8 s early against the video, and validate (which checks the audio's start and end)
    passed. Such a clip now carries no audio, counted as partial."""
    d = tmp_path / "caps" / "audio-hole"
    d.mkdir(parents=True)
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=30:duration=4",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:sample_rate=48000:duration=4",
        "-af",
        "aselect='not(between(t\\,0.5\\,1.3))'",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        str(d / "video.ts"),
    )
    write_streams(d, "video.ts", "audio-hole")
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    assert session["repairs"]["video"]["audio"]["partial_clips"] >= 1
    for s in _samples(tmp_path / "cat", r.version_id)["audio-hole"]:
        if s["json"]["video"]["has_audio"]:
            window = s["json"]["clip"]["t_end"] - s["json"]["clip"]["t_start"]
            assert len(decode_audio(s["mp4"], 16000)) / 16000 > window - 0.05  # whole, or none at all


def test_of_two_video_streams_the_largest_is_converted_and_the_other_counted(tmp_path):
    """A recording with a small camera stream first and the screen second: the camera was converted and
    nothing said a second video stream was left out."""
    d = tmp_path / "caps" / "two-videos"
    d.mkdir(parents=True)
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=96x64:rate=30:duration={SECONDS}",
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=160x120:rate=30:duration={SECONDS}",
        "-map",
        "0:v",
        "-map",
        "1:v",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-pix_fmt",
        "yuv420p",
        str(d / "video.mkv"),
    )
    write_streams(d, "video.mkv", "two-videos")
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=CLIP), executor=ExecutorSpec(workers=1))
    [session] = session_records(tmp_path / "cat", r.version_id)["sessions"]
    assert session["repairs"]["video"]["other_video_streams"] == 1
    assert {
        (s["json"]["video"]["width"], s["json"]["video"]["height"])
        for s in _samples(tmp_path / "cat", r.version_id)["two-videos"]
    } == {(160, 120)}


def test_sequence_headers_are_read_from_annex_b_keyframes_only():
    from dsbuild.formats.mp4 import sequence_header

    sps, pps, idr = b"\x67\x64\x00\x1f\xac", b"\x68\xee\x3c\x80", b"\x65\x88\x84\x00"
    annex_b = b"\x00\x00\x00\x01\x09\xf0" + b"\x00\x00\x00\x01" + sps + b"\x00\x00\x01" + pps + b"\x00\x00\x01" + idr
    assert sequence_header(annex_b, "h264") == sps
    assert sequence_header(annex_b.replace(sps, b"\x67\x64\x00\x28\xac"), "h264") != sps  # another size
    assert sequence_header(b"\x00\x00\x00\x05" + sps, "h264") is None  # length-prefixed (MP4, Matroska)
    assert sequence_header(b"\x00\x00\x01" + idr, "h264") is None  # a keyframe without parameter sets
    hevc_sps = bytes([33 << 1, 1]) + b"\x01\x02"
    assert sequence_header(b"\x00\x00\x01" + hevc_sps + b"\x00\x00\x01" + bytes([19 << 1, 1]), "hevc") == hevc_sps
    assert sequence_header(b"\x00\x00\x01\xb3\x14\x00\xf0\x13\x00\x00\x01\x00", "mpeg2video") == b"\x14\x00\xf0\x13"
    assert sequence_header(annex_b, "vp9") is None


def test_only_annex_b_and_mpeg2_streams_are_read_for_in_band_sequence_headers(tmp_path):
    """A length-prefixed keyframe (MP4, Matroska) whose first unit is 256-511 bytes long begins with
    00 00 01 xx and passed for Annex-B: every such keyframe cut a short clip and cost a frame decode."""
    from dsbuild.formats.mp4 import in_band_headers

    for name, expected in (("video.mp4", False), ("video.mkv", False), ("video.ts", True)):
        _x264_aac(1.0, tmp_path / name)
        with av.open(str(tmp_path / name)) as c:
            assert in_band_headers("h264", c.streams.video[0].codec_context.extradata) is expected, name
    assert in_band_headers("mpeg2video", None) and not in_band_headers("vp9", None)


@pytest.mark.parametrize(
    "ext, cover_args", [("mp4", ("-c:v:1", "png", "-disposition:v:1", "attached_pic")), ("mkv", ("-c:v:1", "png"))]
)
def test_a_cover_image_larger_than_the_video_is_not_taken_for_it(tmp_path, ext, cover_args):
    """Choosing the largest video stream took a cover image (an MP4 attached picture, or a PNG track in
    Matroska) larger than the recording: no clip, or a one-frame PNG clip."""
    cover = tmp_path / "cover.png"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=640x480:rate=1:duration=1", "-frames:v", "1", str(cover))
    screen = tmp_path / "screen.mp4"
    _x264_aac(SECONDS, screen)
    out = tmp_path / f"video.{ext}"
    ffmpeg(
        "-i",
        str(screen),
        "-i",
        str(cover),
        "-map",
        "0:v",
        "-map",
        "1:v",
        "-map",
        "0:a",
        "-c",
        "copy",
        *cover_args,
        str(out),
    )
    r, session = _convert_capture(tmp_path, "with-cover", out.read_bytes(), ext)
    assert r.samples == SECONDS / CLIP and session["repairs"]["video"]["other_video_streams"] == 0
    assert {s["json"]["video"]["codec"] for s in _samples(tmp_path / "cat", r.version_id)["with-cover"]} == {"h264"}


@pytest.mark.parametrize("ext, args", [("mkv", ()), ("mp4", ("-movflags", "frag_keyframe+empty_moov"))])
def test_a_finished_recording_in_a_container_without_a_frame_count_is_not_decoded(tmp_path, monkeypatch, ext, args):
    """The last clip of every Matroska or fragmented MP4 file was decoded to find a cut tail (16 s of
    1080p60: 0.87 s against 0.11 s as MP4): a finished one says so (its duration; the closing mfro box)."""
    decoded = []
    real = VideoSource._decodable
    monkeypatch.setattr(VideoSource, "_decodable", lambda self, p, r: decoded.append(len(p)) or real(self, p, r))
    path = tmp_path / f"video.{ext}"
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size=160x120:rate=30:duration={SECONDS}",
        "-c:v",
        "libx264",
        "-g",
        "15",
        "-pix_fmt",
        "yuv420p",
        *args,
        str(path),
    )
    with VideoSource(path) as src:
        assert len(list(src.clips(CLIP, DemuxReport()))) == SECONDS / CLIP and decoded == []
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) * 2 // 3])  # a copy cut short
    with VideoSource(path) as src:
        list(src.clips(CLIP, DemuxReport()))
    assert decoded  # its tail is proven by decoding


def test_a_finished_matroska_file_cut_short_is_a_counted_truncation(tmp_path):
    """A finished OBS recording copied short keeps its header: FFmpeg's demuxer just stopped early and
    the lost second of video was dropped uncounted (no repair; validate passed). Its Segment's declared
    end is past the file's: the truncation is reported, and the last clip decode-checked."""
    full = tmp_path / "full.mkv"
    _x264_aac(SECONDS, full)
    data = full.read_bytes()
    r, session = _convert_capture(tmp_path / "whole", "whole", data, "mkv")
    assert session["repairs"]["video"]["truncated"] is None and r.samples == SECONDS / CLIP
    r, session = _convert_capture(tmp_path / "cut", "cut", data[: len(data) * 3 // 4], "mkv")
    assert "before the end its Matroska header declares" in session["repairs"]["video"]["truncated"]
    report = validate(
        tmp_path / "cut" / "cat", r.version_id, options=ValidateOptions(level="full"), executor=ExecutorSpec(workers=1)
    )
    assert report.accepted, [c for c in report.checks if c.failed]


def test_matroska_segment_end_reads_the_declared_size_and_refuses_what_is_not_one():
    from dsbuild.formats.ebml import segment_end

    ebml = bytes.fromhex("1a45dfa3") + bytes([0x80 | 4]) + b"\x42\x86\x81\x01"  # EBML header, 4 bytes of body
    assert segment_end(ebml + bytes.fromhex("18538067") + b"\x01\x00\x00\x00\x00\x00\x03\xe8") == 9 + 12 + 1000
    assert segment_end(ebml + bytes.fromhex("18538067") + b"\x01\xff\xff\xff\xff\xff\xff\xff") is None  # unknown
    assert segment_end(ebml + bytes.fromhex("18538067") + b"\x01\x00") is None  # cut inside the size
    assert segment_end(b"\x00\x00\x00\x18ftypmp42") is None and segment_end(b"") is None

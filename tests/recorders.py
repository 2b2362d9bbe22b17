"""Capture sessions written the way real recorders write them, with the ffmpeg CLI.

Each kind is one short (2 s) small session in the capture contract's layout: ``session.json``, the video
file (moving test pattern, a tone where the recorder records audio) and small actions / telemetry / text
streams. ``RECORDERS`` maps a kind to its ffmpeg output arguments.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")
SECONDS = 2.0
GOP = 15  # keyframes every 0.5 s at 30 fps: four clips of 0.5 s per session


@dataclass(frozen=True)
class Recorder:
    file: str  # video file name (its extension picks the container unless ``args`` has -f)
    args: tuple[str, ...]  # ffmpeg output options
    audio: bool = True  # the capture has an audio track
    fps: int = 30
    size: str = "160x120"
    vfr: bool = False  # drop every 7th frame and jitter the rest: a game that stutters


def _x264(*extra: str) -> tuple[str, ...]:
    return (
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-g",
        str(GOP),
        "-keyint_min",
        str(GOP),
        "-sc_threshold",
        "0",
        *extra,
    )


RECORDERS = {
    # OBS's default: x264 with B-frames in Matroska (packets without dts), AAC.
    "obs_x264_mkv": Recorder("video.mkv", (*_x264("-bf", "3"), "-c:a", "aac")),
    # x265 defaults to open GOPs (CRA + RASL frames).
    "x265_mkv": Recorder(
        "video.mkv",
        ("-c:v", "libx265", "-preset", "ultrafast", "-g", str(GOP), "-x265-params", "log-level=error", "-c:a", "aac"),
    ),
    "x265_hvc1_mov": Recorder(
        "video.mov",
        (
            "-c:v",
            "libx265",
            "-preset",
            "ultrafast",
            "-g",
            str(GOP),
            "-x265-params",
            "log-level=error",
            "-tag:v",
            "hvc1",
            "-c:a",
            "aac",
        ),
    ),
    # Capture cards / broadcast: open-GOP H.264 in MPEG-TS, Annex-B, ADTS AAC.
    "x264_opengop_ts": Recorder("video.ts", (*_x264("-bf", "3", "-x264-params", "open-gop=1"), "-c:a", "aac")),
    "x265_ts": Recorder(
        "video.ts",
        (
            "-c:v",
            "libx265",
            "-preset",
            "ultrafast",
            "-g",
            str(GOP),
            "-x265-params",
            "log-level=error:bframes=3",
            "-c:a",
            "aac",
        ),
    ),
    "mpeg2_ts": Recorder("video.ts", ("-c:v", "mpeg2video", "-bf", "2", "-g", str(GOP), "-q:v", "4", "-c:a", "mp2")),
    "vfr_aac_mp4": Recorder(
        "video.mp4", (*_x264("-bf", "2"), "-c:a", "aac", "-fps_mode", "vfr", "-video_track_timescale", "1000"), vfr=True
    ),
    "vp9_opus_webm": Recorder(
        "video.webm",
        ("-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-g", str(GOP), "-c:a", "libopus"),
    ),
    "av1_mkv": Recorder("video.mkv", ("-c:v", "libsvtav1", "-preset", "12", "-g", str(GOP), "-c:a", "libopus")),
    "mpeg4_avi": Recorder(
        "video.avi", ("-c:v", "mpeg4", "-bf", "2", "-g", str(GOP), "-q:v", "4", "-c:a", "libmp3lame")
    ),
    "mjpeg_pcm_avi": Recorder("video.avi", ("-c:v", "mjpeg", "-q:v", "4", "-c:a", "pcm_s16le")),
    "x264_flv": Recorder("video.flv", (*_x264("-bf", "2"), "-c:a", "aac")),
    "pcm_mov": Recorder("video.mov", (*_x264(), "-c:a", "pcm_s16le")),
    "pcm24_mkv": Recorder("video.mkv", (*_x264(), "-c:a", "pcm_s24le")),
    "vorbis_mkv": Recorder("video.mkv", (*_x264(), "-c:a", "libvorbis")),
    "silent_x264_mp4": Recorder("video.mp4", _x264("-bf", "2"), audio=False),
}


def record(root: Path, kind: str, session_id: str | None = None) -> Path:
    """Write capture session ``kind`` under ``root``; returns its folder."""
    rec = RECORDERS[kind]
    d = root / (session_id or kind.replace("_", "-"))
    d.mkdir(parents=True)
    inputs = ["-f", "lavfi", "-i", f"testsrc2=size={rec.size}:rate={rec.fps}:duration={SECONDS}"]
    if rec.audio:
        inputs += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={SECONDS}"]
    vf = ["-vf", "select='not(eq(mod(n\\,7)\\,3))',setpts='PTS+0.004*sin(N)/TB'"] if rec.vfr else []
    ffmpeg(*inputs, *vf, *rec.args, "-pix_fmt", "yuvj420p" if "mjpeg" in rec.args else "yuv420p", str(d / rec.file))
    write_streams(d, rec.file, session_id or kind.replace("_", "-"))
    return d


def write_streams(d: Path, video: str, session_id: str) -> None:
    """session.json and small JSONL streams (text without a speaker: the contract makes it optional)."""
    actions = [{"t": round(i * 0.1, 3), "control": "jump", "value": float(i % 2)} for i in range(int(SECONDS * 10))]
    telemetry = [{"t": round(i * 0.05, 3), "speed": float(i)} for i in range(int(SECONDS * 20))]
    text = [{"t": 0.25, "text": "go"}, {"t": 1.3, "speaker": "coach", "text": "nice"}]
    for name, rows in (("actions", actions), ("telemetry", telemetry), ("text", text)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = {
        "format": "capture/1",
        "session_id": session_id,
        "title": "Recorder Test",
        "player": "p1",
        "video": video,
        "streams": {k: f"{k}.jsonl" for k in ("actions", "telemetry", "text")},
    }
    (d / "session.json").write_text(json.dumps(doc, indent=2))


def ffmpeg(*args: str) -> None:
    """Run the ffmpeg CLI; the calling test skips (with the reason) where it is not installed."""
    if FFMPEG is None or FFPROBE is None:
        pytest.skip("the ffmpeg CLI is not installed (make ffmpeg, or apt-get install ffmpeg)")
    subprocess.run([FFMPEG, "-v", "error", "-nostdin", "-y", *args], check=True, capture_output=True, timeout=120)


def ffprobe_frames(path: Path) -> tuple[int, str]:
    """(frames ffprobe decodes from the first video stream, its codec tag), via ``-count_frames``."""
    out = subprocess.run(
        [
            FFPROBE,
            "-v",
            "error",
            "-count_frames",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=nb_read_frames,codec_tag_string",
            "-of",
            "json",
            str(path),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    s = json.loads(out.stdout)["streams"][0]
    return int(s["nb_read_frames"]), s["codec_tag_string"]

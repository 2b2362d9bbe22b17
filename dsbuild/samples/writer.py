"""Writing a capture session in the contract's layout. Shared by every sample source.

Encoding is single-threaded with a fixed GOP and no scene-cut keyframes so that the same frames always
give the same bytes on any machine (x264 output depends on its thread count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable

import numpy as np

# codec -> (PyAV encoder, container format, file extension, encoder options)
CODECS = {
    "h264": ("libx264", "mp4", "mp4", {"preset": "ultrafast", "tune": "zerolatency", "sc_threshold": "0"}),
    "vp9": ("libvpx-vp9", "webm", "webm", {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}),
    "av1": ("libsvtav1", "matroska", "mkv", {"preset": "12"}),
    "hevc": ("libx265", "mov", "mov", {"preset": "ultrafast", "x265-params": "log-level=error:pools=1:frame-threads=1"}),
}


@dataclass
class VideoSpec:
    width: int
    height: int
    fps: int
    gop: int  # frames between keyframes
    codec: str = "h264"
    vfr_jitter: float = 0.0  # >0: presentation times jitter by up to this fraction of a frame (VFR)
    bitrate: int | None = None  # bits/s; None = encoder default quality


def encode_video(path: Path, frames: Iterable[np.ndarray], spec: VideoSpec, seed: int = 0) -> int:
    """Encode RGB uint8 frames (H, W, 3); returns the number of frames written."""
    import av

    encoder, fmt, _ext, opts = CODECS[spec.codec]
    options = {"movflags": "+faststart"} if fmt in ("mp4", "mov") else {}
    n = 0
    rng = np.random.default_rng(seed)
    with av.open(str(path), "w", format=fmt, options={**options, "fflags": "+bitexact"}) as c:
        rate = Fraction(spec.fps)
        s = c.add_stream(encoder, rate=rate)
        s.width, s.height, s.pix_fmt = spec.width, spec.height, "yuv420p"
        s.thread_count = 1
        s.options = {**opts, "g": str(spec.gop), "keyint_min": str(spec.gop)} if spec.codec == "h264" else {
            **opts, "g": str(spec.gop)}
        if spec.bitrate:
            s.bit_rate = spec.bitrate
        if spec.vfr_jitter:
            s.time_base = Fraction(1, 1000)
        for i, arr in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            if spec.vfr_jitter:
                jitter = rng.uniform(-spec.vfr_jitter, spec.vfr_jitter) * 1000 / spec.fps
                frame.pts = int(round(i * 1000 / spec.fps + jitter)) if i else 0
                frame.time_base = Fraction(1, 1000)
            else:
                frame.pts = i
            for packet in s.encode(frame):
                c.mux(packet)
            n += 1
        for packet in s.encode():
            c.mux(packet)
    return n


def write_jsonl(path: Path, events: Iterable[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n")


@dataclass
class SessionSpec:
    session_id: str
    title: str
    player: str
    video: VideoSpec
    platform: str = "pc"
    build: str = "1.0.0"
    started_at: str = "2026-11-01T10:00:00Z"
    conditions: dict[str, str] = field(default_factory=dict)

    def document(self, video_name: str) -> dict:
        return {
            "format": "capture/1", "session_id": self.session_id, "title": self.title,
            "platform": self.platform, "build": self.build, "player": self.player,
            "started_at": self.started_at, "conditions": dict(self.conditions), "video": video_name,
            "streams": {"actions": "actions.jsonl", "telemetry": "telemetry.jsonl", "text": "text.jsonl"},
        }


def write_session(directory: Path, spec: SessionSpec, frames: Iterable[np.ndarray], actions: list[dict],
                  telemetry: list[dict], text: list[dict], seed: int = 0) -> Path:
    """Write one complete session folder; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    video_name = f"video.{CODECS[spec.video.codec][2]}"
    encode_video(directory / video_name, frames, spec.video, seed=seed)
    write_jsonl(directory / "actions.jsonl", actions)
    write_jsonl(directory / "telemetry.jsonl", telemetry)
    write_jsonl(directory / "text.jsonl", text)
    (directory / "session.json").write_text(json.dumps(spec.document(video_name), indent=2, sort_keys=True) + "\n")
    return directory

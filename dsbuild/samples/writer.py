"""Writing a capture session in the contract's layout. Shared by every sample source.

Encoding is single-threaded with a fixed GOP and no scene-cut keyframes so that the same frames always
give the same bytes on any machine (x264 output depends on its thread count). Audio, when a source has
it, is FLAC with fixed predictors in the same file: integer-only, so also the same bytes on any machine
(FFmpeg's AAC and Opus encoders compute in floating point, whose SIMD paths differ between CPUs). QuickTime
captures get PCM, as capture cards write it. WebM admits only Opus or Vorbis: WebM captures get Opus, the
same bytes run to run on one machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from dsbuild.core.errors import UsageError

# codec -> (PyAV encoder, container format, file extension, encoder options)
# Audio encoder per container format, and its options.
# FLAC blocks of 1024 samples (21 ms at 48 kHz, like AAC frames): clips copy whole packets, so the packet
# length bounds how far a clip's audio can start after its first frame.
AUDIO_CODECS = {
    "webm": ("libopus", {}),
    "mov": ("pcm_s16le", {}),
    None: ("flac", {"lpc_type": "fixed", "frame_size": "1024"}),
}
CODECS = {
    "h264": ("libx264", "mp4", "mp4", {"preset": "ultrafast", "tune": "zerolatency", "sc_threshold": "0"}),
    "vp9": ("libvpx-vp9", "webm", "webm", {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}),
    "av1": ("libsvtav1", "matroska", "mkv", {"preset": "12"}),
    "hevc": (
        "libx265",
        "mov",
        "mov",
        {"preset": "ultrafast", "x265-params": "log-level=error:pools=1:frame-threads=1"},
    ),
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


@dataclass(frozen=True)
class AudioSource:
    """Sound recorded with the frames. ``take()`` returns the int16 [samples, channels] produced since its
    last call: the writer calls it after every frame, since an emulator makes a frame's sound while
    stepping past it. Sample 0 plays with frame 0."""

    rate: int
    channels: int
    take: Callable[[], np.ndarray]

    @classmethod
    def of(cls, samples: np.ndarray, rate: int) -> AudioSource:
        """Sound known in full beforehand (int16 [samples, channels])."""
        left = [samples]
        return cls(rate, samples.shape[1], lambda: left.pop() if left else samples[:0])


class _AudioTrack:
    """An audio stream of the capture, fed in any chunk sizes and encoded in whole codec frames."""

    def __init__(self, container, fmt: str, source: AudioSource):
        import av

        codec, options = AUDIO_CODECS.get(fmt, AUDIO_CODECS[None])
        self.container, self.source = container, source
        self.layout = {1: "mono", 2: "stereo"}[source.channels]
        s = self.stream = container.add_stream(codec, rate=source.rate)
        s.layout, s.format = self.layout, "s16"
        s.codec_context.thread_count = 1
        s.codec_context.flags |= av.codec.context.Flags.bitexact
        s.options = dict(options)
        s.codec_context.open()
        self.block = s.codec_context.frame_size or 1024  # PCM takes any size
        self.pending = np.zeros((0, source.channels), np.int16)
        self.pts = 0

    def pull(self, final: bool = False) -> None:
        import av

        self.pending = np.concatenate([self.pending, self.source.take().astype(np.int16)])
        while len(self.pending) >= self.block or (final and len(self.pending)):
            chunk, self.pending = self.pending[: self.block], self.pending[self.block :]
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(chunk).reshape(1, -1), format="s16", layout=self.layout
            )
            frame.rate, frame.pts = self.source.rate, self.pts
            self.pts += len(chunk)
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        if final:
            for packet in self.stream.encode():
                self.container.mux(packet)


def encode_video(
    path: Path, frames: Iterable[np.ndarray], spec: VideoSpec, seed: int = 0, audio: AudioSource | None = None
) -> int:
    """Encode RGB uint8 frames (H, W, 3) and their ``audio``; returns the number of frames written."""
    import av

    encoder, fmt, _ext, opts = CODECS[spec.codec]
    options = {"movflags": "+faststart"} if fmt in ("mp4", "mov") else {}
    n = 0
    rng = np.random.default_rng(seed)
    with av.open(str(path), "w", format=fmt, options={**options, "fflags": "+bitexact"}) as c:
        rate = Fraction(spec.fps)
        s = c.add_stream(encoder, rate=rate)
        if not isinstance(s, av.VideoStream):  # (CODECS names video encoders only)
            raise UsageError(f"codec {spec.codec!r}: {encoder} is not a video encoder")
        s.width, s.height, s.pix_fmt = spec.width, spec.height, "yuv420p"
        s.thread_count = 1
        s.options = (
            {**opts, "g": str(spec.gop), "keyint_min": str(spec.gop)}
            if spec.codec == "h264"
            else {**opts, "g": str(spec.gop)}
        )
        if spec.bitrate:
            s.bit_rate = spec.bitrate
        if spec.vfr_jitter:
            s.time_base = Fraction(1, 1000)
        sound = _AudioTrack(c, fmt, audio) if audio is not None else None
        for i, arr in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            if spec.vfr_jitter:
                jitter = rng.uniform(-spec.vfr_jitter, spec.vfr_jitter) * 1000 / spec.fps
                frame.pts = round(i * 1000 / spec.fps + jitter) if i else 0
                frame.time_base = Fraction(1, 1000)
            else:
                frame.pts = i
            for packet in s.encode(frame):
                c.mux(packet)
            n += 1
            if sound is not None:
                sound.pull()
        for packet in s.encode():
            c.mux(packet)
        if sound is not None:
            sound.pull(final=True)
    return n


SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the capture contract's session ids


def check_session_id(what: str, session_id: str) -> str:
    """``session_id`` (a recorded source's ``what``, e.g. ``game 'pong'``, made it), if the contract takes it."""
    if not SESSION_ID.fullmatch(session_id):
        raise UsageError(f"{what} gives session id {session_id!r}, outside [A-Za-z0-9_-]{{1,64}}")
    return session_id


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
    controls: dict[str, dict] = field(default_factory=dict)  # declared continuous controls (robots); none: left out

    def document(self, video_name: str) -> dict:
        doc = {
            "format": "capture/1",
            "session_id": self.session_id,
            "title": self.title,
            "platform": self.platform,
            "build": self.build,
            "player": self.player,
            "started_at": self.started_at,
            "conditions": dict(self.conditions),
            "video": video_name,
            "streams": {"actions": "actions.jsonl", "telemetry": "telemetry.jsonl", "text": "text.jsonl"},
        }
        if self.controls:
            doc["controls"] = {name: dict(c) for name, c in self.controls.items()}
        return doc


def write_session(
    directory: Path,
    spec: SessionSpec,
    frames: Iterable[np.ndarray],
    actions: list[dict],
    telemetry: list[dict],
    text: list[dict],
    seed: int = 0,
    audio: AudioSource | None = None,
) -> Path:
    """Write one complete session folder (which must not exist yet); returns it. It is written beside its
    place under a dotted name and renamed into place whole: an interrupted run leaves no half-written
    session (a folder with a video and no ``session.json``, which no converter counts)."""
    partial = directory.with_name(f".{directory.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        video_name = f"video.{CODECS[spec.video.codec][2]}"
        encode_video(partial / video_name, frames, spec.video, seed=seed, audio=audio)
        write_jsonl(partial / "actions.jsonl", actions)
        write_jsonl(partial / "telemetry.jsonl", telemetry)
        write_jsonl(partial / "text.jsonl", text)
        (partial / "session.json").write_text(json.dumps(spec.document(video_name), indent=2, sort_keys=True) + "\n")
        os.rename(partial, directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return directory

"""Video through PyAV: keyframe-aligned clips remuxed without re-encoding, and decoding for checks.

Clips are cut while demuxing, so memory holds one clip's packets, never a whole session. A clip starts
at a keyframe and ends at the first keyframe at least ``clip_seconds`` later (``should_cut``); when the
keyframe interval is longer than that, the clip is longer (never re-encoded) and counted as long.
Time comes from packet timestamps, so variable frame rate needs no special case.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import numpy as np

from dsbuild.core.errors import FormatError

MAX_PIXELS = 8192 * 8192  # a declared resolution beyond this is hostile or broken, not a game capture
CUT_EPS = 1e-3  # seconds; keyframe times are rationals, compare with a tolerance below one frame
# Output container per codec: mp4 where players and loaders expect it, WebM for VP8/9, Matroska otherwise.
_CONTAINERS = {"h264": ("mp4", "mp4"), "hevc": ("mp4", "mp4"), "av1": ("mp4", "mp4"),
               "mpeg4": ("mp4", "mp4"), "vp8": ("webm", "webm"), "vp9": ("webm", "webm")}


def seconds(ticks: int, time_base: Fraction) -> float:
    """ticks * time_base as the correctly rounded float (so frame i at 60 fps is exactly i / 60)."""
    return ticks * time_base.numerator / time_base.denominator


def should_cut(clip_start: float, keyframe_t: float, clip_seconds: float) -> bool:
    """Cut before this keyframe when the open clip already spans ``clip_seconds``."""
    return keyframe_t - clip_start >= clip_seconds - CUT_EPS


def frame_rate(frame_t: np.ndarray) -> float | None:
    """Mean frame rate of sorted frame times: (frames - 1) / (last - first). The one definition convert
    and validate share, exact for constant rates and the true average for variable ones."""
    if len(frame_t) < 2 or frame_t[-1] <= frame_t[0]:
        return None
    return (len(frame_t) - 1) / float(frame_t[-1] - frame_t[0])


@dataclass(frozen=True)
class PacketRecord:
    """A demuxed packet detached from its container, so a clip can be remuxed more than once."""

    data: bytes
    pts: int
    dts: int | None
    duration: int
    keyframe: bool


@dataclass(frozen=True)
class VideoInfo:
    codec: str
    width: int
    height: int
    fps: float | None
    time_base: Fraction
    has_audio: bool
    container_format: str  # muxer used for clips
    ext: str  # member extension of clips

    def to_json(self) -> dict:
        return {"codec": self.codec, "width": self.width, "height": self.height, "fps": self.fps,
                "has_audio": self.has_audio, "container": self.ext}


@dataclass
class Clip:
    index: int
    packets: list[PacketRecord]
    frame_t: np.ndarray  # presentation times in seconds from the session's first frame, sorted
    t_start: float
    t_end: float
    final: bool = False


@dataclass
class DemuxReport:
    """Frames we could not carry, by reason (all counted, none silent)."""

    packets: int = 0
    dropped_before_keyframe: int = 0
    dropped_leading: int = 0  # open-GOP frames shown before their clip's keyframe
    dropped_no_pts: int = 0
    dropped_undecodable: int = 0
    truncated: str | None = None  # set when the file ended early: the final clip is then decode-checked
    long_clips: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "packets": self.packets,
            "dropped_before_keyframe": self.dropped_before_keyframe,
            "dropped_leading": self.dropped_leading,
            "dropped_no_pts": self.dropped_no_pts,
            "dropped_undecodable": self.dropped_undecodable,
            "truncated": self.truncated,
            "long_clips": self.long_clips,
        }


class VideoReader:
    """Demuxes one video file into keyframe-aligned clips. Use as a context manager."""

    def __init__(self, path: Path):
        self.path = path
        self._container = None
        self._stream = None
        self.info: VideoInfo | None = None

    def __enter__(self) -> "VideoReader":
        import av

        try:
            self._container = av.open(str(self.path), metadata_errors="ignore")
        except (av.error.FFmpegError, OSError, ValueError) as e:
            raise FormatError(f"not a readable video ({_why(e)})") from None
        if not self._container.streams.video:
            self._container.close()
            raise FormatError("no video stream")
        vs = self._stream = self._container.streams.video[0]
        cc = vs.codec_context
        if cc.width <= 0 or cc.height <= 0 or cc.width * cc.height > MAX_PIXELS:
            self._container.close()
            raise FormatError(f"declared resolution {cc.width}x{cc.height} is outside 1..{MAX_PIXELS} pixels")
        codec = cc.codec.canonical_name  # "av1", not the decoder name "libdav1d"
        fmt, ext = _CONTAINERS.get(codec, ("matroska", "mkv"))
        rate = vs.average_rate or vs.guessed_rate
        self.info = VideoInfo(
            codec=codec, width=cc.width, height=cc.height,
            fps=round(float(rate), 6) if rate else None, time_base=vs.time_base,
            has_audio=bool(self._container.streams.audio), container_format=fmt, ext=ext,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self._container is not None:
            self._container.close()

    def _packets(self, report: DemuxReport) -> Iterator[PacketRecord]:
        import av

        size = self.path.stat().st_size
        try:
            for p in self._container.demux(self._stream):
                if p.size == 0:
                    continue
                if p.pos is not None and p.pos >= 0 and p.pos + p.size > size:
                    report.truncated = f"packet {report.packets} extends past the end of the file"
                    return
                report.packets += 1
                if p.pts is None:
                    report.dropped_no_pts += 1
                    continue
                yield PacketRecord(bytes(p), p.pts, p.dts, p.duration or 0, p.is_keyframe)
        except (av.error.FFmpegError, OSError) as e:
            report.truncated = f"demux stopped after {report.packets} packets: {_why(e)}"
            return
        declared = self._stream.frames
        if declared and report.packets < declared:
            report.truncated = f"container declares {declared} frames, {report.packets} were readable"

    def clips(self, clip_seconds: float, report: DemuxReport) -> Iterator[Clip]:
        """Keyframe-aligned clips in order; the last one is marked ``final``."""
        tb = self.info.time_base
        t0: int | None = None
        current: list[PacketRecord] = []
        start = 0.0
        index = 0
        for p in self._packets(report):
            if t0 is None:
                if not p.keyframe:
                    report.dropped_before_keyframe += 1
                    continue
                t0 = p.pts if self._stream.start_time is None else min(p.pts, self._stream.start_time)
            t = seconds(p.pts - t0, tb)
            if p.keyframe and current and should_cut(start, t, clip_seconds):
                yield self._clip(index, current, start, t, clip_seconds, t0, report)
                index += 1
                current = []
            if not current:
                start = t
            elif t < start:
                report.dropped_leading += 1
                continue
            current.append(p)
        if current:
            last = max(p.pts for p in current)
            dur = next((p.duration for p in current if p.pts == last), 0) or (
                round(1 / self.info.fps / float(tb)) if self.info.fps else 0)
            clip = self._clip(index, current, start, seconds(last - t0 + dur, tb), clip_seconds, t0, report)
            clip.final = True
            yield clip

    def _clip(self, index, packets, start, end, clip_seconds, t0, report) -> Clip:
        tb = self.info.time_base
        frame_t = np.sort(np.array([seconds(p.pts - t0, tb) for p in packets], dtype=np.float64))
        if end - start > 1.5 * clip_seconds:
            report.long_clips += 1
        return Clip(index, packets, frame_t, float(start), float(end))

    def remux(self, packets: list[PacketRecord]) -> bytes:
        """The packets as a standalone file in ``info.container_format``; timestamps start near 0.

        ``+bitexact`` keeps library version strings out of the bytes (determinism across machines).
        """
        import av

        buf = io.BytesIO()
        out = av.open(buf, "w", format=self.info.container_format, options={"fflags": "+bitexact"})
        try:
            ostream = out.add_stream_from_template(self._stream, opaque=True)
            base = min(p.dts if p.dts is not None else p.pts for p in packets)
            for rec in packets:
                pkt = av.Packet(rec.data)
                pkt.pts = rec.pts - base
                pkt.dts = (rec.dts if rec.dts is not None else rec.pts) - base
                pkt.duration = rec.duration
                pkt.time_base = self.info.time_base
                pkt.is_keyframe = rec.keyframe
                pkt.stream = ostream
                out.mux(pkt)
        finally:
            out.close()
        return buf.getvalue()


def decoded_frame_count(data: bytes) -> int:
    """How many frames PyAV decodes from an encoded clip before the first error."""
    import av

    n = 0
    try:
        with av.open(io.BytesIO(data)) as c:
            c.streams.video[0].thread_type = "AUTO"
            for _ in c.decode(video=0):
                n += 1
    except (av.error.FFmpegError, OSError, IndexError):
        pass
    return n


def _why(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return msg.strip().splitlines()[0][:200] if msg else type(e).__name__

"""A capture's video (and audio) as keyframe-aligned MP4 clips: ``VideoSource``.

Clips are cut while demuxing, so memory holds about two clips' packets, never a whole session. A clip
starts at a keyframe and ends at the first keyframe at least ``clip_seconds`` later (``should_cut``);
when the keyframe interval is longer than that, the clip is longer (never re-encoded) and counted as long.
Time comes from packet timestamps, so variable frame rate needs no special case.

Open GOPs (x265's default, x264 ``open-gop``, MPEG-2, MPEG-4 Part 2): frames that follow a cut keyframe
in decode order but are shown before it reference the previous GOP, so they cannot decode in the new
clip. They are dropped and counted (``dropped_leading``), and the previous clip's window ends where they
would have started: a window always ends where its last frame ends, so every modality cut to the window
matches the video, and the duration check keeps its one-frame tolerance. Where the video stops for more
than ``GAP_SECONDS`` before the next frame (a capture card that lost its signal, a paused recording: the
timestamps jump forward), the window ends where its last frame ends too, counted (``gaps``), rather than
stretch over time that holds no video.

A file trimmed without re-encoding (an MP4 edit list) keeps packets it hides from players, flagged
discard: they are dropped and counted (``dropped_edit_list``), and the session's clock starts at the first
frame a player shows, as every other stream of the capture was logged against.

Every clip is MP4 (member extension ``mp4``): see ``formats.mp4`` for what the remux repairs and
``formats.audio`` for how audio is cut. A codec MP4 cannot hold (ProRes, VP8, ...) is a FormatError at
open unless a ``transcode`` spec re-encodes the video (``formats.transcode``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.core.files import UnsafeFile, open_regular
from dsbuild.formats.audio import AudioInfo, AudioReport, AudioSpan, AudioTrack, covers, open_audio
from dsbuild.formats.ebml import HEAD_BYTES, segment_end
from dsbuild.formats.mp4 import (
    Mp4Writer,
    PacketRecord,
    check_mp4_video,
    demux_only,
    in_band_headers,
    monotonic_dts,
    mp4_tag,
    sequence_header,
    why,
)
from dsbuild.formats.sample import GAP_SECONDS, VIDEO_EXT
from dsbuild.formats.transcode import ClipEncoder, TranscodeSpec, parse_transcode

MAX_PIXELS = 8192 * 8192  # a declared resolution beyond this is hostile or broken, not a game capture
CUT_EPS = 1e-3  # seconds; keyframe times are rationals, compare with a tolerance below one frame
CONTAINER = "mp4"
TRIM_TRIES = 3  # decode-and-trim rounds for the final clip of a truncated file
FINISHED_SLACK = 0.5  # seconds: a finished Matroska file's video ends at most this before its duration


T = TypeVar("T")


def _opened(value: T | None, path: Path) -> T:
    """A part of an open ``VideoSource``; reading one before ``with`` opened it is a bug, said plainly."""
    if value is None:
        raise FormatError(f"{path.name}: read before it was opened (use `with VideoSource(path) as source`)")
    return value


def seconds(ticks: int, time_base: Fraction) -> float:
    """ticks * time_base as the correctly rounded float (so frame i at 60 fps is exactly i / 60)."""
    return ticks * time_base.numerator / time_base.denominator


def should_cut(clip_start: float, keyframe_t: float, clip_seconds: float) -> bool:
    """Cut before this keyframe when the open clip already spans ``clip_seconds``."""
    return keyframe_t - clip_start >= clip_seconds - CUT_EPS


PICTURE_CODECS = frozenset({"png", "bmp", "tiff", "webp", "gif"})  # still images (a cover), not captures

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.frame import VideoFrame
    from av.video.stream import VideoStream


def _moving(container) -> list[VideoStream]:
    """The video streams that are video: a cover image (an ``attached_pic`` stream, or a still-image
    codec's track) is not, however large; all of them when every one is a picture."""
    from av.stream import Disposition

    moving = [
        s
        for s in container.streams.video
        if not s.disposition & Disposition.attached_pic
        and (s.codec_context is None or s.codec_context.name not in PICTURE_CODECS)
    ]
    return moving or list(container.streams.video)


def _pixels(stream) -> int:
    cc = stream.codec_context
    return 0 if cc is None else max(0, cc.width) * max(0, cc.height)


@dataclass(frozen=True)
class VideoInfo:
    """What the clips of a session hold (the transcoded stream when a spec is given)."""

    codec: str
    codec_tag: str | None
    width: int
    height: int
    fps: float | None  # nominal: the container's average rate (the spec's when transcoding to a rate)
    time_base: Fraction  # of the clips' video timestamps
    audio: AudioInfo | None
    source: str  # "<codec> in <container>" of the capture file, for messages
    container: str = CONTAINER
    ext: str = VIDEO_EXT


@dataclass(frozen=True)
class Clip:
    index: int
    data: bytes  # a standalone MP4
    frame_t: np.ndarray  # float64 seconds from the session's first frame, sorted, one per frame in ``data``
    t_start: float  # the source window [t_start, t_end) the clip covers
    t_end: float
    audio: AudioSpan | None
    width: int  # its picture size: the stream's, or what it changed to (``VideoSource._picture_size``)
    height: int


@dataclass
class DemuxReport:
    """Frames and audio we could not carry, by reason (all counted, none silent)."""

    packets: int = 0
    dropped_before_keyframe: int = 0
    dropped_leading: int = 0  # open-GOP frames shown before their clip's keyframe
    dropped_no_pts: int = 0
    restamped_duplicate_pts: int = 0  # a frame stamped like the one before: moved to the next free tick
    dropped_undecodable: int = 0
    dropped_after_restart: int = 0  # packets after a keyframe went back in time (a recorder that restarted)
    dropped_edit_list: int = 0  # packets an edit list hides (a file trimmed without re-encoding)
    other_video_streams: int = 0  # video streams besides the one converted (a camera beside the screen)
    resolution_changes: int = 0  # clips whose picture size is not the one before (a capture card's input switched)
    gaps: int = 0  # windows ended at their last frame: the next came more than GAP_SECONDS later
    truncated: str | None = None  # set when the file ended early: the final clip is then decode-checked
    long_clips: int = 0
    keyframe_gap: tuple[float, int] | None = None  # the widest (seconds, frames) between keyframes of a long clip
    audio: AudioReport = field(default_factory=AudioReport)

    @property
    def audio_not_carried(self) -> bool:
        """The capture has audio and no clip carries any (``audio=False``, or it was unusable)."""
        return self.audio.tracks > 0 and self.audio.clips_with_audio == 0

    def to_json(self) -> dict:
        return {
            "packets": self.packets,
            "dropped_before_keyframe": self.dropped_before_keyframe,
            "dropped_leading": self.dropped_leading,
            "dropped_no_pts": self.dropped_no_pts,
            "restamped_duplicate_pts": self.restamped_duplicate_pts,
            "dropped_undecodable": self.dropped_undecodable,
            "dropped_after_restart": self.dropped_after_restart,
            "dropped_edit_list": self.dropped_edit_list,
            "other_video_streams": self.other_video_streams,
            "resolution_changes": self.resolution_changes,
            "gaps": self.gaps,
            "truncated": self.truncated,
            "long_clips": self.long_clips,
            "audio": self.audio.to_json(),
        } | (  # (only with long clips: the records of every other session keep their bytes)
            {"keyframe_gap_seconds": self.keyframe_gap[0], "keyframe_gap_frames": self.keyframe_gap[1]}
            if self.keyframe_gap
            else {}
        )


@dataclass
class _Segment:
    """Packets from one cut keyframe to the next, in decode order (leading frames already dropped)."""

    packets: list[PacketRecord]
    key_pts: int
    first_leading_pts: int | None = None  # earliest dropped leading frame: where the previous window ends
    seen: set[int] = field(default_factory=set)  # pts in the segment (a repeated pts cannot be muxed)
    header: bytes | None = None  # its keyframe's in-band sequence header (``formats.mp4.sequence_header``)


class VideoSource:
    """One capture file as MP4 clips. ``with VideoSource(path) as src: for clip in src.clips(8.0, report)``.

    ``audio=False`` drops the audio; ``transcode`` (a spec string or TranscodeSpec) re-encodes the video.
    Raises FormatError (one line: codec, container, what failed) when the video cannot be read or stored.
    """

    def __init__(self, path: Path | str, audio: bool = True, transcode: TranscodeSpec | str | None = None):
        self.path = Path(path)
        self.spec = parse_transcode(transcode) if isinstance(transcode, str) else transcode
        self._want_audio = audio
        self._input: InputContainer | None = None  # these three are set on entry (``_open``)
        self._video: VideoStream | None = None
        self._info: VideoInfo | None = None
        self._audio: AudioTrack | None = None
        self._tag: str | None = None
        self._audio_report = AudioReport()
        self._t0: int | None = None  # pts of the first video frame: the session clock's zero
        self._size = 0  # bytes, when opened
        self._ends_with_mfro = False
        self._declared_end: int | None = None
        self._header: bytes | None = None  # the in-band sequence header of the clips so far
        self._in_band = False  # whether keyframes carry sequence headers to compare (``_open``)
        self._picture: tuple[int, int] = (0, 0)  # their picture size

    @property
    def info(self) -> VideoInfo:
        """What the video is (and what its clips will be): known once the source is open."""
        return _opened(self._info, self.path)

    @property
    def _container(self) -> InputContainer:
        return _opened(self._input, self.path)

    @property
    def _stream(self) -> VideoStream:
        return _opened(self._video, self.path)

    def __enter__(self) -> VideoSource:
        import av

        try:
            # Only a regular file: FFmpeg's open of a FIFO in its place would block forever, a device
            # would never end (UnsafeFile names which; the session is quarantined with it)
            with open_regular(self.path) as f:
                self._size = os.fstat(f.fileno()).st_size
                self._declared_end = segment_end(f.read(HEAD_BYTES))  # (Matroska's; None for other containers)
                f.seek(max(0, self._size - 16))
                self._ends_with_mfro = f.read(16)[4:8] == b"mfro"  # a fragmented MP4 that was finished
            self._input = av.open(str(self.path), metadata_errors="ignore")
        except UnsafeFile as e:  # the reason without the host path: it lands in the manifest
            raise FormatError(str(e).removeprefix(f"{self.path}: ")) from None
        except (av.error.FFmpegError, OSError, ValueError) as e:
            raise FormatError(f"not a readable video ({why(e)})") from None
        try:
            self._open()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._audio is not None:
            self._audio.close()
        if self._input is not None:
            self._input.close()

    def _open(self) -> None:
        c = self._container
        fmt = c.format.name.split(",")[0]
        if not c.streams.video:
            raise FormatError(f"no video stream in the {fmt} file")
        vs = self._video = max(_moving(c), key=_pixels)  # the largest, as ffmpeg picks (first of equals)
        if vs.time_base is None:
            raise FormatError(f"the video stream of the {fmt} file has no time base")
        self._tb: Fraction = vs.time_base  # (PyAV builds a new Fraction on every read of it: asked per packet)
        demux_only(c, vs)  # the audio has a demuxer of its own (open_audio)
        cc = vs.codec_context
        if cc is None:
            raise FormatError(f"FFmpeg has no decoder for the video stream of the {fmt} file")
        if cc.width <= 0 or cc.height <= 0 or cc.width * cc.height > MAX_PIXELS:
            raise FormatError(f"declared resolution {cc.width}x{cc.height} is outside 1..{MAX_PIXELS} pixels")
        codec = cc.codec.canonical_name  # "av1", not the decoder name "libdav1d"
        rate = vs.average_rate or vs.guessed_rate
        fps = round(float(rate), 6) if rate else None
        if self.spec is None:
            self._tag = mp4_tag(codec, vs.codec_tag)
            check_mp4_video(vs, codec, fmt, self._tag)
            out: dict[str, Any] = dict(codec=codec, codec_tag=self._tag, width=cc.width, height=cc.height, fps=fps)
        else:
            s = self.spec
            # Slice threads, not frame threads: a frame thread can still hold one of our packets (freed under
            # the GIL) when the decoder is freed, which then waits for it forever; and frame threads lost the
            # flag of a concealed frame in some processes (probe.py). A transcode's time is the encoder's.
            vs.thread_type = "SLICE"
            out = dict(
                codec=s.codec,
                codec_tag=mp4_tag(s.codec, None),
                width=s.width or cc.width + cc.width % 2,
                height=s.height or cc.height + cc.height % 2,
                fps=float(s.fps) if s.fps else fps,
            )
        self._audio_report.tracks = len(c.streams.audio)
        audio = self._open_audio() if self._want_audio and c.streams.audio else None
        tb = 1 / self.spec.fps if self.spec is not None and self.spec.fps else vs.time_base
        self._picture = (out["width"], out["height"])
        self._in_band = self.spec is None and in_band_headers(codec, cc.extradata)
        self._info = VideoInfo(**out, time_base=tb, audio=audio, source=f"{codec} in {fmt}")

    def _open_audio(self) -> AudioInfo | None:
        import av

        try:
            self._audio = open_audio(self.path, self._audio_report)
        except (av.error.FFmpegError, OSError, ValueError) as e:
            self._audio_report.error = f"audio track cannot be read ({why(e)}); clips carry no audio"
            return None
        return self._audio.info

    def clips(self, clip_seconds: float, report: DemuxReport) -> Iterator[Clip]:
        """Clips in order. A clip is emitted once the next segment is read (its leading frames set the
        window's end); the final clip of a truncated file is decode-checked and trimmed first, and so is
        the final clip of a container that declares no frame count (Matroska, MPEG-TS, fragmented MP4):
        there a file cut inside its last frame demuxes as whole packets."""
        report.audio = self._audio_report
        report.other_video_streams = len(_moving(self._container)) - 1
        prev: _Segment | None = None
        index = 0
        for seg in self._segments(clip_seconds, report):
            if prev is not None:
                lead = seg.first_leading_pts
                yield self._clip(
                    index,
                    prev,
                    self._window_end(prev, seg.key_pts if lead is None else min(lead, seg.key_pts), report),
                    clip_seconds,
                    report,
                )
                index += 1
            prev = seg
        if prev is not None:
            packets = prev.packets
            if report.truncated or self._tail_unproven(packets):
                packets = self._decodable(packets, report)
                if len(packets) < len(prev.packets) and not report.truncated:
                    report.truncated = (
                        f"its last {len(prev.packets) - len(packets)} frame(s) do not decode: the file was cut short"
                    )
            if packets:
                yield self._clip(
                    index,
                    _Segment(packets, prev.key_pts, header=prev.header),
                    self._frames_end(packets),
                    clip_seconds,
                    report,
                )

    def _tail_unproven(self, packets: list[PacketRecord]) -> bool:
        """Whether the file may end inside its last frame with nothing saying so: its container declares
        no frame count, and it was not finished either (a fragmented MP4's closing ``mfro`` box; a
        Matroska duration its video reaches within ``FINISHED_SLACK``). MPEG-TS never says: its last clip
        is always decode-checked, as are those of recordings a crash cut short."""
        if self._stream.frames:
            return False  # (a declared count the demuxer did not reach is a truncation: ``_packets``)
        fmt, c = self._container.format.name, self._container
        if "mp4" in fmt:
            return not self._ends_with_mfro
        if "matroska" in fmt and c.duration:  # (its Duration counts from timestamp 0, as packets do)
            video_end = seconds(self._frames_end(packets), self._tb)
            return video_end < c.duration / 1e6 - FINISHED_SLACK
        return True

    def _frames_end(self, packets: list[PacketRecord]) -> int:
        """Where the last frame of ``packets`` ends (pts): its start plus its duration, or one frame at the
        nominal rate where the container gives none."""
        last = max(packets, key=lambda p: p.pts)
        dur = last.duration or (round(1 / self.info.fps / float(self._tb)) if self.info.fps else 1)
        return last.pts + max(dur, 1)

    def _window_end(self, seg: _Segment, next_start: int, report: DemuxReport) -> int:
        """Where ``seg``'s window ends: where the next begins (``next_start``), unless the video stops for
        longer than GAP_SECONDS before that; then where its last frame ends, counted as a gap."""
        end = self._frames_end(seg.packets)
        if seconds(next_start - end, self._tb) <= GAP_SECONDS:
            return next_start
        report.gaps += 1
        return end

    def _segments(self, clip_seconds: float, report: DemuxReport) -> Iterator[_Segment]:
        seg: _Segment | None = None
        for p in self._packets(report):
            if report.dropped_after_restart:
                report.dropped_after_restart += 1
                continue
            if p.keyframe and seg is not None and p.pts < seg.key_pts:
                # A keyframe earlier than the open clip's: the clock went back (two recordings in one file,
                # a capture card that restarted). Open-GOP leading frames are never keyframes. What follows
                # would overlap the timeline: the session ends here, its final clip decode-checked.
                report.truncated = (
                    f"timestamps go back at packet {report.packets} ({self._t(p.pts):.3f} s "
                    f"after {self._t(seg.key_pts):.3f} s): the recording restarted; the rest "
                    "is not converted"
                )
                report.dropped_after_restart += 1
                continue
            if self._t0 is None:
                if not p.keyframe:
                    report.dropped_before_keyframe += 1
                    continue
                start = self._stream.start_time
                self._t0 = p.pts if start is None else min(p.pts, start)
                if self._audio is not None:
                    self._audio.origin = self._t0 * self._tb
            # a keyframe whose in-band sequence header changed (the picture size may have) starts a clip; one
            # that carries none has the header before it
            header = seg.header if seg is not None else None
            if p.keyframe and self._in_band:
                header = sequence_header(p.data, self.info.codec) or header
            if (
                p.keyframe
                and seg is not None
                and (
                    should_cut(self._t(seg.key_pts), self._t(p.pts), clip_seconds)
                    or (seg.header is not None and header != seg.header)
                )
            ):
                yield seg
                seg = None
            if seg is None:
                seg = _Segment([], p.pts, header=header)
            elif p.pts < seg.key_pts:
                report.dropped_leading += 1
                lead = seg.first_leading_pts
                seg.first_leading_pts = p.pts if lead is None else min(lead, p.pts)
                continue
            elif p.pts in seg.seen:  # two frames stamped alike (a recorder's millisecond clock): the later
                pts = p.pts  # one moves to the next free tick (dropped, it broke every frame after
                while pts in seg.seen:  # it that references it: decoded pictures shifted, silently)
                    pts += 1
                p = replace(p, pts=pts)
                report.restamped_duplicate_pts += 1
            seg.seen.add(p.pts)
            seg.packets.append(p)
        if seg is not None:
            yield seg

    def _t(self, pts: int) -> float:
        return seconds(self._ticks(pts), self._tb)

    def _ticks(self, pts: int) -> int:
        """``pts`` on the session clock: ticks since the first video frame."""
        if self._t0 is None:
            raise FormatError(f"{self.path.name}: a clip was cut before the first frame was read")
        return pts - self._t0

    def _packets(self, report: DemuxReport) -> Iterator[PacketRecord]:
        import av

        size = self._size
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
                if p.is_discard:  # an edit list hides it: players never show it (nor decode past it)
                    report.dropped_edit_list += 1
                    continue
                yield PacketRecord(bytes(p), p.pts, p.dts, p.duration or 0, p.is_keyframe)
        except (av.error.FFmpegError, OSError, IndexError) as e:  # IndexError: PyAV, on a stream added mid-file
            report.truncated = f"demux stopped after {report.packets} packets: {why(e)}"
            return
        declared = self._stream.frames
        if declared and report.packets < declared:
            report.truncated = f"container declares {declared} frames, {report.packets} were readable"
        elif self._declared_end is not None and self._declared_end > size:  # a finished Matroska file cut short
            report.truncated = (
                f"the file ends {self._declared_end - size} bytes before the end its Matroska "
                "header declares: it was cut short"
            )

    def _decodable(self, packets: list[PacketRecord], report: DemuxReport) -> list[PacketRecord]:
        """The final packets of a truncated file (or of one whose container cannot tell), trimmed until
        every one decodes (only the last clip of those pays for this decode: elsewhere the demuxer has
        whole packets and remux is lossless)."""
        kept = packets
        for _ in range(TRIM_TRIES):
            good = sum(1 for _ in self._decode(kept, strict=False))
            if good == len(kept):
                break
            kept = kept[:good]
            if not kept:
                break
        else:
            kept = []
        report.dropped_undecodable += len(packets) - len(kept)
        return kept

    def _picture_size(self, seg: _Segment, report: DemuxReport) -> tuple[int, int]:
        """The clip's picture size: the stream's until a keyframe's in-band sequence header changes (a
        capture card whose input switched resolution mid-recording: such a keyframe always starts a clip);
        then the clip's first frame is decoded to learn it. Every clip was labelled with the first size."""
        header = seg.header
        if header is None or header == self._header:
            return self._picture
        if self._header is not None:
            frame = next((f for _, f in self._decode(seg.packets, strict=False)), None)
            if frame is not None and 0 < frame.width * frame.height <= MAX_PIXELS:
                size = (frame.width, frame.height)
                report.resolution_changes += size != self._picture
                self._picture = size
        self._header = header
        return self._picture

    def _clip(self, index: int, seg: _Segment, end_pts: int, clip_seconds: float, report: DemuxReport) -> Clip:
        t_start, t_end = self._t(seg.key_pts), self._t(end_pts)
        if t_end - t_start > 1.5 * clip_seconds:
            report.long_clips += 1
            keys = sorted({p.pts for p in seg.packets if p.keyframe} | {end_pts})
            a, b = max(zip(keys, keys[1:]), key=lambda ab: ab[1] - ab[0])
            gap = (round(self._t(b) - self._t(a), 3), sum(1 for p in seg.packets if a <= p.pts < b))
            report.keyframe_gap = max(report.keyframe_gap or gap, gap)
        cut = self._audio.cut(t_start, t_end) if self._audio is not None else None
        packets = seg.packets
        if cut is not None and not covers(cut, self._t(min(p.pts for p in packets)), t_end):
            report.audio.partial_clips += 1  # a recording whose audio stopped (or began) inside the clip
            report.audio.clips_without_audio += 1
            cut = None
        try:
            data, frame_t = self._mux(packets, t_start, t_end, cut)
        except FormatError:
            if cut is None:
                raise
            report.audio.clips_without_audio += 1  # the audio would not mux: keep the video
            data, frame_t = self._mux(packets, t_start, t_end, None)
            cut = None
        report.audio.clips_with_audio += cut is not None
        width, height = self._picture_size(seg, report)
        return Clip(index, data, frame_t, t_start, t_end, None if cut is None else cut.audio, width, height)

    def _mux(self, packets: list[PacketRecord], t_start: float, t_end: float, cut) -> tuple[bytes, np.ndarray]:
        """The clip's MP4 and its frame times: packets copied (or transcoded) plus the audio cut."""
        import av

        tb = self._tb
        w = Mp4Writer()
        try:
            if self.spec is None:
                vstream = w.copy_stream(self._stream, self._tag)
                astream = cut.add_to(w) if cut is not None else None
                dts = monotonic_dts(packets)
                w.write(vstream, packets, dts, tb, min(dts))
                frame_t = np.sort(np.array([self._t(p.pts) for p in packets], dtype=np.float64))
                base = Fraction(self._ticks(min(dts))) * tb
            else:
                enc = ClipEncoder(w, self.spec, (self.info.width, self.info.height), self._stream.average_rate, tb)
                astream = cut.add_to(w) if cut is not None else None
                frame_t = enc.encode(self._decode(packets), Fraction(t_start), Fraction(t_end))
                base = Fraction(t_start)
            if cut is not None:
                cut.write(w, astream, base)
            return w.close(), frame_t
        except (av.error.FFmpegError, ValueError) as e:
            w.abort()
            what = f"audio {cut.audio.codec}" if cut is not None else f"video {self.info.codec}"
            raise FormatError(f"{self.info.source}: writing an MP4 clip failed ({what}: {why(e)})") from None
        except BaseException:
            w.abort()
            raise

    def _decode(self, packets: list[PacketRecord], strict: bool = True) -> Iterator[tuple[Fraction, VideoFrame]]:
        """(seconds from the first video frame, frame) of a clip's packets, in presentation order, up to the
        first packet the decoder refuses or the first frame it had to conceal: a FormatError when
        ``strict`` (a transcode never encodes damage), else the end of the frames."""
        import av

        cc, tb = self._stream.codec_context, self._tb
        cc.flush_buffers()
        n, why_not = 0, None
        try:
            for rec in [*packets, None]:
                pkt = None
                if rec is not None:
                    pkt = av.Packet(rec.data)
                    pkt.pts, pkt.dts, pkt.time_base = rec.pts, rec.dts, tb
                for frame in cc.decode(pkt):
                    if frame.is_corrupt:
                        why_not = f"frame {n + 1} is damaged"
                        break
                    n += 1
                    if frame.pts is not None:
                        yield Fraction(self._ticks(frame.pts)) * tb, frame
                if why_not:
                    break
        except (av.error.FFmpegError, ValueError) as e:
            why_not = why(e)
        if why_not and strict:
            raise FormatError(
                f"{self.info.source}: the clip at {self._t(packets[0].pts):.3f} s does not decode "
                f"for transcoding after {n} frames ({why_not})"
            )


def decoded_frame_count(data: bytes) -> int:
    """How many frames of a clip decode before the first error or damaged frame."""
    from dsbuild.formats.probe import probe_clip

    return probe_clip(data).frames

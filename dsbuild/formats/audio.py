"""Audio: the session's first audio track, cut to each clip's window and carried in the clip's MP4.

Codecs MP4 holds (AAC, MP3, MP2, Opus, AC-3, E-AC-3, ALAC, FLAC) are copied packet by packet: a packet
belongs to the clip whose window [t_start, t_end) holds its start, so audio starts and ends less than one
audio frame after the video (never before it), and every packet lands in at most one clip. Anything else
(PCM, Vorbis, ...) is decoded and re-encoded to FLAC: lossless, integer-only with fixed predictors and
single-threaded, so the bytes do not depend on the machine, and cut at the sample exactly.

Every carried packet is decoded once by a session-long decoder: a clip whose audio does not decode loses
its audio (counted in ``AudioReport``) and keeps its video. Audio never quarantines a session.

Only the first audio track is carried (OBS's track 1 is the mix); further tracks are counted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsbuild.formats.mp4 import Mp4Writer, PacketRecord, demux_only, monotonic_dts, why

if TYPE_CHECKING:
    from av.audio.resampler import AudioResampler

COPY_CODECS = frozenset({"aac", "mp3", "mp2", "opus", "ac3", "eac3", "alac", "flac"})
REENCODE_CODEC = "flac"
FLAC_OPTIONS = {"lpc_type": "fixed"}  # integer-only prediction: same bytes whatever the CPU's float paths
FLAC_BLOCK = 4608  # samples in a FLAC frame as FFmpeg's encoder writes them at 44.1-48 kHz: one "audio frame"
SYNC_SLACK = 1e-3  # seconds beyond one audio frame: timestamp rounding in a clip's MP4 clocks
MAX_CHANNELS = 8  # FLAC's limit, and more than any capture has


@dataclass(frozen=True)
class AudioInfo:
    """The audio as clips carry it (``codec`` is "flac" when the source codec was re-encoded)."""

    codec: str
    source_codec: str
    sample_rate: int
    channels: int


@dataclass(frozen=True)
class AudioSpan:
    """The audio of one clip: what it carries and the span it covers (seconds from the first video frame)."""

    codec: str
    sample_rate: int
    channels: int
    t_start: float
    t_end: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class AudioReport:
    """Audio that did not reach a clip, by reason. All counted; none of it stops the video."""

    tracks: int = 0  # audio tracks in the capture (only the first is carried)
    clips_with_audio: int = 0
    partial_clips: int = 0  # clips whose audio would not cover them (it began, ended or had a hole inside): none
    packets: int = 0
    outside_clips: int = 0  # before the first video frame, after the last, or in a dropped-frame gap
    undecodable: int = 0  # packets the decoder refused
    clips_without_audio: int = 0  # clips whose audio was dropped because part of it did not decode or mux
    reencoded_from: str | None = None  # source codec when MP4 could not carry it as it is
    error: str | None = None  # why audio stopped early (demux error, no decoder), if it did

    def to_json(self) -> dict:
        return asdict(self)


def _round_ratio(n: int, d: int) -> int:
    """round(n / d) exactly, halves to even (what ``round(Fraction)`` does), in integers."""
    q, r = divmod(n, d)
    return q + (1 if 2 * r > d or (2 * r == d and q & 1) else 0)


def _scaler(scale: Fraction, offset: Fraction):
    """``ticks -> round(ticks * scale - offset)`` in integer arithmetic, its constants taken once (per
    packet, Fraction arithmetic and even its ``numerator`` properties cost microseconds)."""
    a = scale.numerator * offset.denominator
    b = offset.numerator * scale.denominator
    d = scale.denominator * offset.denominator
    return lambda ticks: _round_ratio(ticks * a - b, d)


class _CopiedCut:
    """Packets of one window, muxed as they are, re-timed to 1/sample_rate ticks (a coarse source clock
    such as AVI's one tick per MP3 frame would otherwise shift the audio by up to a frame)."""

    def __init__(self, template, packets: list[PacketRecord], origin: Fraction, info: AudioInfo):
        self.template, self.origin, self.rate = template, origin, info.sample_rate
        self.tb = template.time_base
        self.packets = packets
        first, last = packets[0], packets[-1]
        self.audio = AudioSpan(
            info.codec,
            info.sample_rate,
            info.channels,
            float(first.pts * self.tb - origin),
            float((last.pts + last.duration) * self.tb - origin),
        )
        self.frame_seconds = float(max(p.duration for p in packets) * self.tb)  # its longest packet

    def add_to(self, writer: Mp4Writer):
        return writer.copy_stream(self.template)

    def write(self, writer: Mp4Writer, stream, base: Fraction) -> None:
        """Mux into ``stream`` with times relative to ``base`` (seconds from the first video frame)."""
        rate = self.rate
        at, length = _scaler(self.tb * rate, (self.origin + base) * rate), _scaler(self.tb * rate, Fraction(0))
        timed = [PacketRecord(p.data, at(p.pts), None, length(p.duration), True) for p in self.packets]
        writer.write(stream, timed, monotonic_dts(timed), Fraction(1, rate), 0)


class _EncodedCut:
    """Samples of one window (int16 [samples, channels]), encoded to FLAC when muxed."""

    def __init__(self, samples: np.ndarray, start: Fraction, layout: str, info: AudioInfo):
        self.samples, self.start, self.layout = samples, start, layout
        rate = info.sample_rate
        end = start + Fraction(len(samples), rate)
        self.audio = AudioSpan(info.codec, rate, info.channels, float(start), float(end))
        self.frame_seconds = FLAC_BLOCK / rate

    def add_to(self, writer: Mp4Writer):
        import av

        stream = writer.add_stream(REENCODE_CODEC, rate=self.audio.sample_rate)
        stream.layout, stream.format = self.layout, "s16"
        stream.codec_context.thread_count = 1
        stream.codec_context.flags |= av.codec.context.Flags.bitexact
        stream.options = dict(FLAC_OPTIONS)
        stream.codec_context.open()  # sets the block size (depends on the rate: 4608 samples at 48 kHz)
        return stream

    def write(self, writer: Mp4Writer, stream, base: Fraction) -> None:
        import av

        rate = self.audio.sample_rate
        offset = round((self.start - base) * rate)
        block = stream.codec_context.frame_size
        for i in range(0, len(self.samples), block):
            chunk = np.ascontiguousarray(self.samples[i : i + block])
            frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout=self.layout)
            frame.rate, frame.pts, frame.time_base = rate, offset + i, Fraction(1, rate)
            for p in stream.encode(frame):
                writer.mux(p)
        for p in stream.encode(None):
            writer.mux(p)


def _hole(packets: list[PacketRecord], tb: Fraction) -> bool:
    """Whether copied packets leave more than one audio frame (and the slack) of time uncovered between
    two of them: audio missing inside a clip (a recorder that dropped it), which MP4 would close up.
    (``(b.pts - a.end) * tb > a.duration * tb + slack``, in integers.)"""
    slack = Fraction(SYNC_SLACK)
    per_tick, limit = tb.numerator * slack.denominator, tb.denominator * slack.numerator
    return any((b.pts - a.pts - 2 * a.duration) * per_tick > limit for a, b in zip(packets, packets[1:]))


def covers(cut, first: float, end: float) -> bool:
    """Whether a cut's audio spans a clip from its first frame (``first``) to its window's end (``end``),
    within one audio frame: what validate demands of every clip with audio."""
    tol = cut.frame_seconds + SYNC_SLACK
    return abs(cut.audio.t_start - first) <= tol and abs(cut.audio.t_end - end) <= tol


class AudioTrack:
    """The first audio stream of a capture, read by its own demuxer (memory holds one window, whatever the
    interleaving), cut to successive clip windows with ``cut``. Times are seconds from the first video
    frame (``origin``, in the audio demuxer's clock). Made by ``open_audio``."""

    def __init__(self, container, info: AudioInfo, report: AudioReport):
        self.report, self.info, self._container = report, info, container
        self._stream = container.streams.audio[0]
        self._layout = self._stream.codec_context.layout.name
        self._copy = info.codec == info.source_codec
        self.origin = Fraction(0)
        self._packets = self._demux()
        self._next: tuple[Fraction, PacketRecord, list | None] | None = None
        self._last: PacketRecord | None = None  # the last packet taken (copied audio)
        self._samples = _Samples(info.sample_rate, info.channels)  # re-encode path: decoded, not yet cut
        self._resampler: AudioResampler | None = None  # made on the first re-encoded cut

    def close(self) -> None:
        self._container.close()

    def _demux(self):
        """(start time, packet, decoded frames) in decode order; stops, recording why, on a demux error."""
        import av

        tb = self._stream.time_base
        frame_ticks = self._stream.codec_context.frame_size or 0
        default_duration = round(Fraction(frame_ticks, self.info.sample_rate) / tb)  # a packet that names none
        try:
            for p in self._container.demux(self._stream):
                if p.size == 0 or p.pts is None:
                    continue
                self.report.packets += 1
                try:
                    frames = self._stream.codec_context.decode(p)
                except (av.error.FFmpegError, ValueError):
                    self.report.undecodable += 1
                    frames = None
                rec = PacketRecord(bytes(p), p.pts, p.dts, p.duration or default_duration, True)
                yield p.pts, rec, frames
        except (av.error.FFmpegError, OSError, IndexError) as e:  # IndexError: PyAV, on a stream added mid-file
            self.report.error = f"audio demux stopped after {self.report.packets} packets: {why(e)}"

    def cut(self, t_start: float, t_end: float):
        """The audio of window [t_start, t_end) as a cut to mux (``add_to(writer)`` then ``write``; ``.audio``
        describes it), or None when the window has none or part of it did not decode (then counted). An
        error the decoder or resampler raises ends the track's audio (``report.error``), never the video."""
        import av

        if self.report.error is not None:
            self.report.clips_without_audio += 1
            return None
        lo, hi = Fraction(t_start), Fraction(t_end)
        try:
            return self._copy_cut(lo, hi) if self._copy else self._encode_cut(lo, hi)
        except (av.error.FFmpegError, ValueError) as e:
            self.report.error = f"audio stopped at {t_start:.3f} s: {why(e)}"
            self.report.clips_without_audio += 1
            return None

    def _ticks(self, t: Fraction) -> int:
        """The first tick of the audio clock at or after ``t`` (seconds from the first video frame): a
        packet starts before ``t`` exactly when its pts is below this (integer comparisons per packet)."""
        return math.ceil((t + self.origin) / self._stream.time_base)

    def _take(self, hi: Fraction):
        """(pts, packet, frames) of packets starting before ``hi`` that were not taken yet."""
        limit = self._ticks(hi)
        while True:
            if self._next is None:
                self._next = next(self._packets, None)
                if self._next is None:
                    return
            if self._next[0] >= limit:
                return
            item, self._next = self._next, None
            yield item

    def _copy_cut(self, lo: Fraction, hi: Fraction):
        packets, broken, start = [], False, self._ticks(lo)
        for pts, rec, frames in self._take(hi):
            if self._last is not None and pts < self._last.pts:  # a second recording's audio would be mixed in
                t = float(pts * self._stream.time_base - self.origin)
                self.report.error = (
                    f"audio timestamps go back at {t:.3f} s (the recording restarted); the rest is not carried"
                )
                break
            self._last = rec
            if pts < start:
                self.report.outside_clips += 1
            else:
                packets.append(rec)
                broken |= frames is None
        if broken or not packets:  # part of it did not decode, or the track has nothing here (it ended)
            self.report.clips_without_audio += 1
            return None
        if _hole(packets, self._stream.time_base):  # played as is, what follows the hole would come early
            self.report.partial_clips += 1
            self.report.clips_without_audio += 1
            return None
        return _CopiedCut(self._stream, packets, self.origin, self.info)

    def _encode_cut(self, lo: Fraction, hi: Fraction):
        import av

        if self._resampler is None:
            self._resampler = av.AudioResampler(format="s16", layout=self._layout, rate=self.info.sample_rate)
        broken = False
        tb = self._stream.time_base
        for pts, _rec, frames in self._take(hi):
            if frames is None:
                broken = True
                continue
            for f in frames:
                at = (pts if f.pts is None else f.pts) * tb - self.origin
                for r in self._resampler.resample(f):
                    self._samples.append(r.to_ndarray().reshape(-1, self.info.channels), at)
        window, start = self._samples.take(lo, hi)
        if broken:
            self.report.clips_without_audio += 1
            return None
        if not len(window) or start is None:  # (no samples: no start)
            self.report.clips_without_audio += 1
            return None
        return _EncodedCut(window, start, self._layout, self.info)


class _Samples:
    """Decoded samples not yet cut, anchored in time: a jump in the decoder's timestamps larger than
    ``SLACK`` (a dropped packet, a recorder gap) is filled with silence or trimmed, so later windows stay
    in sync; smaller differences are clock rounding (Matroska's milliseconds) and are ignored."""

    SLACK = Fraction(1, 20)  # seconds
    MAX_GAP = 10  # seconds of silence at most; a longer gap restarts the timeline at the new samples

    def __init__(self, rate: int, channels: int):
        self.rate, self.channels = rate, channels
        self.chunks: list[np.ndarray] = []
        self.count = 0
        self.start: Fraction | None = None  # time of the first buffered sample

    def append(self, samples: np.ndarray, at: Fraction) -> None:
        if self.start is None:
            self.start = at
        drift = at - (self.start + Fraction(self.count, self.rate))
        if drift > self.MAX_GAP:
            self.chunks, self.count, self.start = [], 0, at
        elif drift > self.SLACK:
            self._add(np.zeros((round(drift * self.rate), self.channels), np.int16))
        elif drift < -self.SLACK:
            samples = samples[min(len(samples), round(-drift * self.rate)) :]
        self._add(samples)

    def _add(self, samples: np.ndarray) -> None:
        if len(samples):
            self.chunks.append(samples)
            self.count += len(samples)

    def take(self, lo: Fraction, hi: Fraction) -> tuple[np.ndarray, Fraction | None]:
        """Samples whose time is in [lo, hi) and the time of the first; earlier ones are discarded."""
        if self.start is None:
            return np.zeros((0, self.channels), np.int16), None
        buf = np.concatenate(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        first = min(self.count, max(0, math.ceil((lo - self.start) * self.rate)))
        last = min(self.count, max(0, math.ceil((hi - self.start) * self.rate)))
        start = self.start + Fraction(first, self.rate)
        self.chunks = [buf[last:]] if last < self.count else []
        self.start += Fraction(last, self.rate)
        self.count -= last
        return buf[first:last], start


def open_audio(path: Path, report: AudioReport) -> AudioTrack:
    """The capture's first audio track; ValueError/FFmpegError when it cannot be decoded or is implausible."""
    import av

    container = av.open(str(path), metadata_errors="ignore")
    try:
        demux_only(container, container.streams.audio[0])
        cc = container.streams.audio[0].codec_context
        if cc is None:
            raise ValueError("FFmpeg has no decoder for this audio codec")
        if not 0 < cc.channels <= MAX_CHANNELS or not 0 < cc.sample_rate <= 768_000:
            raise ValueError(f"{cc.channels} channels at {cc.sample_rate} Hz is not a usable audio track")
        codec = cc.codec.canonical_name
        if codec not in COPY_CODECS:
            report.reencoded_from = codec
        info = AudioInfo(codec if codec in COPY_CODECS else REENCODE_CODEC, codec, cc.sample_rate, cc.channels)
        return AudioTrack(container, info, report)
    except BaseException:
        container.close()
        raise


def decode_audio(data: bytes, rate: int, channels: int | None = None) -> np.ndarray:
    """The first audio track of a clip as float32 PCM [samples, channels] at ``rate`` Hz.

    Resampled by swresample with its fixed default filter, so the same bytes give the same array.
    ``channels`` None keeps the clip's channel layout; 1 and 2 down/up-mix. Raises FormatError when the clip
    has no decodable audio, ValueError for another channel count.
    """
    import io

    import av

    from dsbuild.core.errors import FormatError

    out = []
    try:
        with av.open(io.BytesIO(data), "r", metadata_errors="ignore") as c:
            if not c.streams.audio:
                raise FormatError("clip has no audio track")
            s = c.streams.audio[0]
            own = s.codec_context.layout
            n = channels or own.nb_channels
            layout = own.name if n == own.nb_channels else {1: "mono", 2: "stereo"}.get(n)
            if layout is None:
                raise ValueError(f"channels={channels}: use 1, 2 or the clip's own {own.nb_channels}")
            resampler = av.AudioResampler(format="flt", layout=layout, rate=rate)
            for frame in c.decode(s):
                out += [r.to_ndarray().reshape(-1, n) for r in resampler.resample(frame)]
            out += [r.to_ndarray().reshape(-1, n) for r in resampler.resample(None)]
    except (av.error.FFmpegError, OSError) as e:
        raise FormatError(f"clip audio does not decode ({why(e)})") from None
    return np.concatenate(out) if out else np.zeros((0, channels or 1), np.float32)

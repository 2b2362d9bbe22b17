"""What a clip holds, measured by decoding it: the facts validate checks and loaders rely on.

Decoding is strict about damage but not about harmless warnings: a frame the decoder had to conceal or
flag as corrupt (``AVFrame`` decode error flags) ends the decode, like an error it raises; FFmpeg's
``err_detect=explode`` is not used because it also refuses valid open-GOP H.264 clips (memory management
commands that name pictures of the previous GOP, harmless at a recovery point).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np

from dsbuild.formats.mp4 import why
from dsbuild.formats.sample import VIDEO_EXT

ERR_DETECT = "crccheck+bitstream+buffer"  # find damage (and flag the frame) without aborting on warnings
# swscale threads per frame conversion (``VideoReformatter.reformat(threads=...)``, PyAV >= 17). PyAV's
# default, 0, starts one thread per core for every frame: where the callers' own threads or processes
# are already on every core, that cost 4-12% of the loader's frames/s and 3-4x validate's 64 px gray
# frames here, and it made small conversions (128x128) up to 2.6x slower even alone.
SWSCALE_THREADS = 1


def decoder_threads(decoders: int) -> int:
    """FFmpeg decoding threads for each of ``decoders`` clips decoded at once on this node (a loader's
    worker processes or a DataLoader's workers, times the ranks torchrun starts here: ``LOCAL_WORLD_SIZE``): the cores this process may run
    on, shared out, at least one each; 0 (FFmpeg's own choice, a thread per core) for a lone decoder.
    Two worker processes each decoding with a thread per core read 173 clips/s on 2 cores, 222 with one
    thread each; a lone one is as fast either way on small clips, and frame threads pay on large ones."""
    total = decoders * max(1, _local_world())
    return 0 if total <= 1 else max(1, usable_cores() // total)


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or a job scheduler's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _local_world() -> int:
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return 1


# How a stored clip (always MP4: ``sample.VIDEO_EXT``) is opened. FFmpeg's stream probing
# (avformat_find_stream_info) decodes each clip's first frame to learn what its MP4 header already says
# (the pixel format): ~10 ms for a 720p frame, 7% of decoding a 60-frame clip and a third of an 8-frame
# crop. The probe's decoders skip every frame and it reads one packet; the decoders that then decode are
# built from the header as before and give the same frames and samples (tested).
STORED_OPEN = {"probesize": "32", "skip_frame": "all"}


def open_clip(data, **kw):
    """A stored clip as a PyAV input container, opened as MP4 without FFmpeg's probing decode."""
    import av

    return av.open(io.BytesIO(data), format=VIDEO_EXT, options=STORED_OPEN, metadata_errors="ignore", **kw)


def frame_rate(frame_t: np.ndarray) -> float | None:
    """Mean frame rate of sorted frame times: (frames - 1) / (last - first). One definition for a clip's
    recorded timestamps (convert's, from packet times) and its decoded ones: exact for constant rates, the
    true average for variable ones."""
    if len(frame_t) < 2 or frame_t[-1] <= frame_t[0]:
        return None
    return (len(frame_t) - 1) / float(frame_t[-1] - frame_t[0])


@dataclass(frozen=True)
class AudioProbe:
    """The clip's first audio track; times in seconds from the clip's first video frame."""

    codec: str
    sample_rate: int
    channels: int
    start: float | None  # first packet's start
    end: float | None  # last packet's end
    frame_seconds: float  # longest packet: "one audio frame", the sync tolerance
    packets: int
    error: str | None  # why its decoding failed, if it did

    def to_json(self) -> dict:
        return {
            "codec": self.codec,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "start": self.start,
            "end": self.end,
            "frame_seconds": self.frame_seconds,
            "packets": self.packets,
            "error": self.error,
        }


@dataclass(frozen=True)
class ClipProbe:
    frames: int  # frames decoded before the first error or damaged frame
    frame_t: np.ndarray  # float64 presentation times in seconds from the first frame, sorted
    last_duration: float | None  # the last frame's display time, when the container says
    sizes: tuple[tuple[int, int], ...]  # distinct decoded (width, height)
    codec: str | None
    codec_tag: str | None
    error: str | None  # why decoding stopped early (None: every frame decoded)
    audio: AudioProbe | None

    @property
    def width(self) -> int | None:
        return self.sizes[0][0] if self.sizes else None

    @property
    def height(self) -> int | None:
        return self.sizes[0][1] if self.sizes else None

    @property
    def fps(self) -> float | None:
        return frame_rate(self.frame_t)

    @property
    def span(self) -> float | None:
        """First frame to the end of the last one (the last frame lasts its own duration, else the median
        interval): the time the video covers."""
        t = self.frame_t
        if len(t) < 2:
            return self.last_duration if len(t) and self.last_duration else None
        return float(t[-1] - t[0]) + (self.last_duration or float(np.median(np.diff(t))))


def probe_clip(data: bytes, on_frame=None) -> ClipProbe:
    """Decode a clip once. ``on_frame(i, frame)`` sees every decoded video frame (for extra statistics
    without a second decode). Never raises for bad data: ``error`` says why decoding stopped."""
    import av

    try:
        container = open_clip(data)
    except (av.error.FFmpegError, OSError, ValueError, UnicodeDecodeError) as e:
        return _failed(f"not a readable video ({why(e)})")
    with container:
        if not container.streams.video:
            return _failed("no video stream")
        vs = container.streams.video[0]
        # Slice threads, not frame threads: with frame threading FFmpeg's H.264 decoder lost the flag of a
        # frame it concealed in about 1 process in 6 (the same bytes, a damaged clip accepted at random);
        # with slices the flag is there every time. It costs about 2x a clip's decode on one-slice captures
        # where one clip is decoded alone; validate decodes clips on every core at once anyway.
        vs.thread_type = "SLICE"
        vs.codec_context.options = {"err_detect": ERR_DETECT}
        streams = [vs]
        audio = container.streams.audio[0] if container.streams.audio else None
        if audio is not None:
            streams.append(audio)
        times: list[float] = []
        sizes: set[tuple[int, int]] = set()
        audio_spans: list[tuple[float, float]] = []  # (start, end) seconds of each audio packet
        last = None  # the last frame with a duration: its seconds are worked out once, at the end
        error = audio_error = None
        # Seconds per audio tick as a float, once: PyAV's time bases are Fractions, and Fraction
        # arithmetic per packet cost more than the Python of this loop
        audio_tb = float(audio.time_base) if audio is not None and audio.time_base else None
        try:
            for packet in container.demux(*streams):
                if packet.stream is audio:
                    audio_error = audio_error or _audio_packet(audio, packet, audio_tb, audio_spans)
                    continue
                for frame in vs.codec_context.decode(packet):
                    if frame.is_corrupt:
                        raise _Damaged(len(times))
                    if on_frame is not None:
                        on_frame(len(times), frame)
                    sizes.add((frame.width, frame.height))
                    time = frame.time
                    times.append(np.nan if time is None else time)
                    if frame.duration:
                        last = frame
        except _Damaged as d:
            n = d.args[0]
            error = f"decode error after {n} frames (frame {n + 1} is damaged; the decoder concealed it)"
        except (av.error.FFmpegError, OSError, ValueError, IndexError) as e:  # IndexError: PyAV, on a new stream
            error = f"decode error after {len(times)} frames ({why(e)})"
        if not times and error is None:
            error = "no frame decodes"
        last_duration = float(last.duration * last.time_base) if last is not None and last.time_base else None
        t = np.sort(np.asarray(times, np.float64))
        first = float(t[0]) if len(t) else 0.0
        cc = vs.codec_context
        return ClipProbe(
            frames=len(times),
            frame_t=t - first,
            last_duration=last_duration,
            sizes=tuple(sorted(sizes)),
            codec=cc.codec.canonical_name,
            codec_tag=(vs.codec_tag or "").strip("\0") or None,
            error=error,
            audio=None if audio is None else _audio_probe(audio, audio_spans, first, audio_error),
        )


class _Damaged(Exception):
    pass


def _audio_packet(stream, packet, tb: float | None, spans: list) -> str | None:
    """Record the packet's span (``tb``: seconds per tick) and decode it; returns why it failed to
    decode, if it did."""
    import av

    if packet.size == 0 or packet.pts is None:
        return None
    if not tb:
        return "the audio stream gives no time base"
    pts = packet.pts
    spans.append((pts * tb, (pts + (packet.duration or 0)) * tb))
    try:
        stream.codec_context.decode(packet)
    except (av.error.FFmpegError, ValueError) as e:
        return f"audio packet {len(spans)} does not decode ({why(e)})"
    return None


def _audio_probe(stream, spans: list, first: float, error: str | None) -> AudioProbe:
    cc = stream.codec_context
    frame = max((b - a for a, b in spans), default=0.0)
    return AudioProbe(
        codec=cc.codec.canonical_name,
        sample_rate=cc.sample_rate,
        channels=cc.channels,
        start=min(a for a, _ in spans) - first if spans else None,
        end=max(b for _, b in spans) - first if spans else None,
        frame_seconds=frame,
        packets=len(spans),
        error=error,
    )


def _failed(error: str) -> ClipProbe:
    return ClipProbe(0, np.zeros(0, np.float64), None, (), None, None, error, None)

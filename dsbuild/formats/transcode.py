"""Normalised training encodings: clips re-encoded to one codec, size, frame rate, GOP and pixel format.

Spec grammar (``parse_transcode``)::

    spec   := codec (":" option)*          e.g.  h264:256x256:30fps:gop8
    codec  := h264 | hevc | av1 | vp9 | mjpeg
    option := WIDTHxHEIGHT                 output size (stretched, no letterbox); default: the source's
            | RATE "fps"                   constant output rate, RATE an integer, decimal or N/D; default:
                                           keep every source frame and its timestamp (VFR stays VFR)
            | "gop" N                      frames from one keyframe to the next (closed GOPs); default 30
            | "crf" N                      quality on the encoder's own scale (x264/x265 0-51, SVT-AV1 and
                                           VP9 0-63, MJPEG qscale 1-31); default per codec
            | "bf" N                       B-frames (h264/hevc); default 0, so decode order = display order
            | PIXFMT                       an FFmpeg pixel format the encoder takes; default yuv420p
                                           (yuvj420p for mjpeg)

Each option at most once, in any order. With a rate, output frame k shows the source frame on screen at
t_start + k / rate (the last one whose time is at or before it), so the clip window is covered exactly.

Determinism: encoders run single-threaded with the bitexact flag, scaling goes through swscale with
``accurate_rnd+bitexact`` (no CPU-specific rounding), and the SEI in which x264 writes its version and
options is removed, so a clip's bytes depend only on the source and the spec, given the same libraries.
``TranscodeSpec.encoder_settings()`` names those libraries for the build's config hash. x264 runs without
macroblock-tree rate control: with it, x264 read memory it never wrote when a clip ended inside its
lookahead, and about 1 encode in 50 differed. SVT-AV1 prints a banner to stderr past FFmpeg's log level
on every encoder it opens: the first AV1 encode sets ``SVT_LOG=1`` (errors only) unless it is set.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dsbuild.core.errors import FormatError


class TranscodeSpecError(FormatError, ValueError):
    """A transcode spec that does not parse or names something the encoder cannot do."""


@dataclass(frozen=True)
class _Encoder:
    name: str  # FFmpeg encoder
    crf: tuple[int, int, int]  # (default, min, max)
    options: tuple[tuple[str, str], ...]  # fixed encoder options (speed/quality trade-off, no threads)
    pix_fmt: str = "yuv420p"
    b_frames: bool = False


ENCODERS = {
    "h264": _Encoder("libx264", (23, 0, 51), (("preset", "medium"),), b_frames=True),
    "hevc": _Encoder("libx265", (28, 0, 51), (("preset", "fast"),), b_frames=True),
    "av1": _Encoder("libsvtav1", (35, 0, 63), (("preset", "8"),)),
    "vp9": _Encoder("libvpx-vp9", (32, 0, 63), (("deadline", "good"), ("cpu-used", "4"), ("b", "0"))),
    "mjpeg": _Encoder("mjpeg", (3, 1, 31), (), pix_fmt="yuvj420p"),
}
SCALE_FLAGS = "bicubic+accurate_rnd+full_chroma_int+bitexact"
MAX_SIDE = 8192
_SIZE = re.compile(r"(\d{1,5})x(\d{1,5})")
_RATE = re.compile(r"(\d{1,6}(?:\.\d{1,6})?|\d{1,6}/\d{1,6})fps")
_INT = re.compile(r"(gop|crf|bf)(\d{1,4})")


@dataclass(frozen=True)
class TranscodeSpec:
    """One training encoding (see the module docstring for the grammar); ``str()`` is its canonical form."""

    codec: str
    width: int | None = None
    height: int | None = None
    fps: Fraction | None = None
    gop: int = 30
    crf: int | None = None
    bf: int = 0
    pix_fmt: str | None = None

    def __post_init__(self) -> None:
        """Defaults resolved, so equal encodings compare (and hash) equal."""
        if self.crf is None:
            object.__setattr__(self, "crf", self.encoder.crf[0])
        if self.pix_fmt is None:
            object.__setattr__(self, "pix_fmt", self.encoder.pix_fmt)

    @property
    def encoder(self) -> _Encoder:
        return ENCODERS[self.codec]

    def __str__(self) -> str:
        """The canonical spec string: parses back to an equal spec."""
        parts = [self.codec]
        if self.width:
            parts.append(f"{self.width}x{self.height}")
        if self.fps:
            parts.append(
                f"{self.fps.numerator}/{self.fps.denominator}fps"
                if self.fps.denominator != 1
                else f"{self.fps.numerator}fps"
            )
        parts += [f"gop{self.gop}", f"crf{self.crf}"] + ([f"bf{self.bf}"] if self.bf else [])
        return ":".join(parts + [self.pix_fmt or self.encoder.pix_fmt])  # (resolved on creation)

    def encoder_options(self) -> dict[str, str]:
        """FFmpeg options of the encoder (besides size, rate, pixel format): what defines the bitstream."""
        enc, gop = self.encoder, str(self.gop)
        opts = dict(enc.options)
        if self.codec == "h264":
            # mbtree=0: x264's macroblock-tree rate control reads memory it never wrote when a clip ends
            # inside its lookahead; with it, 1-2% of encodes of the same frames differed (measured).
            opts.update(
                crf=str(self.crf),
                g=gop,
                keyint_min=gop,
                sc_threshold="0",
                bf=str(self.bf),
                flags="+cgop",
                threads="1",
                **{"x264-params": "mbtree=0"},
            )
        elif self.codec == "hevc":
            opts.update(
                crf=str(self.crf),
                g=gop,
                **{
                    "x265-params": (
                        f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:bframes={self.bf}:info=0:"
                        "pools=none:frame-threads=1:wpp=0:log-level=error"
                    )
                },
            )
        elif self.codec == "av1":
            opts.update(crf=str(self.crf), g=gop, **{"svtav1-params": "scd=0:lp=1"})
        elif self.codec == "vp9":
            opts.update(crf=str(self.crf), g=gop, keyint_min=gop, threads="1", **{"row-mt": "0"})
        else:  # mjpeg: every frame is a keyframe; quality is the fixed qscale
            opts.update(qscale=str(self.crf))
        return opts

    def encoder_settings(self) -> dict:
        """JSON-safe identity of the encoding: spec, encoder, options and library versions."""
        import av

        return {
            "spec": str(self),
            "encoder": self.encoder.name,
            "options": self.encoder_options(),
            "pix_fmt": self.pix_fmt,
            "scale_flags": SCALE_FLAGS,
            "pyav": av.__version__,
            "ffmpeg": av.ffmpeg_version_info,
            "libraries": {k: ".".join(map(str, v)) for k, v in sorted(av.library_versions.items())},
            "encoder_library": _library_version(self.encoder.name),
        }

    def to_json(self) -> dict:
        return {
            "spec": str(self),
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "fps": str(self.fps) if self.fps else None,
            "gop": self.gop,
            "crf": self.crf,
            "bf": self.bf,
            "pix_fmt": self.pix_fmt,
        }


def parse_transcode(text: str) -> TranscodeSpec:
    """``"h264:256x256:30fps:gop8"`` -> TranscodeSpec; TranscodeSpecError names the bad part and the grammar."""

    def bad(why: str) -> TranscodeSpecError:
        return TranscodeSpecError(f"transcode spec {text!r}: {why}")

    codec, *parts = str(text).strip().lower().split(":")
    if codec not in ENCODERS:
        raise bad(f"codec {codec!r} is not one of {', '.join(ENCODERS)}")
    enc = ENCODERS[codec]
    size: tuple[int, int] | None = None
    fps: Fraction | None = None
    pix_fmt: str | None = None
    numbers: dict[str, int] = {}  # gop, crf, bf
    given: set[str] = set()
    for part in parts:
        if m := _SIZE.fullmatch(part):
            key, size = "size", (int(m[1]), int(m[2]))
            if not all(16 <= x <= MAX_SIDE and x % 2 == 0 for x in size):
                raise bad(f"size {part} must be even, 16..{MAX_SIDE} a side")
        elif m := _RATE.fullmatch(part):
            key, fps = "fps", Fraction(m[1])
            if not 1 <= fps <= 240:
                raise bad(f"rate {part} must be 1..240 fps")
        elif m := _INT.fullmatch(part):
            key = m[1]
            numbers[key] = int(m[2])
        elif part in _pix_fmts(enc.name):
            key, pix_fmt = "pix_fmt", part
        else:
            raise bad(
                f"cannot read {part!r}; options are WxH, <rate>fps, gop<N>, crf<N>, bf<N> or a pixel "
                f"format {enc.name} takes ({', '.join(_pix_fmts(enc.name))})"
            )
        if key in given:
            raise bad(f"{part!r} sets {key} a second time")
        given.add(key)
    gop, crf, bf = numbers.get("gop", 30), numbers.get("crf"), numbers.get("bf", 0)
    if not 1 <= gop <= 1000:
        raise bad(f"gop{gop} must be 1..1000 frames")
    if crf is not None and not enc.crf[1] <= crf <= enc.crf[2]:
        raise bad(f"crf{crf} is outside {enc.crf[1]}..{enc.crf[2]} for {codec}")
    if bf and not enc.b_frames:
        raise bad(f"bf{bf} is only for h264 and hevc")
    if not 0 <= bf <= 8:
        raise bad(f"bf{bf} must be 0..8")
    w, h = size or (None, None)
    return TranscodeSpec(codec, w, h, fps, gop, crf, bf, pix_fmt)


@functools.cache
def _pix_fmts(encoder: str) -> tuple[str, ...]:
    import av

    return tuple(f.name for f in av.Codec(encoder, "w").video_formats or ())


@functools.cache
def _library_version(encoder: str) -> str | None:
    """The encoder library's own version where its bitstream states it (x264, x265), else None: the
    PyAV and FFmpeg versions then identify the bundled library."""
    if encoder not in ("libx264", "libx265"):
        return None
    spec = TranscodeSpec("h264" if encoder == "libx264" else "hevc", 64, 64)
    frame = np.zeros((64, 64, 3), np.uint8)
    data = _encode_raw(spec, [frame], info=True)
    m = re.search(rb"(x264 - core \d+(?: r\d+ \w+)?|x265 \(build \d+\) - [\w.+-]+)", data)
    return m[1].decode() if m else None


def _open_encoder(
    writer, spec: TranscodeSpec, width: int, height: int, rate: Fraction | None, time_base: Fraction, info: bool = False
):
    """An encoder stream in ``writer`` for ``spec`` at the output size and clock (``info``: let x265 write
    its version SEI, only to read the version)."""
    import av

    if spec.codec == "av1":
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints a banner to stderr past FFmpeg's log level
    stream = writer.add_stream(spec.encoder.name, rate=rate or None)
    cc = stream.codec_context
    stream.width, stream.height, stream.pix_fmt = width, height, spec.pix_fmt
    stream.time_base = cc.time_base = time_base
    cc.thread_count = 1
    cc.flags |= av.codec.context.Flags.bitexact
    opts = spec.encoder_options()
    if info and spec.codec == "hevc":
        opts["x265-params"] = opts["x265-params"].replace("info=0", "info=1")
    if spec.codec == "mjpeg":
        cc.flags |= av.codec.context.Flags.qscale
        cc.qmin = cc.qmax = int(opts.pop("qscale"))
    cc.gop_size = spec.gop
    stream.options = opts
    return stream


class _Scaler:
    """Frames to the output size and pixel format through swscale with bitexact rounding."""

    def __init__(self, spec: TranscodeSpec, width: int, height: int):
        self.spec, self.size, self._graph, self._key = spec, (width, height), None, None

    def __call__(self, frame):
        import av

        key = (frame.width, frame.height, frame.format.name)
        if key == (*self.size, self.spec.pix_fmt):
            return frame
        if key != self._key:
            g = av.filter.Graph()
            g.threads = 1
            src = g.add_buffer(
                width=frame.width,
                height=frame.height,
                format=frame.format,
                time_base=frame.time_base or Fraction(1, 1000),
            )
            scale = g.add("scale", f"{self.size[0]}:{self.size[1]}:flags={SCALE_FLAGS}")
            fmt = g.add("format", self.spec.pix_fmt)
            sink = g.add("buffersink")
            src.link_to(scale)
            scale.link_to(fmt)
            fmt.link_to(sink)
            g.configure()
            self._graph, self._key = g, key
        self._graph.push(frame)
        return self._graph.pull()


def _sei_filter(spec: TranscodeSpec, stream):
    """x264 writes its version and options into an SEI message: remove SEI NAL units (type 6)."""
    import av

    if spec.codec != "h264":
        return None
    return av.bitstream.BitStreamFilterContext("filter_units=remove_types=6", stream)


def _encode_raw(spec: TranscodeSpec, frames, info: bool = False) -> bytes:
    """Extradata and packets of ``frames`` (RGB arrays) encoded by ``spec``; for version probing."""
    import av

    from dsbuild.formats.mp4 import Mp4Writer

    if spec.width is None or spec.height is None:
        raise TranscodeSpecError(f"{spec}: encoding sample frames needs a size (WxH)")
    w = Mp4Writer()
    try:
        stream = _open_encoder(w, spec, spec.width, spec.height, Fraction(30), Fraction(1, 30), info)
        out = []
        for i, arr in enumerate([*frames, None]):
            frame = None
            if arr is not None:
                frame = av.VideoFrame.from_ndarray(arr, format="rgb24").reformat(format=spec.pix_fmt)
                frame.pts = i
            out += [bytes(p) for p in stream.encode(frame)]
        return (stream.codec_context.extradata or b"") + b"".join(out)
    finally:
        w.abort()


class ClipEncoder:
    """The video stream of one transcoded clip: add it to the writer first (before any other stream is
    written), then ``encode`` the window's decoded frames."""

    def __init__(
        self, writer, spec: TranscodeSpec, size: tuple[int, int], source_rate: Fraction | None, source_tb: Fraction
    ):
        self.writer, self.spec, self.source_tb = writer, spec, source_tb
        rate, tb = (spec.fps, 1 / spec.fps) if spec.fps else (source_rate, source_tb)
        self.stream = _open_encoder(writer, spec, size[0], size[1], rate, tb)
        self.time_base = tb  # the encoder's clock (the muxer changes the stream's once the header is out)
        self._scale = _Scaler(spec, *size)
        self._bsf = _sei_filter(spec, self.stream)

    def encode(self, frames, t_start: Fraction, t_end: Fraction) -> np.ndarray:
        """Encode ``frames`` ((seconds from the first video frame, VideoFrame) in presentation order) of
        the window [t_start, t_end); returns the output frame times (seconds from the first video frame)."""
        if self.spec.fps:
            ticks = _resampled(frames, t_start, t_end, self.spec.fps)
        else:
            ticks = ((round((t - t_start) / self.source_tb), t, f) for t, f in frames)
        times = []
        for pts, t, frame in ticks:
            out = self._scale(frame)
            out.pts, out.time_base = pts, self.time_base
            out.pict_type = 0  # let the encoder place keyframes on its fixed GOP
            self._mux(self.stream.encode(out))
            times.append(float(t))
        self._mux(self.stream.encode(None))
        if self._bsf:
            self._mux(self._bsf.filter(None))
        return np.asarray(times, np.float64)

    def _mux(self, packets) -> None:
        for p in packets:
            for q in self._bsf.filter(p) if self._bsf else [p]:
                q.stream = self.stream
                self.writer.mux(q)


def _resampled(frames, t_start: Fraction, t_end: Fraction, fps: Fraction):
    """(tick, time, frame) at t_start + k / fps for every k inside the window: the frame on screen then."""
    k, current = 0, None
    for t, frame in frames:
        while current is not None and t_start + k / fps < t_end and t_start + k / fps < t:
            yield k, t_start + k / fps, current
            k += 1
        current = frame
    while current is not None and t_start + k / fps < t_end:
        yield k, t_start + k / fps, current
        k += 1

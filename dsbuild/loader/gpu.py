"""Decoded frames to RGB batches in torch, on whatever device the planes are on: the NVDEC route's
colour conversion and resize (frames never leave GPU memory), written once and tested on CPU tensors
against swscale (docs/gpu.md states the tolerance).

- ``planes_of(frame)``: a decoded frame's planes as torch tensors, through ``__dlpack__`` (zero-copy,
  on the GPU for PyAV's CUDA frames made with ``HWAccel("cuda", is_hw_owned=True)``, on the CPU for
  software frames), with the frame's colour facts.
- ``to_rgb(planes, size, out)``: NV12 or yuv420p -> RGB uint8 [H, W, 3] written into ``out`` (a slot of
  a preallocated batch tensor), with the stream's matrix (BT.601 or BT.709) and range (limited or full)
  as swscale chooses them; at native size chroma repeated over its 2x2 block, resized each plane
  scaled by ``torch.nn.functional.interpolate`` (bilinear, antialiased when shrinking) as swscale does.
- ``DecoderCache``: one PyAV decoder per stream configuration (codec, size, pixel format, device,
  parameter sets), kept across clips and batches and released on ``close()``: opening a decoder (and on
  NVDEC its device context) per clip cost more than decoding a short clip.

On CUDA, FFmpeg decodes in torch's context for the device (made current on each decoding thread by a
first torch call there: ``IN_TORCHS_CONTEXT``), not in one of its own: FFmpeg's own use of the primary
context fails once torch holds it (incompatible flags, ENOTSUP). FFmpeg's copies into its frame pool and
torch's kernels reading those frames both run on the legacy default stream of that context, so a
surface the decoder reuses is written only after the kernels that read it.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

from dsbuild.core.errors import FormatError

# AVColorSpace values (libavutil/pixfmt.h) -> (Kr, Kb): swscale's default (unspecified) is BT.601
BT709 = (0.2126, 0.0722)
BT601 = (0.299, 0.114)
MATRICES = {1: BT709, 5: BT601, 6: BT601, 2: BT601}  # bt709, bt470bg, smpte170m, unspecified
JPEG_RANGE = 2  # AVCOL_RANGE_JPEG: full range; anything else is limited ("MPEG") as swscale takes it
FULL_RANGE_FORMATS = ("yuvj420p",)  # deprecated formats that imply full range
PLANAR = ("yuv420p", "yuvj420p")  # three planes Y, U, V
SEMI_PLANAR = ("nv12",)  # two planes Y and interleaved UV (NVDEC's output for 8-bit 4:2:0)


@dataclass(frozen=True)
class Planes:
    y: Any  # torch uint8 [H, W]
    uv: Any  # torch uint8 [H/2, W/2, 2]
    matrix: tuple[float, float]  # (Kr, Kb)
    full_range: bool


def yuv_to_rgb_matrix(matrix: tuple[float, float], full_range: bool) -> tuple[list[list[float]], list[float]]:
    """(3x3 M, offset b) with RGB (0..255) = M @ (Y, Cb, Cr) + b for 8-bit samples: the standard
    Y'CbCr equations for ``matrix`` = (Kr, Kb), limited range (Y 16..235, C 16..240) unless
    ``full_range``."""
    kr, kb = matrix
    kg = 1.0 - kr - kb
    ys, cs = (1.0, 1.0) if full_range else (255.0 / 219.0, 255.0 / 224.0)
    y0 = 0.0 if full_range else 16.0
    rv, bu = 2 * (1 - kr) * cs, 2 * (1 - kb) * cs
    gu, gv = -2 * kb * (1 - kb) / kg * cs, -2 * kr * (1 - kr) / kg * cs
    m = [[ys, 0.0, rv], [ys, gu, gv], [ys, bu, 0.0]]
    b = [-ys * y0 - 128 * row[1] - 128 * row[2] for row in m]
    return m, b


@functools.lru_cache(maxsize=32)
def _coefficients(matrix: tuple[float, float], full_range: bool, device: str):
    """``yuv_to_rgb_matrix`` as float32 tensors on ``device``, made once (not a copy to the GPU a frame)."""
    import torch

    m, b = yuv_to_rgb_matrix(matrix, full_range)
    return torch.tensor(m, dtype=torch.float32, device=device), torch.tensor(b, dtype=torch.float32, device=device)


def colour_facts(frame) -> tuple[tuple[float, float], bool]:
    """(matrix, full range) of a decoded PyAV frame, as swscale reads them from the frame."""
    fmt = frame.format.name
    return MATRICES.get(int(frame.colorspace), BT601), (
        int(frame.color_range) == JPEG_RANGE or fmt in FULL_RANGE_FORMATS
    )


def planes_of(frame) -> Planes:
    """The frame's luma and chroma planes as torch tensors (no copy: DLPack), on the frame's device.
    yuv420p's separate U and V planes are stacked into NV12's interleaved layout (one small copy)."""
    import torch

    fmt = frame.format.name
    matrix, full = colour_facts(frame)
    if fmt == "cuda" or fmt in SEMI_PLANAR:
        y, uv = (torch.from_dlpack(p.__dlpack__()) for p in frame.planes[:2])
    elif fmt in PLANAR:
        y, u, v = (torch.from_dlpack(p.__dlpack__()) for p in frame.planes[:3])
        uv = torch.stack([u, v], dim=-1)
    else:
        raise Unsupported(f"frames in pixel format {fmt} are not converted on the device (nv12 or yuv420p are)")
    if y.dtype != torch.uint8:  # NVDEC's frames of a 10-bit stream (P010)
        raise Unsupported(f"frames of {y.dtype} samples (10-bit or more) are not converted on the device (8-bit are)")
    return Planes(y, uv, matrix, full)


def to_rgb(planes: Planes, size: tuple[int, int] | None = None, out=None):
    """uint8 [H, W, 3] RGB of ``planes`` (resized to ``size`` = (height, width)), written into ``out``
    when given (a slot of a batch tensor on the same device), else returned new."""
    import torch
    import torch.nn.functional as F

    y = planes.y
    h, w = y.shape
    mat, off = _coefficients(planes.matrix, planes.full_range, str(y.device))
    if size is None or tuple(size) == (h, w):
        # chroma repeated over its 2x2 block (swscale's unscaled 4:2:0 -> RGB does the same), odd sizes cut
        uv = planes.uv.repeat_interleave(2, dim=0).repeat_interleave(2, dim=1)[:h, :w]
        ycc = torch.cat([y.unsqueeze(-1), uv], dim=-1).to(torch.float32)  # [H, W, 3]
    else:
        # as swscale scales to packed RGB: each plane on its own (bilinear, antialiased when shrinking),
        # chroma to half the output width and shared by pixel pairs (its default without full chroma
        # interpolation, which it turns on for odd widths), then the colour conversion
        out_h, out_w = size
        chroma_w = out_w if out_w % 2 else out_w // 2

        def scaled(x, to: tuple[int, int]):
            shrink = to[0] < x.shape[2] or to[1] < x.shape[3]
            return F.interpolate(x, size=to, mode="bilinear", align_corners=False, antialias=shrink)[0]

        luma = scaled(y.to(torch.float32)[None, None], (out_h, out_w))[0]
        chroma = scaled(planes.uv.to(torch.float32).permute(2, 0, 1)[None], (out_h, chroma_w)).permute(1, 2, 0)
        if chroma_w != out_w:
            chroma = chroma.repeat_interleave(2, dim=1)
        ycc = torch.cat([luma.unsqueeze(-1), chroma], dim=-1)
    rgb = ycc @ mat.T + off
    result = rgb.round_().clamp_(0, 255)
    if out is None:
        return result.to(torch.uint8)
    out.copy_(result)
    return out


# FFmpeg's CUDA device options: decode in the context current on this thread (torch's), not the primary
# context PyAV asks for with is_hw_owned (that fails once torch holds it: incompatible flags, ENOTSUP).
# Options, not flags: PyAV's HWAccel.create() passes a codec's copy the options but drops the flags.
IN_TORCHS_CONTEXT: dict[str, object] = {"current_ctx": "1", "primary_ctx": "0"}
# what NVDEC decodes and this module converts: 8-bit 4:2:0 of these codecs (AV1 on engines that have it:
# a device without it fails at open and the clip falls back)
NVDEC_CODECS = ("h264", "hevc", "av1", "vp9")
NVDEC_FORMATS = ("yuv420p", "yuvj420p", "nv12")
_bound = threading.local()  # the CUDA device whose context this thread has current


class Unsupported(FormatError):
    """A clip the device path does not take (codec, profile, pixel format): decoded on CPU instead where
    fallback is on, else this one line naming the clip and its profile."""


def check_supported(cc, fmt: str | None) -> None:
    """Raise Unsupported unless the device path takes a stream of codec context ``cc`` with frames in
    pixel format ``fmt`` (None: not known yet; NVDEC's own frames are "cuda")."""
    if cc.name not in NVDEC_CODECS or fmt not in (None, "cuda", *NVDEC_FORMATS):
        raise Unsupported(
            f"{cc.name} profile {cc.profile or 'unknown'!r} in {fmt or 'an unknown pixel format'}: the GPU path "
            f"takes 8-bit 4:2:0 {', '.join(NVDEC_CODECS)}"
        )


def bind_device(device: int) -> None:
    """Make torch's context for CUDA ``device`` current on this thread (once per thread), for FFmpeg
    to decode in (``IN_TORCHS_CONTEXT``)."""
    if getattr(_bound, "device", None) != device:
        import torch

        torch.cuda.set_device(device)
        torch.cuda.synchronize(device)  # the runtime makes the device's primary context current here
        _bound.device = device


@dataclass(frozen=True)
class StreamConfig:
    codec: str
    width: int
    height: int
    pix_fmt: str
    device: int | None  # CUDA device of an NVDEC decoder, None on CPU
    extradata: bytes  # the parameter sets (SPS/PPS): sessions encoded with other settings differ here


MAX_DECODERS = 8  # kept per thread, least recently used dropped: a shuffle interleaves sessions' clips


class DecoderCache:
    """One decoder per stream configuration per thread (a decoder is not thread-safe; the loader's
    threads each hold their own), reused across clips: ``get(stream, device)`` returns the cached
    codec context for the stream's configuration, flushed, or opens one (at most ``MAX_DECODERS`` per
    thread). ``opened`` counts openings."""

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.Lock()
        self.opened = 0

    def get(self, stream, device: int | None = None):
        """A decoder for ``stream`` (a PyAV video stream of an open container), with the stream's
        extradata (SPS/PPS), ready for the first packet of a clip."""
        from collections import OrderedDict

        cc = stream.codec_context
        key = StreamConfig(
            cc.name, cc.width, cc.height, cc.format.name if cc.format else "", device, cc.extradata or b""
        )
        cache = getattr(self._local, "decoders", None)
        if cache is None:
            cache = self._local.decoders = OrderedDict()
        ctx = cache.get(key)
        if ctx is not None:
            cache.move_to_end(key)
            ctx.flush_buffers()
            return ctx
        while len(cache) >= MAX_DECODERS:
            cache.popitem(last=False)  # (PyAV frees a codec context, and its device context, with its last reference)
        ctx = cache[key] = self._open(cc, device)
        with self._lock:
            self.opened += 1
        return ctx

    @staticmethod
    def _open(cc, device: int | None):
        """A decoder for codec context ``cc``'s stream; on CUDA ``device``, in torch's context made current
        on this thread, frames left in device memory. FFmpeg decodes a codec it has no CUDA config for
        in software without a word: that is Unsupported here (the clip falls back, counted); a device
        FFmpeg cannot use at all is MissingDevice, not a fault of each clip."""
        import av
        from av.codec.hwaccel import HWAccel

        from dsbuild.core.errors import MissingDevice

        if device is None:
            ctx = av.CodecContext.create(cc.name, "r")
            ctx.thread_type = "AUTO"
        else:
            try:
                bind_device(device)
                hw = HWAccel(
                    "cuda",
                    device=str(device),
                    allow_software_fallback=False,
                    options=dict(IN_TORCHS_CONTEXT),
                    is_hw_owned=True,
                )
                ctx = av.CodecContext.create(cc.name, "r", hwaccel=hw)
            except Exception as e:  # torch without CUDA raises AttributeError/AssertionError, FFmpeg its own
                raise MissingDevice(
                    f"NVDEC is unavailable: FFmpeg could not use CUDA device {device} ({e})",
                    hint="decode_backend='pyav' decodes on CPU",
                ) from None
            if not ctx.is_hwaccel():
                raise Unsupported(f"{cc.name}: this FFmpeg has no CUDA decoder for it")
        ctx.extradata = cc.extradata
        ctx.width, ctx.height = cc.width, cc.height
        ctx.open()
        return ctx

    def close(self) -> None:
        """Release every decoder (and NVDEC device context) this cache opened: PyAV frees a codec context
        with its last reference; the cache drops its own (every thread's)."""
        with self._lock:
            self._local = threading.local()

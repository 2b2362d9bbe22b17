"""PyAV decoding of only the frames a sample delivers.

The clip's packets are demuxed first (cheap: no decoding), which gives every frame's presentation
time; decoding then starts at the last keyframe at or before the first wanted frame — a crop in the
middle of a clip never decodes from frame 0 — and stops once the last wanted frame is out.
With ``stride >= 2`` the decoder is told to skip non-reference frames (``skip_frame="NONREF"``):
streams whose non-reference frames are exactly the ones a stride drops (IPBPB... with ``stride=2``)
decode about half the frames. If a frame the sample needs was skipped, the clip is decoded again
without skipping, so the result is always exactly the wanted frames.

``thread_type="AUTO"`` lets FFmpeg use frame threads: on captures with one slice per frame (most real
encoders) the default SLICE threading uses one core, AUTO is ~1.8x faster (docs/performance.md).

With ``gpu=N`` the same code decodes on NVDEC of CUDA device N through FFmpeg's CUDA hwaccel, with no
silent software fallback: FFmpeg still parses the bitstream, so keyframe starts and non-reference
skipping work the same, and frames are downloaded to host memory for the same swscale conversion.
FFmpeg works in torch's context for that device (made current on each decoding thread by a first torch
call there), not in one of its own: a context per clip would cost more than decoding a short clip, and
FFmpeg's own use of the primary context fails once torch holds it (incompatible flags, ENOTSUP).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Sequence

import numpy as np

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.formats.probe import SWSCALE_THREADS, open_clip

MEMORY_SHARE = 0.5  # of the memory the process may use: the default bound of one frames batch
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def usable_memory() -> int:
    """Bytes this process may use: physical memory, or its cgroup's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            with open(path) as f:
                value = f.read(64).strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def check_frames_memory(options, sources: Sequence) -> None:
    """Refuse, before anything is allocated, a frames loader whose largest batch would need more than
    ``options.max_batch_bytes`` (default: ``MEMORY_SHARE`` of ``usable_memory()``): one UsageError line
    naming the clip, the bytes its batch needs and the options that lower them. The largest batch is
    ``batch_size`` clips padded to its longest: ``batch_size`` x the largest (frames x height x width x 3)
    any clip decodes to, as the index gives it (a shuffle puts the longest clip in some batch; packing
    makes every batch ``pack_frames`` long). A long single-GOP clip (a screen recording with one
    keyframe, kept whole by convert) would otherwise be a MemoryError, or the OOM killer."""
    from dsbuild.loader.crop import kept_frames

    o = options
    if o.decode != "frames":
        return
    limit = o.max_batch_bytes or int(MEMORY_SHARE * usable_memory())
    worst = None
    for src in sources:
        frames = kept_frames(src.frames, o.frame_stride, o.clip_frames, o.max_frames)
        if o.pack_frames:
            frames = np.full_like(frames, o.pack_frames)
        h, w = o.resize if o.resize else (src.height.astype(np.int64), src.width.astype(np.int64))
        need = frames.astype(np.int64) * h * w * 3
        if len(need):
            i = int(np.argmax(need))
            if worst is None or need[i] > worst[0]:
                worst = (
                    int(need[i]),
                    src.keys[i],
                    int(frames[i]),
                    int(np.broadcast_to(h, need.shape)[i]),
                    int(np.broadcast_to(w, need.shape)[i]),
                )
    if worst is None or worst[0] * o.batch_size <= limit:
        return
    clip, key, frames, h, w = worst
    said = (
        f"max_batch_bytes={o.max_batch_bytes}"
        if o.max_batch_bytes
        else f"half of the {_gb(limit * 2)} this process may use"
    )
    raise UsageError(
        f"clip {str(key)[:80]}: a frames batch of it needs {_gb(clip * o.batch_size)} ({frames} frames of "
        f"{h}x{w}x3 x batch_size {o.batch_size}), over {_gb(limit)} ({said}); lower it with max_frames= or "
        f"clip_frames= (a crop), frame_stride=, resize=(height, width) or batch_size=, or raise max_batch_bytes"
    )


def start_packet(keyframes: list[tuple[int, bool]], first_pts: int) -> int:
    """Index (decode order) of the packet to start decoding at for a frame at ``first_pts``: the last
    keyframe at or before it. ``keyframes`` is (pts, is_keyframe) per packet in decode order."""
    return max((k for k, (pts, key) in enumerate(keyframes) if key and pts <= first_pts), default=0)


def decode_pyav(
    data,
    indices: np.ndarray,
    size: tuple[int, int] | None = None,
    skip_nonref: bool = False,
    counts: dict | None = None,
    alloc=np.empty,
    gpu: int | None = None,
) -> np.ndarray:
    """uint8 [len(indices), H, W, 3]: the clip's frames at ``indices`` (presentation order), resized to
    ``size`` = (height, width) by swscale, in an array from ``alloc(shape, dtype)``. ``counts["decoded"]``
    (if given) grows by the frames the decoder produced, ``counts["skipped_packets"]`` by the packets
    before the start keyframe."""
    import av

    try:
        with _open(data, gpu) as container:
            stream = container.streams.video[0]
            packets = [p for p in container.demux(stream) if p.size and p.pts is not None]
            pts = sorted(p.pts for p in packets)
            if not len(indices):
                raise FormatError("no frames asked for")
            if int(indices[-1]) >= len(pts):
                raise FormatError(f"video holds {len(pts)} frames, frame {int(indices[-1])} was asked for")
            wanted = {pts[int(i)]: k for k, i in enumerate(indices)}
            start = start_packet([(p.pts, p.is_keyframe) for p in packets], pts[int(indices[0])])
            if gpu is None:
                stream.codec_context.thread_type = "AUTO"
            got, decoded = _decode(stream, packets[start:], wanted, size, skip_nonref, alloc)
            if got is None and skip_nonref:
                got, more = _decode(stream, packets[start:], wanted, size, False, alloc)
                decoded += more
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise FormatError(f"video does not decode ({e})") from None
    if counts is not None:
        counts["decoded"] = counts.get("decoded", 0) + decoded
        counts["skipped_packets"] = counts.get("skipped_packets", 0) + start
    if got is None:
        raise FormatError(f"video decoded fewer frames than its {len(pts)} packets")
    return got


CURRENT_CONTEXT = 2  # AV_CUDA_USE_CURRENT_CONTEXT (libavutil/hwcontext_cuda.h)
_bound = threading.local()  # the CUDA device whose context this thread has current


def _open(data, gpu: int | None):
    """The clip as a PyAV container, decoding on NVDEC of CUDA device ``gpu`` when given. A device FFmpeg
    cannot use is a UsageError naming the cause, not a "video does not decode" about a clip that decodes
    on CPU."""
    import av

    if gpu is None:
        return open_clip(data)
    from av.codec.hwaccel import HWAccel

    try:
        if getattr(_bound, "device", None) != gpu:
            import torch

            torch.cuda.set_device(gpu)
            torch.cuda.synchronize(gpu)  # the runtime makes the device's primary context current on this thread
            _bound.device = gpu
        return av.open(io.BytesIO(data), hwaccel=HWAccel("cuda", allow_software_fallback=False, flags=CURRENT_CONTEXT))
    except Exception as e:  # torch without CUDA raises AttributeError/AssertionError, FFmpeg its own errors
        open_clip(data).close()  # raises (-> FormatError) if the clip itself is bad
        raise UsageError(
            f"NVDEC is unavailable: FFmpeg could not use CUDA device {gpu} ({e})",
            hint="decode_backend='pyav' decodes on CPU",
        ) from None


def _decode(
    stream, packets: list, wanted: dict[int, int], size, skip_nonref: bool, alloc
) -> tuple[np.ndarray | None, int]:
    """(frames at the ``wanted`` pts (-> output slot) decoded from ``packets`` or None if any is
    missing, frames decoded)."""
    from av.video.reformatter import VideoReformatter

    ctx = stream.codec_context
    ctx.flush_buffers()
    ctx.skip_frame = "NONREF" if skip_nonref else "DEFAULT"
    # One scaler for the clip: ``frame.to_ndarray(format=...)`` builds a new swscale context for every
    # frame, which cost more than the conversion itself (2.2-2.4x the frames/s with one per clip); one
    # swscale thread per conversion: the loader's own threads are the parallelism
    rgb = VideoReformatter()
    kw = {"format": "rgb24", "threads": SWSCALE_THREADS}
    if size is not None:
        kw.update(width=size[1], height=size[0])
    out = None
    left = len(wanted)
    decoded = 0
    for packet in [*packets, None]:
        for frame in ctx.decode(packet):
            decoded += 1
            slot = wanted.get(frame.pts)
            if slot is None:
                continue
            arr = rgb.reformat(frame, **kw).to_ndarray()
            if out is None:
                out = alloc((len(wanted), *arr.shape), np.uint8)
            out[slot] = arr
            left -= 1
        if left == 0:
            return out, decoded
    return None, decoded


def decode_torchcodec(data, indices: np.ndarray, size: tuple[int, int] | None, device: str) -> np.ndarray:
    """The same frames through torchcodec (FFmpeg on CPU, NVDEC with ``device="cuda"``). Resizing is
    bilinear with antialias in torch (not swscale): same shapes as PyAV, not the same bytes."""
    import torch
    from torchcodec.decoders import VideoDecoder

    try:
        decoder = VideoDecoder(bytes(data), device=device, dimension_order="NHWC", seek_mode="exact")
        frames = decoder.get_frames_at(indices=[int(i) for i in indices]).data
    except (RuntimeError, ValueError, IndexError) as e:
        raise FormatError(f"video does not decode with torchcodec ({e})") from None
    if size is not None:
        x = frames.permute(0, 3, 1, 2).float()
        x = torch.nn.functional.interpolate(x, size=tuple(size), mode="bilinear", antialias=True)
        frames = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return frames.contiguous().cpu().numpy()

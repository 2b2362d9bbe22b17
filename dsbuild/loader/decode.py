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

``decode_device`` is the NVDEC route (``decode_backend="nvdec"``): the same packets decoded by a decoder
kept per stream configuration (``gpu.DecoderCache``) with frames left in GPU memory
(``HWAccel("cuda", is_hw_owned=True)``), converted to RGB and resized in torch into a batch tensor on
the device (``gpu.to_rgb``). Without a device it decodes on CPU threads through the very same code, so
it is tested everywhere (``dsbuild.loader.gpu`` says how FFmpeg shares torch's CUDA context).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

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


def default_max_batch_bytes() -> int:
    """The frames batch bound when ``max_batch_bytes`` is None: ``MEMORY_SHARE`` of ``usable_memory()``
    (``validate``'s clip_memory check warns against the same bound)."""
    return int(MEMORY_SHARE * usable_memory())


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
    limit = o.max_batch_bytes or default_max_batch_bytes()
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
    threads: int = 0,
) -> np.ndarray:
    """uint8 [len(indices), H, W, 3]: the clip's frames at ``indices`` (presentation order), resized to
    ``size`` = (height, width) by swscale, in an array from ``alloc(shape, dtype)``. ``counts["decoded"]``
    (if given) grows by the frames the decoder produced, ``counts["skipped_packets"]`` by the packets
    before the start keyframe. ``threads``: FFmpeg's decoding threads (``probe.decoder_threads``; 0 is
    its own choice)."""
    from av.video.reformatter import VideoReformatter

    # One scaler for the clip: ``frame.to_ndarray(format=...)`` builds a new swscale context for every
    # frame, which cost more than the conversion itself (2.2-2.4x the frames/s with one per clip); one
    # swscale thread per conversion: the loader's own threads are the parallelism
    rgb = VideoReformatter()
    kw: dict[str, Any] = {"format": "rgb24", "threads": SWSCALE_THREADS}
    if size is not None:
        kw.update(width=size[1], height=size[0])
    out: list = []

    def take(frame, slot: int, n: int) -> None:
        arr = rgb.reformat(frame, **kw).to_ndarray()
        if not out:
            out.append(alloc((n, *arr.shape), np.uint8))
        out[0][slot] = arr

    def decoder(stream):
        stream.codec_context.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        return stream.codec_context

    decode_clip(data, indices, decoder, take, skip_nonref, counts)
    return out[0]


def decode_clip(
    data, indices: np.ndarray, decoder, take, skip_nonref: bool = False, counts: dict | None = None
) -> None:
    """Decode the clip's frames at ``indices`` (presentation order) with ``decoder(stream)`` (a codec
    context), calling ``take(frame, slot, n)`` for each in output slot order of arrival. Decoding starts
    at the last keyframe at or before the first wanted frame; with ``skip_nonref`` non-reference frames
    are skipped, and the clip is decoded again without skipping if a wanted frame was among them."""
    import av

    if not len(indices):
        raise FormatError("no frames asked for")
    try:
        with open_clip(data) as container:
            stream = container.streams.video[0]
            packets = [p for p in container.demux(stream) if p.size and p.pts is not None]
            pts = sorted(p.pts for p in packets)
            if int(indices[-1]) >= len(pts):
                raise FormatError(f"video holds {len(pts)} frames, frame {int(indices[-1])} was asked for")
            wanted = {pts[int(i)]: k for k, i in enumerate(indices)}
            start = start_packet([(p.pts, p.is_keyframe) for p in packets], pts[int(indices[0])])
            ctx = decoder(stream)
            complete, decoded = _decode(ctx, packets[start:], wanted, skip_nonref, take)
            if not complete and skip_nonref:
                complete, more = _decode(ctx, packets[start:], wanted, False, take)
                decoded += more
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise FormatError(f"video does not decode ({e})") from None
    if counts is not None:
        counts["decoded"] = counts.get("decoded", 0) + decoded
        counts["skipped_packets"] = counts.get("skipped_packets", 0) + start
    if not complete:
        raise FormatError(f"video decoded fewer frames than its {len(pts)} packets")


def _decode(ctx, packets: list, wanted: dict[int, int], skip_nonref: bool, take) -> tuple[bool, int]:
    """(every ``wanted`` pts (-> output slot) decoded from ``packets`` and taken, frames decoded)."""
    ctx.flush_buffers()
    ctx.skip_frame = "NONREF" if skip_nonref else "DEFAULT"
    left = len(wanted)
    decoded = 0
    for packet in [*packets, None]:
        for frame in ctx.decode(packet):
            decoded += 1
            slot = wanted.get(frame.pts)
            if slot is None:
                continue
            take(frame, slot, len(wanted))
            left -= 1
        if left == 0:
            return True, decoded
    return False, decoded


def decode_device(
    data,
    indices: np.ndarray,
    size: tuple[int, int] | None,
    decoders,
    device: int | None = None,
    skip_nonref: bool = False,
    counts: dict | None = None,
    out=None,
):
    """torch uint8 [len(indices), H, W, 3] on CUDA device ``device`` (CPU when None): the clip's frames at
    ``indices`` decoded by the cached decoder of its stream configuration (``decoders``: a
    ``gpu.DecoderCache``), frames kept on the device, converted and resized by ``gpu.to_rgb`` into
    ``out`` (a slot range of a batch tensor) when it has their shape, else into a new tensor. A clip whose
    codec, profile or pixel format the device path does not take raises ``gpu.Unsupported`` naming it (the
    caller falls back to the CPU)."""
    import torch

    from dsbuild.loader import gpu

    state: dict[str, Any] = {"out": out, "stream": None}  # the stream's codec context until its first frame is checked

    def decoder(stream):
        cc = stream.codec_context
        gpu.check_supported(cc, cc.format.name if cc.format else None)  # (unknown until decoded if unprobed)
        state["stream"] = cc
        return decoders.get(stream, device)

    def take(frame, slot: int, n: int) -> None:
        if state["stream"] is not None:
            gpu.check_supported(state["stream"], frame.format.name)
            state["stream"] = None
        planes = gpu.planes_of(frame)
        if not state.get("fits"):  # (the first frame: the clip's shape is known now)
            h, w = size if size is not None else tuple(planes.y.shape)
            given = state["out"]
            if given is None or tuple(given.shape) != (n, h, w, 3) or given.device != planes.y.device:
                state["out"] = torch.empty((n, h, w, 3), dtype=torch.uint8, device=planes.y.device)
            state["fits"] = True
        gpu.to_rgb(planes, size, state["out"][slot])

    decode_clip(data, indices, decoder, take, skip_nonref, counts)
    return state["out"]


def decode_nvdec(
    data,
    indices: np.ndarray,
    size: tuple[int, int] | None,
    decoders,
    device: int | None,
    *,
    key: str,
    fallback: bool,
    skip_nonref: bool = False,
    counts: dict | None = None,
    alloc=np.empty,
    out=None,
):
    """torch uint8 [len(indices), H, W, 3] on the device: ``decode_device``'s frames (written into ``out``,
    a row of the device batch, when it has their shape), or where the device path does not take the clip
    (``gpu.Unsupported``, or NVDEC failing on a clip the CPU decodes) ``decode_pyav``'s (in ``alloc``'s
    host array) copied into ``out`` or onto the device, with ``counts["fallback"]`` grown by one; with
    ``fallback`` off that is one FormatError line naming the clip ``key`` and its profile."""
    import torch

    from dsbuild.loader.gpu import Unsupported

    try:
        return decode_device(data, indices, size, decoders, device, skip_nonref, counts, out)
    except Unsupported as e:
        why, frames = str(e), None
    except FormatError as e:  # NVDEC refused a profile the parser let through, or the clip is bad
        frames = decode_pyav(data, indices, size, skip_nonref, counts, alloc)  # (a bad clip raises here)
        why = f"NVDEC failed on it ({e})"
    if not fallback:
        raise Unsupported(
            f"clip {key}: {why}", hint="decode_fallback=True decodes such clips on CPU; decode_backend='pyav' all"
        )
    if counts is not None:
        counts["fallback"] = counts.get("fallback", 0) + 1
    if frames is None:
        frames = decode_pyav(data, indices, size, skip_nonref, counts, alloc)
    host = torch.from_numpy(frames)
    if out is not None and tuple(out.shape) == tuple(host.shape):
        return out.copy_(host)
    return host.to("cpu" if device is None else f"cuda:{device}")  # (on CPU the pool's array, held by it)


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

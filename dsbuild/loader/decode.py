"""PyAV decoding of only the frames a sample delivers.

The clip's packets are demuxed first (cheap: no decoding), which gives every frame's presentation
time; decoding then starts at the last keyframe at or before the first wanted frame — a crop in the
middle of a clip never decodes from frame 0 — and stops once the last wanted frame is out.
With ``stride >= 2`` the decoder is told to skip non-reference frames (``skip_frame="NONREF"``):
streams whose non-reference frames are exactly the ones a stride drops (IPBPB... with ``stride=2``)
decode about half the frames. If a frame the sample needs was skipped, the clip is decoded again
without skipping, so the result is always exactly the wanted frames.

``thread_type="AUTO"`` lets FFmpeg use frame threads: on captures with one slice per frame (most real
encoders) the default SLICE threading uses one core, AUTO is ~1.8x faster (DESIGN.md section 7).
"""

from __future__ import annotations

import io

import numpy as np

from dsbuild.core.errors import FormatError


def decode_pyav(data, indices: np.ndarray, size: tuple[int, int] | None = None,
                skip_nonref: bool = False) -> np.ndarray:
    """uint8 [len(indices), H, W, 3]: the clip's frames at ``indices`` (presentation order), resized to
    ``size`` = (height, width) by swscale."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            packets = [p for p in container.demux(stream) if p.size and p.pts is not None]
            pts = sorted(p.pts for p in packets)
            if not len(indices):
                raise FormatError("no frames asked for")
            if int(indices[-1]) >= len(pts):
                raise FormatError(f"video holds {len(pts)} frames, frame {int(indices[-1])} was asked for")
            wanted = {pts[int(i)]: k for k, i in enumerate(indices)}
            first = pts[int(indices[0])]
            start = max((k for k, p in enumerate(packets) if p.is_keyframe and p.pts <= first), default=0)
            stream.codec_context.thread_type = "AUTO"
            got = _decode(stream, packets[start:], wanted, size, skip_nonref)
            if got is None and skip_nonref:
                got = _decode(stream, packets[start:], wanted, size, False)
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise FormatError(f"video does not decode ({e})") from None
    if got is None:
        raise FormatError(f"video decoded fewer frames than its {len(pts)} packets")
    return got


def _decode(stream, packets: list, wanted: dict[int, int], size, skip_nonref: bool) -> np.ndarray | None:
    """Frames at the ``wanted`` pts (-> output slot) decoded from ``packets``; None if any is missing."""
    ctx = stream.codec_context
    ctx.flush_buffers()
    ctx.skip_frame = "NONREF" if skip_nonref else "DEFAULT"
    out = None
    left = len(wanted)
    for packet in [*packets, None]:
        for frame in ctx.decode(packet):
            slot = wanted.get(frame.pts)
            if slot is None:
                continue
            if size is not None:
                arr = frame.to_ndarray(format="rgb24", width=size[1], height=size[0])
            else:
                arr = frame.to_ndarray(format="rgb24")
            if out is None:
                out = np.empty((len(wanted), *arr.shape), dtype=np.uint8)
            out[slot] = arr
            left -= 1
        if left == 0:
            return out
    return None


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

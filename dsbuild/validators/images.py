"""Clip thumbnail strips for the self-contained HTML report: frames decoded and encoded as JPEG with PyAV."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dsbuild.formats.probe import open_clip

THUMB_WIDTH = 120  # px per frame: big enough to recognise a scene, small enough to inline dozens as base64
STRIP_FRAMES = 4  # frames per clip, first to last: a frozen, black or broken clip shows at a glance


def jpeg(image: np.ndarray) -> bytes:
    """uint8 [H, W, 3] RGB -> JPEG bytes (PyAV's MJPEG encoder; odd sizes are padded to even)."""
    import av

    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"expected an [H, W, 3] image, got {list(image.shape)}")
    image = np.pad(image, ((0, image.shape[0] % 2), (0, image.shape[1] % 2), (0, 0)), mode="edge")
    cc = av.CodecContext.create("mjpeg", "w")
    cc.width, cc.height, cc.pix_fmt, cc.time_base = image.shape[1], image.shape[0], "yuvj420p", Fraction(1, 25)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuvj420p")
    return b"".join(bytes(p) for p in [*cc.encode(frame), *cc.encode(None)])


def strip(video: bytes, frames: int, count: int = STRIP_FRAMES, width: int = THUMB_WIDTH) -> bytes | None:
    """JPEG of ``count`` frames spread over a clip of ``frames`` frames, side by side (decoded with PyAV);
    None when no frame decodes. Frames that exist before a decode error still show."""
    import av

    want = set(np.linspace(0, max(frames - 1, 0), count).round().astype(int).tolist())
    tiles = []
    try:
        with open_clip(video) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            for i, f in enumerate(c.decode(stream)):
                if i in want:
                    w = min(width, f.width)
                    h = max(1, round(w * f.height / f.width))
                    tiles.append(f.reformat(width=w, height=h, format="rgb24").to_ndarray())
                if i >= max(want):
                    break
    except (av.error.FFmpegError, OSError, ValueError, IndexError):
        pass
    if not tiles:
        return None
    h = max(t.shape[0] for t in tiles)
    gap = np.full((h, 2, 3), 255, np.uint8)
    padded = [np.pad(t, ((0, h - t.shape[0]), (0, 0), (0, 0)), constant_values=255) for t in tiles]
    return jpeg(np.concatenate([x for t in padded for x in (t, gap)][:-1], axis=1))

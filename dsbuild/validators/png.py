"""A minimal PNG encoder (zlib + struct) and clip thumbnail strips, for the self-contained HTML report."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

THUMB_WIDTH = 120  # px per frame: big enough to recognise a scene, small enough to inline dozens as base64
STRIP_FRAMES = 4  # frames per clip, first to last: a frozen, black or broken clip shows at a glance


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png_rgb(image: np.ndarray) -> bytes:
    """uint8 [H, W, 3] RGB -> PNG bytes (8-bit truecolor, filter 0 on every row)."""
    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"expected an [H, W, 3] image, got {list(image.shape)}")
    h, w, _ = image.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), image.reshape(h, w * 3)], axis=1).tobytes()
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b""))


def strip(video: bytes, frames: int, count: int = STRIP_FRAMES, width: int = THUMB_WIDTH) -> bytes | None:
    """PNG of ``count`` frames spread over a clip of ``frames`` frames, side by side (decoded with PyAV);
    None when no frame decodes. Frames that exist before a decode error still show."""
    import av

    want = set(np.linspace(0, max(frames - 1, 0), count).round().astype(int).tolist())
    tiles = []
    try:
        with av.open(io.BytesIO(video), metadata_errors="ignore") as c:
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
    return png_rgb(np.concatenate([x for t in padded for x in (t, gap)][:-1], axis=1))

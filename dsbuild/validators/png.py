"""A minimal PNG encoder (zlib + struct) and clip thumbnails, for the self-contained HTML report."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

THUMB_WIDTH = 160  # px: big enough to recognise a scene, small enough to inline dozens as base64


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


def thumbnail(video: bytes, width: int = THUMB_WIDTH) -> bytes | None:
    """PNG of a clip's 9th frame (or its last one, if shorter): past any fade-in; None when nothing decodes."""
    import av

    try:
        with av.open(io.BytesIO(video), metadata_errors="ignore") as c:
            stream = c.streams.video[0]
            frame = None
            for i, f in enumerate(c.decode(stream)):
                frame = f
                if i >= 8:
                    break
            if frame is None:
                return None
            w = min(width, frame.width)
            h = max(1, round(w * frame.height / frame.width))
            return png_rgb(frame.reformat(width=w, height=h, format="rgb24").to_ndarray())
    except (av.error.FFmpegError, OSError, ValueError, IndexError):
        return None

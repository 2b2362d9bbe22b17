"""Turning a raw sample into arrays: PyAV decode with stride/resize, and controls on a shared vocabulary.

``thread_type="AUTO"`` lets FFmpeg use frame threads: on captures with one slice per frame (most real
encoders) the default SLICE threading uses one core, AUTO is ~1.8x faster (DESIGN.md section 7).
"""

from __future__ import annotations

import io
import json

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.formats.sample import VIDEO_EXTS, npy_load
from dsbuild.loader.source import RawSample


def decode_frames(data: bytes, stride: int = 1, size: tuple[int, int] | None = None,
                  limit: int | None = None) -> np.ndarray:
    """uint8 [T, H, W, 3]: every ``stride``-th frame, resized to ``size`` = (height, width) by swscale."""
    import av

    out = []
    try:
        with av.open(io.BytesIO(data)) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            for i, frame in enumerate(c.decode(stream)):
                if i % stride:
                    continue
                if size is not None:
                    frame = frame.reformat(width=size[1], height=size[0], format="rgb24")
                out.append(frame.to_ndarray(format="rgb24"))
                if limit is not None and len(out) >= limit:
                    break
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise FormatError(f"video does not decode ({e})") from None
    if not out:
        raise FormatError("video decoded to no frames")
    return np.stack(out)


def remap_columns(arr: np.ndarray, names: list[str], vocabulary: list[str]) -> np.ndarray:
    """Put a sample's columns (its session's controls/channels) on the dataset's vocabulary (0 elsewhere)."""
    out = np.zeros((arr.shape[0], len(vocabulary)), dtype=np.float32)
    col = {n: j for j, n in enumerate(vocabulary)}
    for i, name in enumerate(names):
        if name in col:
            out[:, col[name]] = arr[:, i]
    return out


def sample_arrays(raw: RawSample, controls: list[str], channels: list[str], *, decode: str, stride: int,
                  size: tuple[int, int] | None, max_frames: int | None = None) -> dict:
    """One sample as arrays: frames (or video bytes), actions, telemetry, timestamps, all strided alike."""
    try:
        meta = json.loads(bytes(raw.members["json"]))
        video = next(raw.members[e] for e in VIDEO_EXTS if e in raw.members)
        actions = npy_load(raw.members["actions.npy"])
        telemetry = npy_load(raw.members["telemetry.npy"])
        timestamps = npy_load(raw.members["timestamps.npy"])
    except (KeyError, StopIteration, ValueError) as e:
        raise FormatError(f"{raw.key}: incomplete sample ({e})") from None
    sl = slice(0, max_frames * stride if max_frames else None, stride)
    out = {
        "key": raw.key,
        "actions": remap_columns(actions[sl], meta.get("controls", []), controls),
        "telemetry": remap_columns(telemetry[sl], meta.get("telemetry_channels", []), channels),
        "timestamps": timestamps[sl],
    }
    if decode == "frames":
        frames = decode_frames(video, stride, size, limit=len(out["timestamps"]))
        if len(frames) != len(out["timestamps"]):
            raise FormatError(f"{raw.key}: decoded {len(frames)} frames, metadata says {len(out['timestamps'])}")
        out["frames"] = frames
    else:
        out["video"] = video
    return out

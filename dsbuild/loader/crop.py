"""Which frames of a clip a sample delivers: stride, a cut after ``max_frames``, a seeded random crop of
``clip_frames``. Pure arithmetic, so plans know every sample's length from the index alone, and a
crop is a function of (seed, epoch, sample): the same after any resume, on any rank. A sample is named by
(version id, key), so two sources that share keys (two datasets with the same session names) get
their own draws."""

from __future__ import annotations

import numpy as np

from dsbuild.loader.permutation import derive_key


def kept_frames(frames, stride: int, clip_frames: int | None, max_frames: int | None):
    """Frames delivered from clips of ``frames`` frames (int or array): ceil(frames / stride), capped.
    A scalar (one sample, on the loader's hot path) is computed without numpy calls."""
    if isinstance(frames, (int, np.integer)):
        n = -(-int(frames) // stride)
        for cap in (clip_frames, max_frames):
            if cap is not None and cap < n:
                n = cap
        return n
    kept = -(-np.asarray(frames, dtype=np.int64) // stride)
    for cap in (clip_frames, max_frames):
        if cap is not None:
            kept = np.minimum(kept, cap)
    return kept


def cut_by_max_frames(frames: int, stride: int, clip_frames: int | None, max_frames: int | None) -> bool:
    """Whether ``max_frames`` cuts a clip of ``frames`` frames (a crop to ``clip_frames`` is asked for,
    not a cut): what ``stats()["truncated"]`` counts besides packing."""
    return max_frames is not None and max_frames < min(-(-frames // stride), clip_frames or max_frames + 1)


def crop_start(frames: int, stride: int, count: int, seed: int, epoch: int, sample: tuple[str, str]) -> int:
    """First frame of a random crop of ``count`` frames (every ``stride``-th) out of ``frames``: uniform
    over the positions where the crop fits, keyed by (seed, epoch, sample's (version id, key))."""
    room = frames - ((count - 1) * stride + 1)
    if room <= 0:
        return 0
    return derive_key(seed, "crop", epoch, *sample) % (room + 1)


def frame_window(
    frames: int,
    stride: int,
    clip_frames: int | None,
    max_frames: int | None,
    seed: int,
    epoch: int,
    sample: tuple[str, str],
) -> slice:
    """The frames (of the clip's, in order) a sample delivers this epoch, as a slice: it cuts the sample's
    arrays as views, and ``frame_indices`` spells it out for decoding."""
    count = kept_frames(frames, stride, clip_frames, max_frames)
    start = crop_start(frames, stride, count, seed, epoch, sample) if clip_frames is not None else 0
    return slice(start, start + (count - 1) * stride + 1, stride)


def frame_indices(window: slice) -> np.ndarray:
    return np.arange(window.start, window.stop, window.step, dtype=np.int64)

"""Samples -> one batch of arrays. Frames of different lengths are padded (with ``lengths``); packed
items concatenate their samples along time with ``segment_ids`` and ``cu_seqlens`` for attention."""

from __future__ import annotations

import numpy as np

from dsbuild.core.errors import FormatError


def _pad(arrays: list[np.ndarray], length: int) -> np.ndarray:
    out = np.zeros((len(arrays), length, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a[:length]
    return out


def _same_frame_shape(items: list[list[dict]]) -> None:
    shapes = {s["frames"].shape[1:] for item in items for s in item if "frames" in s}
    if len(shapes) > 1:
        raise FormatError(f"batch mixes frame shapes {sorted(shapes)}: use bucket_by='resolution' or resize=")


def collate(items: list[list[dict]], pack_frames: int | None) -> tuple[dict, dict]:
    """(batch, counters). Each item is one sample, or several packed into ``pack_frames`` frames."""
    _same_frame_shape(items)
    fields = [f for f in ("frames", "actions", "telemetry", "timestamps") if f in items[0][0]]
    batch: dict = {"keys": [[s["key"] for s in item] if pack_frames else item[0]["key"] for item in items]}
    counters = {"frames": 0, "padding": 0, "truncated": 0}
    if pack_frames:
        seg = np.full((len(items), pack_frames), -1, dtype=np.int32)
        cu = []
        joined = {f: [] for f in fields}
        for i, item in enumerate(items):
            lens = [min(len(s["timestamps"]), pack_frames) for s in item]
            counters["truncated"] += sum(len(s["timestamps"]) > pack_frames for s in item)
            bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            cu.append(bounds)
            for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
                seg[i, a:b] = j
            for f in fields:
                joined[f].append(np.concatenate([s[f][:n] for s, n in zip(item, lens)]))
        for f in fields:
            batch[f] = _pad(joined[f], pack_frames)
        batch["segment_ids"], batch["cu_seqlens"] = seg, cu
        counters["frames"] = int((seg >= 0).sum())
        counters["padding"] = int((seg < 0).sum())
    else:
        samples = [item[0] for item in items]
        lengths = np.array([len(s["timestamps"]) for s in samples], dtype=np.int32)
        longest = int(lengths.max())
        for f in fields:
            batch[f] = _pad([s[f] for s in samples], longest)
        batch["lengths"] = lengths
        counters["frames"] = int(lengths.sum())
        counters["padding"] = int(longest * len(samples) - lengths.sum())
    if "video" in items[0][0]:
        batch["video"] = [s["video"] for item in items for s in item]
    return batch, counters

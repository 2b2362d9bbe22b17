"""Samples -> one batch of arrays, written straight into preallocated, zero-padded batch arrays.

Clips of different lengths are padded (``lengths`` says how much is real); packed items concatenate
their samples along time with ``segment_ids`` (-1 = padding) and ``cu_seqlens`` for attention.
Actions and telemetry land on the loader's vocabulary: each sample's session columns are written at
cached column indices (identity sessions take a plain slice), so no per-sample remapped copy exists;
rows still in the read buffer (``read.Rows``) that land contiguously are one memcpy each.
``alloc(shape, dtype)`` makes the batch arrays (zeroed): numpy by default, the loader's reused buffers
when it builds a batch. Given ``empty``, the
frames array (by far the largest) comes from it instead and only its padding is zeroed: clearing the
whole array and then overwriting it was one more pass over every frame byte. The frames array may be a
torch tensor on a device (NVDEC's route: ``empty`` makes it there, samples' frames are device tensors,
or numpy for a clip decoded on CPU, copied up): it is written and padded in place by torch, on its device;
every other array stays numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from dsbuild.core.errors import UsageError
from dsbuild.loader.read import ARRAY_SLOTS, VIDEO_SLOT, RawSample, Rows, Spans, array_bytes, touch
from dsbuild.loader.source import ARRAY_DTYPES

ColumnMap = tuple[np.ndarray | None, np.ndarray | None]  # (controls, channels) columns; None = identity
Alloc = Callable[[tuple, DTypeLike], np.ndarray]


def _same_frame_shape(samples: list[dict]) -> tuple | None:
    shapes = {tuple(s["frames"].shape[1:]) for s in samples if "frames" in s}  # (numpy or torch)
    if len(shapes) > 1:
        raise UsageError(f"a batch mixes frame shapes {sorted(shapes)}", hint="use bucket_by='resolution' or resize=")
    return shapes.pop() if shapes else None


Raw = tuple[memoryview, int] | None  # a batch array's memory as bytes, and the bytes of one of its rows


def _raw(dst: np.ndarray) -> Raw:
    """``dst``'s memory as bytes, where samples' rows can be copied in with one memcpy (None: no memcpy).
    An array with no values (telemetry of captures without any) is empty bytes with rows of 0 bytes."""
    if dst.size == 0:
        return memoryview(bytearray()), 0
    if not dst.flags.c_contiguous:
        return None
    return dst.data.cast("B"), dst.itemsize * (dst.shape[2] if dst.ndim == 3 else 1)


def _flat(dst: np.ndarray) -> tuple[memoryview, int]:
    """``_raw`` of a batch array that must take memcpys (``alloc`` makes C-contiguous arrays)."""
    raw = _raw(dst)
    if raw is None:
        raise UsageError(f"a batch array of shape {dst.shape} is not C-contiguous: alloc must make plain arrays")
    return raw


def _put(dst: np.ndarray, raw: Raw, b: int, pos: int, a: Rows | np.ndarray, n: int, cols: np.ndarray | None) -> None:
    """The first ``n`` rows of ``a`` into ``dst[b, pos:pos + n]``, at vocabulary columns ``cols`` (None: the
    first ones)."""
    if type(a) is Rows:
        _copy_rows(dst, raw, b, pos, a.data, a.dtype, a.width, a.start, n, a.step, cols)
    else:
        _put_array(dst, b, pos, a[:n], cols)


def _copy_rows(
    dst: np.ndarray,
    raw: Raw,
    b: int,
    pos: int,
    data: memoryview,
    dtype: np.dtype,
    width: int | None,
    start: int,
    n: int,
    step: int,
    cols: np.ndarray | None,
) -> None:
    """Rows ``start``, ``start + step``, ... (``n`` of them) of the array whose bytes are ``data`` (rows of
    ``width`` values; None: one) into ``dst[b, pos:pos + n]``: one memcpy where they land contiguously
    (same dtype, no remapped columns, the vocabulary's full width, unstrided), numpy otherwise."""
    row = (1 if width is None else width) * dtype.itemsize
    if row == 0:  # no columns: nothing to copy
        return
    if raw is not None and cols is None and row == raw[1] and (step == 1 or n <= 1) and dtype == dst.dtype:
        at = (b * dst.shape[1] + pos) * row
        raw[0][at : at + n * row] = data[start * row : (start + n) * row]
        return
    a = np.frombuffer(data, dtype)
    if width is not None:
        a = a.reshape(-1, width)
    _put_array(dst, b, pos, a[start : start + (n - 1) * step + 1 : step] if n else a[:0], cols)


def _put_array(dst: np.ndarray, b: int, pos: int, a: np.ndarray, cols: np.ndarray | None) -> None:
    n = len(a)
    if dst.ndim == 2:
        dst[b, pos : pos + n] = a
    elif cols is None:
        dst[b, pos : pos + n, : a.shape[1]] = a
    else:  # dst[b] first: ``dst[b, rows, cols]`` would put the indexed axis first (numpy's mixed indexing)
        dst[b][pos : pos + n, cols] = a


def collate_clips(
    clips: list[RawSample], maps: list[ColumnMap], widths: tuple[int, int], alloc: Alloc = np.zeros
) -> tuple[dict, dict]:
    """(batch, counters) of whole read clips' actions, telemetry and timestamps: ``collate`` for batches
    with nothing to run per sample (bytes mode without ``map``, audio, text, strides or crops), copying
    from the read buffers with neither a per-sample dict nor a ``Rows`` in between. A member too small
    for its array is a FormatError (the caller takes the general route, which replaces the sample)."""
    length = max(c.frames for c in clips)
    out = {
        "actions": alloc((len(clips), length, widths[0]), np.float32),
        "telemetry": alloc((len(clips), length, widths[1]), np.float32),
        "timestamps": alloc((len(clips), length), np.float64),
    }
    acts, tels, tss = out["actions"], out["telemetry"], out["timestamps"]
    ra, rt, rs = _raw(acts), _raw(tels), _raw(tss)
    (sa, st, ss), (da, dt, ds) = ARRAY_SLOTS, ARRAY_DTYPES
    lengths = alloc((len(clips),), np.int32)
    lengths[:] = [c.frames for c in clips]
    # The common case inline (no call per array): a session whose columns are the vocabulary's, stored in
    # the batch's byte order, copies each array member's last bytes into its row with one memcpy.
    inline = False
    if ra is not None and rt is not None and rs is not None:
        (ma, wa), (mt, wt), (ms, ws) = ra, rt, rs
        inline = (da, dt, ds) == (acts.dtype, tels.dtype, tss.dtype)
    for b, (c, (cmap, tmap)) in enumerate(zip(clips, maps)):
        n, m = c.frames, c.members
        if inline and cmap is None and tmap is None and c.controls == widths[0] and c.channels == widths[1]:
            a, t, ts = m[sa], m[st], m[ss]
            na, nt, ns = n * wa, n * wt, n * ws
            if len(a) >= na and len(t) >= nt and len(ts) >= ns:
                at = b * length
                ma[at * wa : at * wa + na] = a[len(a) - na :]
                mt[at * wt : at * wt + nt] = t[len(t) - nt :]
                ms[at * ws : at * ws + ns] = ts[len(ts) - ns :]
                continue
        _copy_rows(acts, ra, b, 0, array_bytes(c, sa, c.controls, da), da, c.controls, 0, n, 1, cmap)
        _copy_rows(tels, rt, b, 0, array_bytes(c, st, c.channels, dt), dt, c.channels, 0, n, 1, tmap)
        _copy_rows(tss, rs, b, 0, array_bytes(c, ss, None, ds), ds, None, 0, n, 1, None)
    out["lengths"] = lengths
    real = int(lengths.sum())
    return out, {"frames": real, "padding": len(clips) * length - real, "truncated": 0}


def collate_spans(
    spans: Spans, frames: np.ndarray, widths: tuple[int, int], alloc: Alloc = np.zeros
) -> tuple[dict, dict, list[memoryview]]:
    """(batch, counters, videos) of whole clips from their shards' mappings, for sessions whose columns
    are the vocabulary's: each array member's last ``frames * row`` bytes (the index was checked at open
    to hold that much) copied into its batch row with one memcpy, each video a view of the mapping. The
    positions are computed for the whole batch at once; per sample there are four slices."""
    length, n = int(frames.max()), len(frames)
    out = {
        "actions": alloc((n, length, widths[0]), np.float32),
        "telemetry": alloc((n, length, widths[1]), np.float32),
        "timestamps": alloc((n, length), np.float64),
    }
    lengths = alloc((n,), np.int32)
    lengths[:] = frames
    (a, ra), (t, rt), (s, rs) = (_flat(out[name]) for name in ("actions", "telemetry", "timestamps"))
    rows = np.array([ra, rt, rs], np.int64)
    sizes = frames.astype(np.int64)[:, None] * rows
    ends = spans.ends[:, ARRAY_SLOTS]
    at = np.arange(n, dtype=np.int64)[:, None] * (length * rows)
    places = np.concatenate(
        [
            spans.starts[:, VIDEO_SLOT : VIDEO_SLOT + 1],
            spans.ends[:, VIDEO_SLOT : VIDEO_SLOT + 1],
            ends - sizes,
            ends,
            at,
            at + sizes,
        ],
        axis=1,
    ).tolist()
    videos = []
    for v, (vs, ve, xa, xt, xs, ya, yt, ys, da, dt, ds, ea, et, es) in zip(spans.views, places):
        touch(v, vs, ve)  # the clip's pages, now: the arrays' are faulted in by their copies below
        videos.append(v[vs:ve])
        a[da:ea] = v[xa:ya]
        t[dt:et] = v[xt:yt]
        s[ds:es] = v[xs:ys]
    out["lengths"] = lengths
    real = int(frames.sum())
    return out, {"frames": real, "padding": n * length - real, "truncated": 0}, videos


def _in_place(a, dst) -> bool:
    """Whether ``a`` is ``dst`` itself (a sample decoded into its row of the batch): numpy arrays, or torch
    tensors on one device."""
    if isinstance(dst, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and a.shape == dst.shape
            and a.strides == dst.strides
            and a.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
        )
    return (
        not isinstance(a, np.ndarray)
        and a.device == dst.device
        and a.shape == dst.shape
        and a.stride() == dst.stride()
        and a.data_ptr() == dst.data_ptr()
    )


def _put_frames(dst, a) -> None:
    """Frames ``a`` into the batch's rows ``dst``: numpy into numpy; into a torch tensor (on its device)
    from a tensor or from numpy (a clip decoded on CPU)."""
    if isinstance(dst, np.ndarray):
        dst[...] = a
        return
    import torch

    dst.copy_(torch.from_numpy(a) if isinstance(a, np.ndarray) else a)


def collate(
    items: list[list[dict]],
    maps: list[list[ColumnMap]],
    widths: tuple[int, int],
    pack_frames: int | None,
    alloc: Alloc = np.zeros,
    empty: Alloc | None = None,
    frames=None,
) -> tuple[dict, dict]:
    """(batch, counters). Each item is one sample, or several packed into ``pack_frames`` frames.
    ``frames``: the batch's frames array (numpy, or a torch tensor on a device) made before decoding,
    whose rows samples may already have been decoded into (those are not copied); used when it has the
    batch's shape. ``empty`` may make the frames array a torch tensor (samples' frames are then tensors
    on its device or numpy)."""
    samples = [s for item in items for s in item]
    frame_shape = _same_frame_shape(samples)
    cut = [[len(s["timestamps"]) for s in item] for item in items]
    truncated = 0
    if pack_frames:
        for lens in cut:
            for k, n in enumerate(lens):
                room = pack_frames - sum(lens[:k])
                truncated += n > room
                lens[k] = max(0, min(n, room))
    length = pack_frames or max(n for lens in cut for n in lens)
    batch_size = len(items)
    out: dict[str, Any] = {  # arrays, and (packed) ``cu_seqlens``: a list of them
        "actions": alloc((batch_size, length, widths[0]), np.float32),
        "telemetry": alloc((batch_size, length, widths[1]), np.float32),
        "timestamps": alloc((batch_size, length), np.float64),
    }
    if frame_shape is not None:
        shape = (batch_size, length, *frame_shape)
        given = frames is not None and tuple(frames.shape) == shape
        out["frames"] = frames if given else (empty or alloc)(shape, np.uint8)
    raw = {name: _raw(out[name]) for name in ("actions", "telemetry", "timestamps")}
    for b, (item, lens) in enumerate(zip(items, cut)):
        pos = 0
        for s, (cmap, tmap), n in zip(item, maps[b], lens):
            _put(out["actions"], raw["actions"], b, pos, s["actions"], n, cmap)
            _put(out["telemetry"], raw["telemetry"], b, pos, s["telemetry"], n, tmap)
            _put(out["timestamps"], raw["timestamps"], b, pos, s["timestamps"], n, None)
            if frame_shape is not None and not _in_place(s["frames"][:n], out["frames"][b, pos : pos + n]):
                _put_frames(out["frames"][b, pos : pos + n], s["frames"][:n])
            pos += n
        if frame_shape is not None and (empty is not None or out["frames"] is frames):
            out["frames"][b, pos:] = 0  # the padding: the only part of the row not written above
    real = sum(sum(lens) for lens in cut)
    if pack_frames:
        seg = alloc((batch_size, length), np.int32)
        seg -= 1
        out["cu_seqlens"] = []
        for b, lens in enumerate(cut):
            bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            out["cu_seqlens"].append(bounds)
            for k, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
                seg[b, lo:hi] = k
        out["segment_ids"] = seg
    else:
        lengths = alloc((batch_size,), np.int32)
        lengths[:] = [lens[0] for lens in cut]
        out["lengths"] = lengths
    if "audio" in samples[0]:
        _audio(out, samples, alloc)
    return out, {"frames": real, "padding": batch_size * length - real, "truncated": truncated}


def _audio(out: dict, samples: list[dict], alloc: Alloc) -> None:
    channels = samples[0]["audio"].shape[0]
    longest = max(s["audio"].shape[1] for s in samples)
    audio = alloc((len(samples), channels, longest), np.float32)
    lengths = alloc((len(samples),), np.int32)
    for b, s in enumerate(samples):
        a = s["audio"]
        audio[b, :, : a.shape[1]] = a
        lengths[b] = a.shape[1]
    out["audio"], out["audio_lengths"] = audio, lengths

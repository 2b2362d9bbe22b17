"""Collation into preallocated arrays: with an uninitialised frames array (reused memory), every byte of
it is either a sample's frame or zero padding, packed or not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.collate import collate


def poisoned(shape, dtype):
    """Memory as a reused buffer hands it out: full of an earlier batch's bytes."""
    return np.full(shape, 0xAB, dtype)


def sample(rng: np.random.Generator, n: int) -> dict:
    return {
        "frames": rng.integers(1, 256, (n, 4, 6, 3), dtype=np.uint8),
        "timestamps": np.arange(n) / 30.0,
        "actions": rng.random((n, 2), dtype=np.float32),
        "telemetry": rng.random((n, 1), dtype=np.float32),
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3), min_size=1, max_size=4),
    st.sampled_from([None, 8, 20]),
    st.integers(0, 2**32 - 1),
)
def test_frames_in_reused_memory_are_the_samples_then_zeros(lengths, pack, seed):
    rng = np.random.default_rng(seed)
    items = [[sample(rng, n) for n in (item if pack else item[:1])] for item in lengths]
    maps = [[(None, None)] * len(item) for item in items]
    want, _ = collate(items, maps, (2, 1), pack)  # np.zeros throughout: the reference
    got, _ = collate(items, maps, (2, 1), pack, np.zeros, poisoned)
    assert got["frames"].shape == want["frames"].shape
    assert np.array_equal(got["frames"], want["frames"])
    for b, item in enumerate(items):  # and the reference is the samples' frames, then zeros
        real = np.concatenate([s["frames"] for s in item])[: got["frames"].shape[1]]
        assert np.array_equal(got["frames"][b, : len(real)], real)
        assert not got["frames"][b, len(real) :].any()


def test_rows_decoded_in_place_are_kept_and_a_batch_array_of_another_shape_is_not_used():
    rng = np.random.default_rng(3)
    frames = poisoned((2, 6, 4, 6, 3), np.uint8)
    items = [[sample(rng, 6)], [sample(rng, 4)]]
    frames[0, :6] = items[0][0]["frames"]
    items[0][0]["frames"] = frames[0, :6]  # decoded into its row; the second sample was not
    maps = [[(None, None)]] * 2
    want, _ = collate(items, maps, (2, 1), None)
    got, _ = collate(items, maps, (2, 1), None, np.zeros, poisoned, frames)
    assert got["frames"] is frames and np.array_equal(got["frames"], want["frames"])
    short = poisoned((2, 5, 4, 6, 3), np.uint8)  # the index promised fewer frames than were decoded
    got, _ = collate(items, maps, (2, 1), None, np.zeros, poisoned, short)
    assert got["frames"] is not short and np.array_equal(got["frames"], want["frames"])


def rows(a: np.ndarray, window: slice):
    """``a`` as a sample's array left in a read buffer (with bytes before it, like a .npy header)."""
    from dsbuild.loader.read import Rows

    data = memoryview(b"\x93NUMPY-header" + a.astype(a.dtype.newbyteorder("<")).tobytes())[13:]
    count = len(range(window.start, min(window.stop, len(a)), window.step))
    return Rows(
        data, a.dtype.newbyteorder("<"), len(a), a.shape[1] if a.ndim == 2 else None, window.start, count, window.step
    )


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 9), st.integers(0, 4), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=4
    ),
    st.sampled_from([None, 6, 20]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 2]),
)
def test_rows_left_in_the_read_buffer_collate_like_their_arrays(shapes, pack, remap, seed, channels):
    """The memcpy path (rows that land contiguously) and the numpy path (strided windows, remapped or
    narrower columns) give the batch that numpy views of the same rows give; also with no telemetry
    channels at all."""
    rng = np.random.default_rng(seed)
    width = (3, channels)
    as_rows, as_arrays, maps = [], [], []
    for frames, start, step, controls in shapes:
        start = min(start, frames - 1)
        window = slice(start, frames, step)
        full = {
            "actions": rng.random((frames, controls), dtype=np.float32),
            "telemetry": rng.random((frames, channels), dtype=np.float32),
            "timestamps": np.arange(frames) / 30.0,
        }
        as_rows.append({k: rows(v, window) for k, v in full.items()})
        as_arrays.append({k: v[window] for k, v in full.items()})
        cols = np.array([2, 0, 1][:controls], dtype=np.intp) if remap else None
        maps.append((cols, None))
    assert all(np.array_equal(r[k].array(), a[k]) for r, a in zip(as_rows, as_arrays) for k in a)
    group = (lambda xs: [xs]) if pack else (lambda xs: [[x] for x in xs])
    want, want_counts = collate(group(as_arrays), group(maps), width, pack)
    got, got_counts = collate(group(as_rows), group(maps), width, pack, np.zeros, poisoned)
    assert got_counts == want_counts
    for name in ("actions", "telemetry", "timestamps"):
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3), st.booleans()), min_size=1, max_size=5),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 2]),
)
def test_whole_clips_collate_straight_from_read_samples_like_their_arrays(shapes, seed, channels):
    """``collate_clips`` (inline memcpy for sessions on the vocabulary's columns, numpy otherwise) gives
    the batch ``collate`` gives for the same clips as arrays."""
    from dsbuild.formats.sample import MEMBERS
    from dsbuild.loader.collate import collate_clips
    from dsbuild.loader.read import RawSample

    rng = np.random.default_rng(seed)
    raws, items, maps = [], [], []
    for k, (frames, controls, remap) in enumerate(shapes):
        arrays = {
            "actions": rng.random((frames, controls), dtype=np.float32),
            "telemetry": rng.random((frames, channels), dtype=np.float32),
            "timestamps": np.arange(frames) / 30.0,
        }
        members = (
            [memoryview(b"{}"), memoryview(b"mp4")]
            + [memoryview(b"\x93NUMPY-header" + a.astype(a.dtype.newbyteorder("<")).tobytes()) for a in arrays.values()]
            + [memoryview(b"")]
        )
        assert len(members) == len(MEMBERS)
        raws.append(RawSample(k, f"k{k}", members, frames, controls, channels, 0))
        items.append([arrays])
        cols = np.array([2, 0, 1][:controls], dtype=np.intp) if remap or controls < 3 else None
        maps.append((cols, None))
    want, want_counts = collate(items, [[m] for m in maps], (3, channels), None)
    got, got_counts = collate_clips(raws, maps, (3, channels))
    assert got_counts == want_counts
    for name in ("actions", "telemetry", "timestamps", "lengths"):
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40)), min_size=1, max_size=6),
    st.integers(1, 3),
    st.sampled_from([0, 2]),
    st.integers(0, 2**32 - 1),
)
def test_whole_clips_collate_straight_from_mapped_shards_like_their_arrays(clips, controls, channels, seed):
    """``collate_spans`` (each array member's last bytes memcpy'd from the shard, each video a view of it)
    gives the batch ``collate`` gives for the same clips as arrays, whatever precedes the arrays in their
    members (a .npy header of any length) and wherever the samples lie in their shards."""
    from dsbuild.formats.sample import MEMBERS
    from dsbuild.loader.collate import collate_spans
    from dsbuild.loader.read import Spans

    rng = np.random.default_rng(seed)
    shards = [bytearray(rng.integers(0, 256, 7, dtype=np.uint8).tobytes()) for _ in range(2)]
    places, items = [], []
    for k, (frames, header) in enumerate(clips):
        arrays = {
            "actions": rng.random((frames, controls), dtype=np.float32),
            "telemetry": rng.random((frames, channels), dtype=np.float32),
            "timestamps": np.arange(frames) / 30.0 + k,
        }
        payloads = {"json": b"{}", "mp4": f"clip {k}".encode(), "txt": b""}
        payloads.update(
            {
                m: b"\x93" * header + a.tobytes()
                for m, a in zip(("actions.npy", "telemetry.npy", "timestamps.npy"), arrays.values())
            }
        )
        shard = shards[k % 2]
        starts, ends = [], []
        for m in MEMBERS:
            shard += b"\0" * int(rng.integers(0, 600))  # framing between members
            starts.append(len(shard))
            shard += payloads.get(m, b"")
            ends.append(len(shard))
        places.append((k % 2, starts, ends))
        items.append([arrays])
    views = [memoryview(bytes(s)) for s in shards]
    spans = Spans(
        [views[s] for s, _, _ in places],
        np.array([p[1] for p in places], np.int64),
        np.array([p[2] for p in places], np.int64),
    )
    frames = np.array([f for f, _ in clips], np.int32)
    want, want_counts = collate(items, [[(None, None)]] * len(items), (controls, channels), None)
    got, got_counts, videos = collate_spans(spans, frames, (controls, channels))
    assert got_counts == want_counts
    for name in ("actions", "telemetry", "timestamps", "lengths"):
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    assert [bytes(v) for v in videos] == [f"clip {k}".encode() for k in range(len(clips))]

"""Batch planning is pure: packing keeps every sample within budget, buckets never mix, ranks and
workers cover every batch once, and a golden vector pins the plan."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.crop import crop_start, frame_indices, frame_window, kept_frames
from dsbuild.loader.plan import PlanSpec, first_fit, plan_chunk, rank_batch_ids


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=60), st.integers(10, 80))
def test_first_fit_places_every_item_once_within_budget(lengths, budget):
    bins = first_fit(lengths, budget)
    assert sorted(p for b in bins for p in b) == list(range(len(lengths)))
    assert all(sum(min(lengths[p], budget) for p in b) <= budget for b in bins)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=200), st.integers(1, 9), st.booleans())
def test_bucketed_plans_never_mix_keys_and_keep_every_sample(keys, batch, pack):
    keys = np.array(keys)
    idx = np.arange(len(keys)) * 10
    lengths = (np.arange(len(keys)) % 7) + 1
    spec = PlanSpec(batch, bucketed=True, pack_frames=12 if pack else None)
    batches = plan_chunk(idx, spec, keys, lengths)
    flat = [s for b in batches for item in b for s in item]
    assert sorted(flat) == sorted(idx.tolist())
    for b in batches:
        assert len({int(keys[s // 10]) for item in b for s in item}) == 1
        assert len(b) <= batch


def test_golden_vector_pins_the_batch_plan():
    """Bucketed, packed planning of one chunk: a change here changes every packed user's batches."""
    idx = np.array([7, 3, 9, 1, 4, 8, 0, 2, 6, 5])
    keys = np.array([0, 1, 0, 1, 0, 0, 1, 1, 0, 1])
    lengths = np.array([5, 3, 8, 2, 6, 4, 7, 1, 3, 9])
    assert plan_chunk(idx, PlanSpec(2, bucketed=True), keys, lengths) == [
        [(7,), (9,)],
        [(3,), (1,)],
        [(4,), (8,)],
        [(0,), (2,)],
        [(6,)],
        [(5,)],
    ]
    assert plan_chunk(idx, PlanSpec(2, bucketed=True, pack_frames=10), keys, lengths) == [
        [(7, 8), (9,)],
        [(3, 1, 2), (0,)],
        [(4, 6)],
        [(5,)],
    ]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(0, 500), st.integers(1, 8), st.integers(1, 4))
def test_ranks_and_workers_cover_each_batch_exactly_once(start, n, world, workers):
    stop = start + n
    seen = [b for r in range(world) for k in range(workers) for b in rank_batch_ids(start, stop, world, r, k, workers)]
    assert sorted(seen) == list(range(start, stop))
    for r in range(world):  # the rank's stream does not depend on the number of workers
        one = list(rank_batch_ids(start, stop, world, r))
        per_worker = [list(rank_batch_ids(start, stop, world, r, k, workers)) for k in range(workers)]
        assert _round_robin(per_worker) == one


def _round_robin(lists):
    out, i = [], 0
    while any(lists):
        if lists[i % len(lists)]:
            out.append(lists[i % len(lists)].pop(0))
        i += 1
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 5),
    st.one_of(st.none(), st.integers(1, 40)),
    st.one_of(st.none(), st.integers(1, 40)),
    st.integers(0, 2**32),
    st.integers(0, 9),
)
def test_crops_fit_the_clip_and_match_the_planned_length(frames, stride, clip, cap, seed, epoch):
    window = frame_window(frames, stride, clip, cap, seed, epoch, ("v", "s__000001"))
    idx = frame_indices(window)
    assert (
        len(idx) == kept_frames(frames, stride, clip, cap) == kept_frames(np.array([frames]), stride, clip, cap)[0] >= 1
    )
    assert idx[0] >= 0 and idx[-1] < frames and np.all(np.diff(idx) == stride)
    assert np.array_equal(np.arange(frames)[window], idx)  # the slice cuts arrays to exactly these frames
    assert window == frame_window(frames, stride, clip, cap, seed, epoch, ("v", "s__000001"))


def test_crops_vary_by_epoch_and_key_and_cover_the_clip():
    starts = {crop_start(100, 2, 10, 3, e, ("v", f"k{k}")) for e in range(20) for k in range(20)}
    assert min(starts) == 0 and max(starts) == 100 - 19 and len(starts) > 50

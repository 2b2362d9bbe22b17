"""The loader's math is pure and property-tested: permutations, planning, rank/worker partition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from dsbuild.loader.permutation import block_order, derive_key, global_order
from dsbuild.loader.plan import PlanSpec, first_fit, plan_chunk, rank_batch_ids


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**63))
def test_global_order_is_a_permutation(n, key):
    order = global_order(n, key, 0, n)
    assert sorted(order.tolist()) == list(range(n))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**63), st.integers(0, 3000), st.integers(0, 500))
def test_any_window_of_the_order_is_computed_alone(n, key, start, count):
    full = global_order(n, key, 0, n)
    assert global_order(n, key, start, count).tolist() == full[start:start + count].tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**63), st.integers(1, 64), st.integers(1, 8), st.integers(0, 3000))
def test_block_order_is_a_permutation_with_random_access(n, key, block, window, start):
    full = block_order(n, key, 0, n, block, window)
    assert sorted(full.tolist()) == list(range(n))
    assert block_order(n, key, start, 100, block, window).tolist() == full[start:start + 100].tolist()


def test_block_order_keeps_reads_local():
    order = block_order(10_000, 7, 0, 10_000, block=100, window=4)
    span_blocks = [len(set((order[i:i + 400] // 100).tolist())) for i in range(0, 10_000, 400)]
    assert max(span_blocks) <= 4


def test_golden_vector_pins_the_order():
    """A change of this vector is a change of every user's epoch order: bump the state format."""
    assert global_order(10, 12345, 0, 10).tolist() == [6, 0, 3, 2, 1, 7, 9, 5, 4, 8]
    assert block_order(10, 12345, 0, 10, block=3, window=2).tolist() == [3, 4, 8, 5, 6, 7, 9, 2, 1, 0]


def test_different_epochs_give_different_orders():
    a = global_order(1000, derive_key(1, 0), 0, 1000)
    b = global_order(1000, derive_key(1, 1), 0, 1000)
    assert (a != b).mean() > 0.9


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


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(0, 500), st.integers(1, 8), st.integers(1, 4))
def test_ranks_and_workers_cover_each_batch_exactly_once(start, n, world, workers):
    stop = start + n
    seen = [b for r in range(world) for k in range(workers) for b in rank_batch_ids(start, stop, world, r, k, workers)]
    assert sorted(seen) == list(range(start, stop))
    for r in range(world):  # the rank's stream does not depend on the number of workers
        one = list(rank_batch_ids(start, stop, world, r))
        rr = [b for it in _round_robin([list(rank_batch_ids(start, stop, world, r, k, workers))
                                        for k in range(workers)]) for b in [it]]
        assert rr == one


def _round_robin(lists):
    out, i = [], 0
    while any(lists):
        if lists[i % len(lists)]:
            out.append(lists[i % len(lists)].pop(0))
        i += 1
    return out

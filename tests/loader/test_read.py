"""Coalescing a batch's reads: every sample lies in exactly one run, runs never span shards, and only
gaps of at most ``COALESCE_GAP`` are read across."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.read import COALESCE_GAP, coalesce


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 400_000), st.integers(1, 90_000)), min_size=1, max_size=40))
def test_every_sample_lies_in_exactly_one_run_of_its_shard(samples):
    shard, off, length = (np.array(c, dtype=np.int64) for c in zip(*samples))
    runs = coalesce(shard, off, length)
    assert sorted(p for r in runs for p in r.samples) == list(range(len(samples)))
    for r in runs:
        for p in r.samples:
            assert shard[p] == r.shard and r.start <= off[p] and off[p] + length[p] <= r.end
        # the run is the union of its samples' ranges, bridged only across small gaps
        covered = sorted((int(off[p]), int(off[p] + length[p])) for p in r.samples)
        assert covered[0][0] == r.start and max(e for _, e in covered) == r.end
        reach = covered[0][1]
        for a, e in covered[1:]:
            assert a <= reach + COALESCE_GAP
            reach = max(reach, e)
    # runs of a shard are in file order and do not overlap
    for s in set(shard.tolist()):
        mine = [r for r in runs if r.shard == s]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))

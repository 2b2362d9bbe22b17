"""Shard planning: a partition of the sorted samples whose sizes follow the target and whose
boundaries move only near a change (what makes incremental builds cost O(change))."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.formats.shards import plan_shards

TARGET = 100_000


def _composition(keys, sizes):
    return {tuple(keys[i] for i in r) for r in plan_shards(keys, sizes, TARGET)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 60_000), max_size=300), st.integers(0, 20_000))
def test_plans_partition_the_samples_and_follow_the_size_bounds(sizes, overhead):
    keys = [f"s-{i:05d}" for i in range(len(sizes))]
    plan = plan_shards(keys, sizes, TARGET, overhead)
    assert [i for r in plan for i in r] == list(range(len(sizes)))
    assert all(len(r) for r in plan)
    lo, hi = TARGET // 2, 2 * TARGET - overhead
    for r in plan[:-1]:
        total = sum(sizes[i] for i in r)
        assert total >= lo
        assert total <= hi or sizes[r[-1]] > hi - lo  # only a big last sample can overshoot


def test_one_session_added_or_removed_changes_only_shards_near_it():
    rng = random.Random(7)
    changed = []
    for trial in range(40):
        n = 3000
        keys = sorted(f"{rng.randrange(10**9):09d}__{j:06d}" for j in range(n))
        sizes = [rng.randint(2_000, 30_000) for _ in range(n)]
        before = _composition(keys, sizes)
        at = rng.randrange(n)
        # a new session of 5 clips lands at `at` (keys sort there); or 5 clips are removed there
        if trial % 2:
            new = [f"{keys[at][:9]}a__{j:06d}" for j in range(5)]
            k2, s2 = keys[: at + 1] + new + keys[at + 1 :], sizes[: at + 1] + [20_000] * 5 + sizes[at + 1 :]
        else:
            k2, s2 = keys[:at] + keys[at + 5 :], sizes[:at] + sizes[at + 5 :]
        after = _composition(k2, s2)
        changed.append(len(after - before))
    assert sum(changed) / len(changed) <= 2.5 and max(changed) <= 6, changed


def test_short_sessions_share_shards_and_long_ones_span_several():
    keys = [f"s-{i:05d}__000000" for i in range(240)] + [f"z-long__{j:06d}" for j in range(200)]
    sizes = [130_000 // 8] * 240 + [20_000] * 200  # 240 short sessions, then one long session
    plan = plan_shards(keys, sizes, 4 * TARGET)
    assert len(plan) < 40
    long_shards = [r for r in plan if any(keys[i].startswith("z-long") for i in r)]
    assert len(long_shards) >= 5

"""The global stream is a pure function of the plans and a position: property tests over mixtures,
mixing per batch or per sample, shuffles, buckets, packing, world sizes, workers and restore points,
and golden vectors that pin the mixture schedule and the walk."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.epoch import EpochPlan
from dsbuild.loader.mixture import normalise, schedule, schedule_counts
from dsbuild.loader.plan import PlanSpec
from dsbuild.loader.walk import End, Position, rank_steps, step_items, walk_batches, walk_samples


def make_plans(sizes, batch, seed, shuffle="global", bucket=False, pack=None):
    spec = PlanSpec(batch, bucketed=bucket, pack_frames=pack)
    plans = []
    for k, n in enumerate(sizes):
        keys = (np.arange(n) * 7 + k) % 3 if bucket else None
        lengths = (np.arange(n) * 5 + k) % 9 + 1
        plans.append(
            EpochPlan(n, seed, f"v{k}/", spec, shuffle=shuffle, block=3, window=2, bucket_keys=keys, lengths=lengths)
        )
    return plans, spec


def walk(start, plans, spec, weights, seed, mix, stop):
    if mix == "sample":
        return walk_samples(start, plans, weights, seed, stop, spec)
    return walk_batches(start, plans, weights, seed, stop)


def flat(step, plans):
    return (step.j, tuple(tuple(tuple(r) for r in item) for item in step_items(step, plans)))


def take(it, n):
    return list(itertools.islice(it, n))


setups = st.fixed_dictionaries(
    {
        "sizes": st.lists(st.integers(1, 13), min_size=1, max_size=3),
        "weights": st.lists(st.integers(1, 5), min_size=3, max_size=3),
        "batch": st.integers(1, 4),
        "seed": st.integers(0, 2**32),
        "shuffle": st.sampled_from(["global", "blocks", "none"]),
        "bucket": st.booleans(),
        "pack": st.sampled_from([None, 12]),
        "mix": st.sampled_from(["batch", "sample"]),
        "stop": st.booleans(),
    }
)


def build(s):
    plans, spec = make_plans(s["sizes"], s["batch"], s["seed"], s["shuffle"], s["bucket"], s["pack"])
    weights = normalise(s["weights"][: len(plans)])
    start = Position(0, tuple((0, 0) for _ in plans))
    return plans, spec, weights, start


@settings(max_examples=60, deadline=None)
@given(setups)
def test_restoring_at_every_step_continues_the_uninterrupted_walk(s):
    plans, spec, weights, start = build(s)
    full = take(walk(start, plans, spec, weights, s["seed"], s["mix"], s["stop"]), 40)
    for k, item in enumerate(full):
        if isinstance(item, End):
            break
        rest = take(walk(item.after, plans, spec, weights, s["seed"], s["mix"], s["stop"]), 40 - k - 1)
        expected = full[k + 1 :]
        assert [flat(x, plans) if not isinstance(x, End) else x for x in rest] == [
            flat(x, plans) if not isinstance(x, End) else x for x in expected
        ]


@settings(max_examples=60, deadline=None)
@given(setups, st.integers(1, 4), st.integers(1, 3), st.integers(0, 12), st.integers(1, 4), st.integers(1, 3))
def test_ranks_and_workers_take_each_global_batch_once_across_an_elastic_restore(
    s, world, workers, cut, world2, workers2
):
    plans, spec, weights, start = build(s)
    horizon = 30
    full = list(take(walk(start, plans, spec, weights, s["seed"], s["mix"], s["stop"]), horizon))
    steps = [x for x in full if not isinstance(x, End)]

    def deliver(position, w, k, until):
        got = {}
        for rank in range(w):
            for worker in range(k):
                it = rank_steps(
                    walk(position, plans, spec, weights, s["seed"], s["mix"], s["stop"]),
                    position.step,
                    w,
                    rank,
                    worker,
                    k,
                )
                for step, _after in it:
                    if step is None or step.j >= until:
                        break
                    got[step.j] = flat(step, plans)
        return got

    # the first world delivers global steps [0, cut*world), every rank checkpoints the same position there
    boundary = min(cut * world, len(steps))
    first = deliver(start, world, workers, boundary)
    resume_at = steps[boundary - 1].after if boundary else start
    positions = set()
    for rank in range(world):
        for step, after in rank_steps(
            walk(start, plans, spec, weights, s["seed"], s["mix"], s["stop"]), 0, world, rank
        ):
            if step is None or step.j >= boundary:
                break
            if (step.j // world + 1) * world == boundary:
                positions.add(after)
    assert positions <= {resume_at}
    second = deliver(resume_at, world2, workers2, len(steps))
    assert sorted(first) + sorted(second) == [x.j for x in steps]
    assert {**first, **second} == {x.j: flat(x, plans) for x in steps}


@settings(max_examples=60, deadline=None)
@given(setups)
def test_every_source_delivers_each_sample_once_per_epoch(s):
    plans, spec, weights, start = build(s)
    seen: dict = {}
    finished = set()
    for item in take(walk(start, plans, spec, weights, s["seed"], s["mix"], s["stop"]), 400):
        if isinstance(item, End):
            finished |= {k for k, (e, _) in enumerate(item.at.cursors) if e >= 1}
            break
        for it in step_items(item, plans):
            for r in it:
                seen.setdefault((r.source, r.epoch), []).append(r.index)
        finished |= {k for k, (e, a) in enumerate(item.after.cursors) if e >= 1}
    for k in finished:
        assert sorted(seen.get((k, 0), [])) == list(range(plans[k].n))


def test_a_single_source_walk_with_stop_is_exactly_one_epoch():
    plans, _spec = make_plans([11], 3, 7, bucket=True, pack=None)
    w = normalise([1])
    items = list(walk_batches(Position(0, ((0, 0),)), plans, w, 7, True))
    assert isinstance(items[-1], End) and items[-1].at == Position(len(items) - 1, ((1, 0),))
    assert sorted(r.index for s in items[:-1] for it in step_items(s, plans) for r in it) == list(range(11))


@pytest.mark.parametrize("mix", ["batch", "sample"])
def test_realised_proportions_follow_the_weights(mix):
    plans, spec = make_plans([50, 20, 9], 2, 3)
    w = normalise([0.5, 0.3, 0.2])
    got = Counter()  # per batch: batches per source (a source's last batch of an epoch may be short)
    for step in take(walk(Position(0, ((0, 0),) * 3), plans, spec, w, 3, mix, False), 2000):
        if mix == "batch":
            got[step.source] += 1
        else:
            got.update(r.source for it in step_items(step, plans) for r in it)
    total = sum(got.values())
    assert all(abs(got[k] / total - w[k]) < 0.01 for k in range(3))


def test_mixture_schedule_matches_weights_within_one_percent_from_any_start():
    for weights, seed in (([0.7, 0.3], 3), ([0.5, 0.3, 0.2], 9)):
        w = normalise(weights)
        for start in (0, 12345):
            counts = np.bincount(schedule(w, seed=seed, start=start, count=10_000), minlength=len(w)) / 10_000
            assert np.all(np.abs(counts - w) < 0.01)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
    st.integers(1, 4),
    st.integers(0, 2**31),
    st.integers(0, 300),
    st.booleans(),
    st.integers(1, 64),
)
def test_every_position_of_a_batch_walk_is_what_the_restore_check_recounts(sizes, batch, seed, steps, stop, block):
    """The invariant ``load_state_dict`` checks (``_check_drawn``): after any number of global batches, ended
    epochs included, each source gave (plain batches a whole epoch) x epoch + at batches, those sum to the
    position, and the schedule's first ``position`` batches draw exactly that many from each source."""
    plans, _ = make_plans(sizes, batch, seed)
    w = normalise([1.0 + k for k in range(len(sizes))])
    pos = Position(0, tuple((0, 0) for _ in sizes))
    for step in itertools.islice(walk_batches(pos, plans, w, seed, stop), steps):
        pos = step.at if isinstance(step, End) else step.after
    gave = [p.batches_in_epoch(0) * e + a for p, (e, a) in zip(plans, pos.cursors)]
    assert sum(gave) == pos.step
    assert (
        schedule_counts(w, seed, pos.step, block)
        == gave
        == np.bincount(schedule(w, seed, 0, pos.step), minlength=len(sizes)).tolist()
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
    st.integers(1, 4),
    st.integers(0, 2**31),
    st.integers(0, 120),
    st.booleans(),
    st.sampled_from([None, 4]),
)
def test_every_position_of_a_sample_walk_is_what_the_restore_check_recounts(sizes, batch, seed, steps, stop, pack):
    """mix="sample": wherever a walk stands (ended epochs and chunks cut short under ``stop`` included),
    the schedule's first sum(epoch x samples + at) slots draw exactly epoch x samples + at from each source."""
    plans, spec = make_plans(sizes, batch, seed, pack=pack)
    w = normalise([1.0 + k for k in range(len(sizes))])
    pos = Position(0, tuple((0, 0) for _ in sizes))
    for step in itertools.islice(walk_samples(pos, plans, w, seed, stop, spec), steps):
        pos = step.at if isinstance(step, End) else step.after
    gave = [p.n * e + a for p, (e, a) in zip(plans, pos.cursors)]
    assert schedule_counts(w, seed, sum(gave)) == gave


def test_golden_vectors_pin_the_mixture_schedule_and_the_walks():
    """A change here changes every mixture user's stream: bump the checkpoint format with it."""
    w = normalise([0.7, 0.3])
    assert schedule(w, 3, 0, 16).tolist() == GOLDEN_SCHEDULE
    plans, spec = make_plans([5, 3], 2, 11)
    batches = [
        (s.source, s.epoch, s.batch) for s in take(walk_batches(Position(0, ((0, 0), (0, 0))), plans, w, 11, False), 10)
    ]
    assert batches == GOLDEN_BATCHES
    samples = [
        flat(s, plans)[1] for s in take(walk_samples(Position(0, ((0, 0), (0, 0))), plans, w, 11, False, spec), 4)
    ]
    assert samples == GOLDEN_SAMPLES


GOLDEN_SCHEDULE = [0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0]
GOLDEN_BATCHES = [
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (1, 0, 0),
    (0, 1, 1),
    (0, 1, 2),
    (1, 0, 1),
    (0, 2, 0),
    (1, 1, 0),
]
GOLDEN_SAMPLES = [
    (((0, 0, 2),), ((0, 0, 0),)),
    (((0, 0, 4),), ((0, 0, 1),)),
    (((1, 0, 0),), ((0, 0, 3),)),
    (((0, 1, 3),), ((1, 0, 2),)),
]

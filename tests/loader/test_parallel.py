"""Model-parallel layouts: the rank arithmetic (orders, coordinates, DeviceMesh), the CP chunks, the balanced
deal, exactly-once at 4,096 ranks over an index-only source of 10^6 samples restored under other layouts,
and the loader on a real catalog at W = 8 under TP, CP and PP."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import UsageError
from dsbuild.loader import Loader, Parallel
from dsbuild.loader.epoch import EpochPlan
from dsbuild.loader.parallel import (
    DEFAULT_ORDER,
    balance,
    cp_bounds,
    cp_gather,
    cp_slice,
    cp_spans,
    parse_layout,
    parse_order,
    stage_fields,
)
from dsbuild.loader.plan import PlanSpec, rank_batch_ids
from dsbuild.loader.walk import (
    Position,
    balance_steps,
    rank_keep,
    rank_steps,
    step_items,
    walk_batches,
    walk_samples,
)
from tests.loader.conftest import index_rows

# -- the rank arithmetic ---------------------------------------------------------------------------------


def test_default_order_varies_tp_fastest_and_pp_slowest():
    p = Parallel(tp=2, cp=2, pp=2)
    rows = [(c.tp, c.cp, c.dp, c.pp) for c in (p.coords(r, 16) for r in range(16))]
    assert rows[:4] == [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 0, 0)]
    assert rows[4] == (0, 0, 1, 0) and rows[8] == (0, 0, 0, 1) and rows[15] == (1, 1, 1, 1)
    assert p.coords(5, 16).dp_size == 2


def test_megatron_default_order_is_accepted_with_ep_of_one():
    mine, megatron = Parallel(tp=2, cp=2, pp=2), Parallel(tp=2, cp=2, pp=2, order="tp-cp-ep-dp-pp")
    assert [mine.coords(r, 16) for r in range(16)] == [megatron.coords(r, 16) for r in range(16)]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 5),
    st.permutations(["tp", "cp", "dp", "pp"]),
)
def test_coordinates_are_a_bijection_and_groups_share_their_data_index(tp, cp, pp, dp, order):
    p, world = Parallel(tp, cp, pp, "-".join(order)), tp * cp * pp * dp
    c = p.coordinates(np.arange(world), world)
    tuples = set(zip(*(c[t].tolist() for t in ("tp", "cp", "dp", "pp"))))
    assert len(tuples) == world  # every (tp, cp, dp, pp) once
    # ranks that differ only in tp, cp or pp share the DP index: they get the same samples
    for r in range(world):
        mine = p.coords(r, world)
        assert (mine.tp, mine.cp, mine.dp, mine.pp) == tuple(int(c[t][r]) for t in ("tp", "cp", "dp", "pp"))
    readers = {int(d) for d, s in zip(c["dp"], c["pp"]) if s in (0, pp - 1)}
    assert readers == set(range(dp))


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ("tp-cp-xp-dp-pp", "unknown token 'xp'"),
        ("tp-tp-cp-dp-pp", "token 'tp' appears 2 times"),
        ("tp-cp-dp", "lacks pp"),
        ("", "unknown token ''"),
    ],
)
def test_a_bad_order_is_one_line_naming_the_token(order, message):
    with pytest.raises(UsageError, match=message):
        parse_order(order)
    with pytest.raises(UsageError, match=message):
        Parallel(order=order)


def test_a_product_that_does_not_divide_the_world_and_a_rank_outside_are_refused():
    with pytest.raises(UsageError, match=r"tp=2 x cp=3 x pp=1 = 6 does not divide world_size 16"):
        Parallel(tp=2, cp=3).coords(0, 16)
    with pytest.raises(UsageError, match="rank 16 is outside world_size 16"):
        Parallel(tp=2).coords(16, 16)
    with pytest.raises(UsageError, match="tp must be an integer >= 1, not 0"):
        Parallel(tp=0)


def test_a_mesh_shape_maps_to_the_order_it_lays_out():
    ranks = np.arange(16)
    p = Parallel.from_mesh_shape(("pp", "dp", "cp", "tp"), (2, 2, 2, 2), ranks)
    assert p == Parallel(tp=2, cp=2, pp=2, order="tp-cp-dp-pp")
    hsdp = Parallel.from_mesh_shape(("dp_replicate", "dp_shard", "tp"), (2, 2, 4), ranks)
    assert hsdp == Parallel(tp=4, order="tp-dp-cp-pp") and hsdp.coords(13, 16).dp == 3
    with pytest.raises(UsageError, match=r"\{'tp': 4, 'cp': 4\} has no data-parallel dimension"):
        Parallel.from_mesh_shape(("tp", "cp"), (4, 4), ranks)
    with pytest.raises(UsageError, match="not neighbours"):
        Parallel.from_mesh_shape(("dp_replicate", "tp", "dp_shard"), (2, 4, 2), ranks)
    with pytest.raises(UsageError, match="'ep'"):
        Parallel.from_mesh_shape(("dp", "ep"), (8, 2), ranks)
    with pytest.raises(UsageError, match="row-major"):
        Parallel.from_mesh_shape(("dp", "tp"), (2, 4), np.arange(8)[::-1].copy())
    split = Parallel.from_mesh_shape(("pp", "dp", "tp"), (2, 2, 4), ranks, "split", ("actions", "telemetry"))
    assert split == Parallel(4, 1, 2, "tp-dp-pp-cp", "split", ("actions", "telemetry"))
    with pytest.raises(UsageError, match="pp_data must be one of both, split, not 'halves'"):
        Parallel.from_mesh_shape(("pp", "dp"), (2, 8), ranks, "halves")


def test_the_cli_spelling_of_a_layout_sets_every_field_of_parallel():
    got = parse_layout("pp=2,tp=2,order=tp-cp-ep-dp-pp,pp_data=split,targets=actions+telemetry")
    assert got == Parallel(tp=2, pp=2, order="tp-cp-ep-dp-pp", pp_data="split", targets=("actions", "telemetry"))
    assert parse_layout("pp=2,pp_data=split") == Parallel(pp=2, pp_data="split")  # targets: actions
    with pytest.raises(UsageError, match=r"targets \['actions', ''\] must be distinct fields"):
        parse_layout("pp=2,pp_data=split,targets=actions+")
    with pytest.raises(UsageError, match="'pp_data=split' is not one of .* pp_data=both|split, targets=FIELD"):
        parse_layout("pp_data=split,pp_data=split")


# -- context parallelism -------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.data())
def test_cp_chunks_of_every_rank_reassemble_any_length_of_at_least_2c(cp, data):
    n = data.draw(st.integers(2 * cp, 400))
    b = cp_bounds(n, cp)
    assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) >= 1)
    owner = {}
    for rank in range(cp):
        (a0, a1), (b0, b1) = cp_spans(n, cp, rank).tolist()
        owner[(a0, a1)], owner[(b0, b1)] = rank, rank
        assert (a0, a1) == (int(b[rank]), int(b[rank + 1])) and (b0, b1) == (
            int(b[2 * cp - 1 - rank]),
            int(b[2 * cp - rank]),
        )
    assert sorted(owner) == [(int(b[j]), int(b[j + 1])) for j in range(2 * cp)]
    # a Megatron length (a multiple of 2C) gets Megatron's equal chunks
    assert np.all(np.diff(cp_bounds(2 * cp * 5, cp)) == 5)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(8, 40), min_size=1, max_size=4))
def test_cp_gather_slices_each_packed_segment_on_its_own(cp, lengths):
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pieces = []
    for rank in range(cp):
        pos, seg = cp_gather(starts, lengths, cp, rank)
        for s, (lo, hi) in enumerate(zip(starts, starts + np.asarray(lengths))):
            assert np.all((pos[seg == s] >= lo) & (pos[seg == s] < hi))
        pieces.append(pos)
    assert sorted(np.concatenate(pieces).tolist()) == list(range(sum(lengths)))


def _reassemble(slices: list[dict], key: str, row: int, length_key: str = "lengths") -> np.ndarray:
    """A row's array put back together from every CP rank's slice, in chunk order."""
    chunks = {}
    for s in slices:
        bounds = s["cp_bounds" if key != "audio" else "audio_cp_bounds"][row]
        a = s[key][row] if key != "audio" else s[key][row].T
        (a0, a1), (b0, b1) = bounds.tolist()
        chunks[a0], chunks[b0] = a[: a1 - a0], a[a1 - a0 : a1 - a0 + b1 - b0]
    out = np.concatenate([chunks[k] for k in sorted(chunks)])
    return out if key != "audio" else out.T


def test_cp_slice_of_a_padded_batch_reassembles_every_array():
    rng = np.random.default_rng(3)
    lengths = np.array([9, 4, 13], np.int32)
    t = 13
    batch = {
        "frames": rng.integers(0, 255, (3, t, 2, 2, 3), dtype=np.uint8),
        "actions": rng.random((3, t, 2), dtype=np.float32),
        "telemetry": rng.random((3, t, 1), dtype=np.float32),
        "timestamps": rng.random((3, t)),
        "lengths": lengths,
        "audio": rng.random((3, 2, 50), dtype=np.float32),
        "audio_lengths": np.array([33, 20, 50], np.int32),
        "keys": ["a", "b", "c"],
    }
    slices = [cp_slice(batch, 2, r) for r in range(2)]
    for s in slices:
        assert s["cp_size"] == 2 and s["keys"] == ["a", "b", "c"]
    for row, n in enumerate(lengths.tolist()):
        for key in ("frames", "actions", "telemetry", "timestamps"):
            assert np.array_equal(_reassemble(slices, key, row), batch[key][row, :n])
        audio = _reassemble(slices, "audio", row)
        assert np.array_equal(audio, batch["audio"][row, :, : batch["audio_lengths"][row]])
    assert sum(s["lengths"] for s in slices).tolist() == lengths.tolist()


# -- balance ---------------------------------------------------------------------------------------------


def test_balance_puts_largest_first_on_the_least_loaded_rank_with_room():
    assert balance([5, 1, 4, 2], [2, 2]).tolist() == [0, 0, 1, 1]  # 5 -> r0, 4 -> r1, 2 -> r1, 1 -> r0
    assert balance([3, 3, 3, 3], [2, 2]).tolist() == [0, 1, 0, 1]  # ties by index, both ways
    assert balance([9, 1, 1], [1, 2]).tolist() == [0, 1, 1]  # r0 is full after one


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=2, max_size=64), st.integers(1, 8))
def test_balance_keeps_every_rank_s_count_and_spreads_by_less_than_the_largest_item(work, ranks):
    per = len(work) // ranks
    if per == 0:
        return
    work = work[: per * ranks]
    owner = balance(work, [per] * ranks)
    assert np.bincount(owner, minlength=ranks).tolist() == [per] * ranks
    dealt = np.bincount(owner, work, ranks)
    assert dealt.max() - dealt.min() <= max(work) - min(work)  # (a deal as drawn: off by a batch's sum)
    assert balance(work, [per] * ranks).tolist() == owner.tolist()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(0, 9)), min_size=1, max_size=64))
def test_balance_fills_unequal_capacities_exactly(pairs):
    work, capacities = [w for w, _ in pairs], [c for _, c in pairs]
    total = sum(capacities)
    work = (work * (total // len(work) + 1))[:total]
    owner = balance(work, capacities)
    assert np.bincount(owner, minlength=len(capacities)).tolist() == capacities


# -- exactly once at the sizes users run ------------------------------------------------------------------

N, B = 1_000_000, 8
LAYOUTS_4096 = [(1, 1, 1), (8, 4, 4), (8, 1, 1), (2, 4, 2), (4, 2, 8)]
LAYOUTS_3072 = [(1, 1, 1), (8, 4, 4), (4, 2, 3), (3, 1, 2), (2, 8, 1)]


def _delivered(plan: EpochPlan, layout: tuple, world: int, start: int, stop: int) -> tuple[np.ndarray, int]:
    """Samples that the reading ranks of ``layout`` at ``world`` deliver from global batch ``start`` to
    ``stop`` (what their ``rank_batch_ids`` name), each DP index's once, and the DP size; every rank of
    the layout is checked to name the same batches as its DP index's first reader."""
    p = Parallel(*layout)
    c = p.coordinates(np.arange(world), world)
    dp = p.data_parallel(world)
    reads = (c["pp"] == 0) | (c["pp"] == layout[2] - 1)
    assert set(c["dp"][reads].tolist()) == set(range(dp))  # every DP index has readers
    ids = [rank_batch_ids(start, stop, dp, d) for d in range(dp)]
    for r in np.random.default_rng(world).choice(world, 64, replace=False).tolist():  # any rank: its DP index's batches
        assert rank_batch_ids(start, stop, dp, p.coords(r, world).dp) == ids[int(c["dp"][r])]
    batches = np.concatenate([np.arange(i.start, i.stop, i.step) for i in ids]) if stop > start else np.zeros(0, int)
    order = plan.order(0, 0, plan.n)
    samples = (batches[:, None] * B + np.arange(B)).reshape(-1)
    return order[samples[samples < plan.n]], dp


@settings(max_examples=4, deadline=None)
@given(st.sampled_from(LAYOUTS_4096), st.sampled_from(LAYOUTS_3072), st.integers(0, 10**6), st.integers(0, 2**32))
def test_4096_ranks_restored_into_3072_deliver_every_sample_of_the_epoch_once(before, after, cut, seed):
    plan = EpochPlan(N, seed, "index-only/", PlanSpec(B))
    total = plan.batches_in_epoch(0)
    dp = Parallel(*before).data_parallel(4096)
    position = min(total, (cut % (total // dp + 1)) * dp)  # a checkpoint after a whole global step
    first, _ = _delivered(plan, before, 4096, 0, position)
    rest, _ = _delivered(plan, after, 3072, position, total)
    seen = np.bincount(np.concatenate([first, rest]), minlength=N)
    assert seen.min() == seen.max() == 1


def test_4096_ranks_walk_the_loader_s_own_steps_as_the_arithmetic_says():
    """The arithmetic above is the loader's: at W = 4,096 with tp=8, cp=4, pp=4 (dp = 32) the walk and
    ``rank_steps`` give a DP index the batches ``rank_batch_ids`` names, from a restored position too."""
    plan = EpochPlan(N, 7, "index-only/", PlanSpec(B))
    p = Parallel(8, 4, 4)
    for rank in (0, 1234, 4095):
        at = p.coords(rank, 4096)
        start = Position(96, ((0, 96),))
        got = list(itertools.islice(rank_steps(walk_batches(start, [plan], np.ones(1), 7, True), 96, 32, at.dp), 3))
        assert [s.j for s, _ in got] == list(rank_batch_ids(96, 96 + 3 * 32, 32, at.dp))
        assert [a.step for _, a in got] == [96 + 32 * k for k in (1, 2, 3)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 4), st.integers(1, 6), st.data(), st.booleans(), st.integers(0, 2**16))
def test_a_walk_that_builds_only_a_rank_s_steps_gives_the_rank_the_same_stream(n, batch, world, data, stop, seed):
    plan = EpochPlan(n, seed, "v/", PlanSpec(batch))
    rank, workers = data.draw(st.integers(0, world - 1)), data.draw(st.integers(1, 3))
    worker = data.draw(st.integers(0, workers - 1))
    first = data.draw(st.integers(0, plan.batches_in_epoch(0)))
    start = Position(first, ((0, first),))

    def stream(keep):
        walk = walk_batches(start, [plan], np.ones(1), seed, stop, keep)
        steps = rank_steps(walk, first, world, rank, worker, workers)
        return [(None if s is None else (s.j, s.batch), a) for s, a in itertools.islice(steps, 3 * n)]

    assert stream(rank_keep(first, world, rank, worker, workers)) == stream(None)


def test_balanced_steps_at_4096_ranks_keep_every_sample_and_even_the_work():
    lengths = np.random.default_rng(0).integers(30, 600, N)
    plan = EpochPlan(N, 3, "index-only/", PlanSpec(B), lengths=lengths)
    dp = Parallel(8, 4, 4).data_parallel(4096)
    walk = walk_batches(Position(0, ((0, 0),)), [plan], np.ones(1), 3, True)
    group = list(itertools.islice(walk, dp))
    steps = [balance_steps(group, [plan], None, k)[0] for k in range(dp)]
    _, drawn, dealt = balance_steps(group, [plan], None, 0)
    before = sorted(r.index for s in group for item in step_items(s, [plan]) for r in item)
    assert sorted(r.index for s in steps for item in s.items for r in item) == before
    assert [len(s.items) for s in steps] == [B] * dp and [s.j for s in steps] == [s.j for s in group]
    assert dealt.max() / dealt.mean() < drawn.max() / drawn.mean() and dealt.sum() == drawn.sum()


@pytest.mark.parametrize("mix", ["batch", "sample"])
@pytest.mark.parametrize("pack", [None, 240])
def test_balanced_steps_of_packed_and_mixed_sources_keep_every_item_once(mix, pack):
    rng = np.random.default_rng(1)
    spec = PlanSpec(4, pack_frames=pack)
    plans = [EpochPlan(400, 3, f"s{s}/", spec, lengths=rng.integers(20, 200, 400)) for s in range(2)]
    start, weights = Position(0, ((0, 0), (0, 0))), np.array([0.7, 0.3])
    walk = (
        walk_batches(start, plans, weights, 3, True)
        if mix == "batch"
        else walk_samples(start, plans, weights, 3, True, spec)
    )
    group = list(itertools.islice(walk, 8))
    steps = [balance_steps(group, plans, pack, k)[0] for k in range(8)]
    _, drawn, dealt = balance_steps(group, plans, pack, 0)
    assert sorted(i for s in steps for i in s.items) == sorted(i for s in group for i in step_items(s, plans))
    assert [len(s.items) for s in steps] == [len(step_items(s, plans)) for s in group]
    assert dealt.sum() == drawn.sum() and dealt.max() <= drawn.max()


# -- the loader under TP, CP and PP at W = 8 ---------------------------------------------------------------

LAYOUTS_8 = [(2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2), (2, 2, 2)]


def _layout_id(layout: tuple) -> str:
    return "tp{}-cp{}-pp{}".format(*layout)


ARRAYS = ("actions", "telemetry", "timestamps")


def _loader(ref: str, rank: int, world: int, layout: tuple | None = None, **kw) -> Loader:
    parallel = Parallel(*layout) if layout else None
    return Loader(
        ref, **{"decode": "bytes", "batch_size": 2, "seed": 5, **kw}, rank=rank, world_size=world, parallel=parallel
    )


def _reader(layout: tuple, world: int, dp: int) -> int:
    """The first rank of ``layout`` that reads for DP index ``dp`` (tp = cp = 0, first stage)."""
    p = Parallel(*layout)
    return next(r for r in range(world) if (c := p.coords(r, world)).dp == dp and c.reads and c.tp == c.cp == 0)


@pytest.mark.parametrize("layout", LAYOUTS_8, ids=_layout_id)
def test_each_rank_delivers_what_a_plain_loader_at_its_dp_index_delivers(cat, layout):
    ref, _ = cat
    p = Parallel(*layout)
    plain = {d: list(_loader(ref, d, p.data_parallel(8))) for d in range(p.data_parallel(8))}
    for rank in range(8):
        at = p.coords(rank, 8)
        loader = _loader(ref, rank, 8, layout)
        got = list(loader)
        role = loader.stats()["parallel"]
        assert (role["dp_rank"], role["cp_rank"], role["pp_rank"]) == (at.dp, at.cp, at.pp)
        if not at.reads:  # a middle pipeline stage: nothing, and no shard opened
            assert got == [] and len(loader) == 0 and loader._held.files == []
            assert "reads nothing" in role["role"] and loader.stats()["bytes"] == 0
            continue
        want = plain[at.dp]
        assert [b["keys"] for b in got] == [b["keys"] for b in want] and len(got) > 0
        for mine, theirs in zip(got, want):
            assert [bytes(v) for v in mine["video"]] == [bytes(v) for v in theirs["video"]]
            if at.cp_size == 1:  # TP peers and pipeline ends: the plain loader's batch, array for array
                for k in (*ARRAYS, "lengths"):
                    assert np.array_equal(mine[k], theirs[k])
            else:
                assert (mine["cp_rank"], mine["cp_size"]) == (at.cp, at.cp_size)


def test_cp_slices_of_frames_actions_telemetry_and_audio_reassemble_the_sample(cat):
    ref, _ = cat
    kw = {"decode": "frames", "resize": (24, 32), "audio": True, "batch_size": 2}
    plain = next(iter(_loader(ref, 1, 2, **kw)))
    slices = [next(iter(_loader(ref, 2 + r, 4, (1, 2, 1), **kw))) for r in range(2)]  # ranks 2, 3: dp 1
    assert slices[0]["keys"] == slices[1]["keys"] == plain["keys"]
    for row, n in enumerate(plain["lengths"].tolist()):
        for key in ("frames", *ARRAYS):
            assert np.array_equal(_reassemble(slices, key, row), plain[key][row, :n])
        audio = _reassemble(slices, "audio", row)
        assert np.array_equal(audio, plain["audio"][row, :, : plain["audio_lengths"][row]])


def test_cp_slices_each_packed_sub_sequence_and_keeps_its_segment_ids(cat):
    ref, _ = cat
    kw = {"decode": "frames", "resize": (24, 32), "pack_frames": 240, "batch_size": 2, "num_workers": 0}
    plain = next(iter(_loader(ref, 0, 1, **kw)))
    slices = [next(iter(_loader(ref, r, 3, (1, 3, 1), **kw))) for r in range(3)]
    for row, bounds in enumerate(plain["cu_seqlens"]):
        for seg, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
            chunks = {}
            for s in slices:
                mine = s["segment_ids"][row] == seg
                assert mine.any()
                (a0, a1), (b0, _) = s["cp_bounds"][row][seg].tolist()
                pieces = s["actions"][row][mine]
                chunks[a0], chunks[b0] = pieces[: a1 - a0], pieces[a1 - a0 :]
                assert s["cu_seqlens"][row][seg + 1] - s["cu_seqlens"][row][seg] == mine.sum()
            whole = np.concatenate([chunks[k] for k in sorted(chunks)])
            assert np.array_equal(whole, plain["actions"][row, lo:hi])


def test_cp_slices_text_events_by_the_frame_they_fall_in(cat):
    """Text events are stamped on the session clock, as timestamps are: each goes with the chunk of the
    frame it falls in (the last one stamped at or before it), so it is on exactly one CP rank."""
    ref, _ = cat
    plain = list(_loader(ref, 0, 1, text=True))
    slices = [list(_loader(ref, r, 2, (1, 2, 1), text=True)) for r in range(2)]
    per_rank = [0, 0]
    for b, whole in enumerate(plain):
        for row, events in enumerate(whole["text"]):
            mine = [s[b]["text"][row] for s in slices]
            assert sorted(mine[0] + mine[1], key=lambda e: e["t"]) == events
            n, ts = whole["lengths"][row], whole["timestamps"][row]
            for r, got in enumerate(mine):
                frames = np.searchsorted(ts[:n], [e["t"] for e in got], side="right") - 1
                spans = slices[r][b]["cp_bounds"][row].tolist()
                assert all(any(lo <= max(f, 0) < hi for lo, hi in spans) for f in frames.tolist())
                per_rank[r] += len(got)
    assert min(per_rank) > 0


def test_a_split_pipeline_gives_the_first_stage_inputs_and_the_last_targets(cat):
    ref, _ = cat
    layout = Parallel(pp=2, pp_data="split", targets=("actions", "timestamps"))
    plain = next(iter(_loader(ref, 1, 2, text=True)))
    first = Loader(ref, decode="bytes", batch_size=2, seed=5, text=True, rank=1, world_size=4, parallel=layout)
    last = Loader(ref, decode="bytes", batch_size=2, seed=5, text=True, rank=3, world_size=4, parallel=layout)
    inputs, targets = next(iter(first)), next(iter(last))
    assert inputs["keys"] == targets["keys"] == plain["keys"]
    assert "actions" not in inputs and "timestamps" not in inputs and {"video", "telemetry", "text"} <= set(inputs)
    assert set(targets) == set(plain) - {"video", "telemetry", "text"}
    assert np.array_equal(targets["actions"], plain["actions"]) and inputs["text"] == plain["text"]
    assert (
        first.stats()["parallel"]["role"]
        == "reads inputs (first of 2 pipeline stages: frames, video, telemetry, audio, text)"
    )
    assert last.stats()["parallel"]["role"] == "reads targets (last of 2 pipeline stages: actions, timestamps)"
    both = Parallel(pp=2).coords(3, 4)
    assert both.fields is None and both.role == "reads (last of 2 pipeline stages: inputs and targets)"


def test_a_split_stage_decodes_no_frames_or_audio_it_drops_and_delivers_the_rest_unchanged(cat):
    ref, _ = cat
    kw = {"decode": "frames", "resize": (24, 32), "audio": True, "text": True, "batch_size": 2}
    split = Parallel(pp=2, pp_data="split", targets=("actions", "telemetry"))
    whole = [next(iter(_loader(ref, r, 4, (1, 1, 2), **kw))) for r in (1, 3)]  # dp 1's stages, whole batches
    for rank, want in zip((1, 3), whole):
        stage = Loader(ref, **{"seed": 5, **kw}, rank=rank, world_size=4, parallel=split)
        got = next(iter(stage))
        fields = split.coords(rank, 4).fields
        assert set(got) == set(stage_fields(want, fields)) and got["keys"] == want["keys"]
        for k, v in got.items():
            assert np.array_equal(v, want[k]) if isinstance(v, np.ndarray) else v == want[k], k
        assert (stage.stats()["decoded_frames"] == 0) == (rank == 3), rank  # the last stage decodes nothing


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pp_data": "halves"}, "pp_data must be one of both, split, not 'halves'"),
        ({"targets": ("labels",)}, r"targets \['labels'\] must be distinct fields among frames, video"),
        ({"targets": ()}, r"targets \[\] must be distinct fields"),
    ],
)
def test_a_bad_pipeline_split_is_a_usage_error_naming_it(kw, message):
    with pytest.raises(UsageError, match=message):
        Parallel(pp=2, **kw)


_runs: dict = {}


def _first_steps(ref: str, layout: tuple, steps: int) -> tuple[list[str], dict]:
    """Keys the ranks of ``layout`` (W = 8) deliver in their first ``steps`` global steps, and the
    checkpoint after them (every reading rank writes the same one)."""
    if (layout, steps) not in _runs:
        keys, states = [], []
        for d in range(Parallel(*layout).data_parallel(8)):
            loader = _loader(ref, _reader(layout, 8, d), 8, layout, batch_size=1)
            keys += [k for b in itertools.islice(loader, steps) for k in b["keys"]]
            states.append(loader.state_dict())
        assert all(s == states[0] for s in states) and states[0]["layout"]["world_size"] == 8
        _runs[layout, steps] = keys, json.loads(json.dumps(states[0]))
    return _runs[layout, steps]


@pytest.mark.parametrize(
    ("before", "after"),
    [(a, b) for a in LAYOUTS_8 for b in LAYOUTS_8 if a != b],
    ids=_layout_id,
)
def test_restore_under_another_layout_delivers_the_rest_of_the_epoch_once(cat, before, after):
    ref, vid = cat
    every = sorted(r["key"] for r in index_rows(ref, vid))
    for steps in (1, 3):
        seen, state = _first_steps(ref, before, steps)
        seen = list(seen)
        for d in range(Parallel(*after).data_parallel(8)):
            loader = _loader(ref, _reader(after, 8, d), 8, after, batch_size=1)
            loader.load_state_dict(state)
            seen += [k for b in loader for k in b["keys"]]
        assert sorted(seen) == every, (before, after, steps)


def test_balance_evens_the_frames_per_rank_and_keeps_exactly_once(cat):
    ref, vid = cat
    every = sorted(r["key"] for r in index_rows(ref, vid))
    spreads = {}
    for balance_by in (None, "frames"):
        seen, frames, drawn = [], [], []
        for rank in range(4):
            loader = _loader(ref, rank, 4, batch_size=2, balance=balance_by)
            batches = list(loader)
            seen += [k for b in batches for k in b["keys"]]
            frames.append([int(b["lengths"].sum()) for b in batches])
            drawn.append(loader.stats()["parallel"].get("spread"))
        assert sorted(seen) == every
        steps = min(len(f) for f in frames)
        per_step = np.array([f[:steps] for f in frames])  # [rank, step]
        spreads[balance_by] = float(np.mean(per_step.max(0) / per_step.mean(0)))
    assert spreads["frames"] < spreads[None]
    assert drawn[0]["dealt"] < drawn[0]["drawn"] and drawn[0]["steps"] >= steps


def test_balance_restores_under_another_world_size_once_and_refuses_another_balance(cat):
    ref, vid = cat
    every = sorted(r["key"] for r in index_rows(ref, vid))
    seen, states = [], []
    for rank in range(4):
        loader = _loader(ref, rank, 4, balance="frames")
        seen += [k for b in itertools.islice(loader, 1) for k in b["keys"]]
        states.append(loader.state_dict())
    for rank in range(3):
        loader = _loader(ref, rank, 3, balance="frames")
        loader.load_state_dict(states[0])
        seen += [k for b in loader for k in b["keys"]]
    assert sorted(seen) == every
    with pytest.raises(UsageError, match="checkpoint has balance='frames', loader has balance=None"):
        _loader(ref, 0, 2).load_state_dict(states[0])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"rank": 0, "world_size": 6, "parallel": Parallel(tp=4)},
            "tp=4 x cp=1 x pp=1 = 4 does not divide world_size 6",
        ),
        ({"rank": 8, "world_size": 8, "parallel": Parallel(tp=2)}, "rank 8 is outside world_size 8"),
        ({"parallel": "tp=2"}, "parallel must be a Parallel or a torch DeviceMesh, not str"),
        ({"balance": "tokens"}, "balance='tokens' needs pack_frames"),
        ({"balance": "frames", "bucket_by": "resolution"}, "would mix shapes"),
    ],
)
def test_bad_layouts_are_one_line_usage_errors(cat, kw, message):
    with pytest.raises(UsageError, match=message):
        Loader(cat[0], **kw)


def test_a_clip_shorter_than_2c_frames_is_named_with_its_length(cat):
    ref, vid = cat
    rows = index_rows(ref, vid)
    with pytest.raises(UsageError, match=r"clip \S+ delivers 2 frame\(s\), fewer than 2 x cp = 4") as e:
        Loader(ref, max_frames=2, resize=(24, 32), rank=0, world_size=2, parallel=Parallel(cp=2)).open()
    assert any(r["key"] in str(e.value) for r in rows)


def _mesh_rank(rank: int, world: int, ref: str, folder: str) -> None:
    """One gloo process: the Loader under two DeviceMeshes (dp x cp x tp, and HSDP's replicate x shard x tp),
    written down with what the equivalent ``Parallel`` gives the same rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        out = {}
        for name, shape, dims, equivalent in (
            ("dp-cp-tp", (1, 2, 2), ("dp", "cp", "tp"), (2, 2, 1)),
            ("hsdp", (2, 1, 2), ("dp_replicate", "dp_shard", "tp"), (2, 1, 1)),
            ("pp-split", (2, 2), ("pp", "dp"), (1, 1, 2, DEFAULT_ORDER, "split", ("actions", "telemetry"))),
        ):
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=dims)
            if len(equivalent) > 3:  # a split pipeline: the layout from the mesh, its rank and size with it
                layout = Parallel.from_mesh(mesh, pp_data="split", targets=("actions", "telemetry"))
                loader = Loader(ref, decode="bytes", batch_size=2, seed=5, parallel=layout, rank=rank, world_size=world)
            else:
                loader = Loader(ref, decode="bytes", batch_size=2, seed=5, parallel=mesh)
            mine = _loader(ref, rank, world, equivalent)
            out[name] = {
                "mesh": [[b["keys"], sorted(b)] for b in loader],
                "parallel": [[b["keys"], sorted(b)] for b in mine],
                "coords": [loader.stats()["parallel"], mine.stats()["parallel"]],
            }
        with open(f"{folder}/rank{rank}.json", "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def test_a_device_mesh_gives_every_rank_what_the_equivalent_parallel_gives(cat, tmp_path):
    mp = pytest.importorskip("torch.multiprocessing")
    pytest.importorskip("torch.distributed.device_mesh")
    ref, _ = cat
    mp.spawn(_mesh_rank, args=(4, ref, str(tmp_path)), nprocs=4, join=True)
    for rank in range(4):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name, run in got.items():
            assert run["mesh"] == run["parallel"] and run["mesh"], (rank, name)
            assert run["coords"][0] == run["coords"][1] and run["coords"][0]["rank"] == rank
        fields = set(got["pp-split"]["mesh"][0][1])  # ranks 0, 1: the first stage; 2, 3: the last
        assert ("actions" in fields) == (rank >= 2) and ("video" in fields) == (rank < 2)


JAX_SCRIPT = """
import json, sys
import jax, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
ref, pid, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=120)
from dsbuild.loader import Loader, Parallel
loader = Loader(ref, batch_size=4, seed=3, resize=(8, 8), rank=pid, world_size=2, parallel=Parallel(tp=2))
sharding = NamedSharding(jax.make_mesh((2, 2), ("data", "model")), P("data"))
out = []
for b in loader.as_jax_iterator(sharding):
    ts = multihost_utils.process_allgather(b["timestamps"], tiled=True)
    out.append({"shape": list(b["timestamps"].shape), "rows": np.asarray(ts).tolist(), "keys": b["keys"]})
    if len(out) == 2:
        break
print(json.dumps(out))
jax.distributed.shutdown()
"""


def test_jax_processes_of_one_tp_group_supply_one_data_parallel_batch(cat):
    """Two JAX processes, tp=2 across them: dp = 1, so the global batch is batch_size rows, each the plain
    single-rank loader's."""
    pytest.importorskip("jax", reason="the jax extra is not installed (pip install 'dsbuild[jax]')")
    import os
    import socket
    import subprocess
    import sys

    ref, _ = cat
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JAX_SCRIPT, ref, str(i), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    plain = list(itertools.islice(Loader(ref, batch_size=4, seed=3, resize=(8, 8)), 2))
    for k, want in enumerate(plain):
        assert outs[0][k]["keys"] == outs[1][k]["keys"] == want["keys"]
        assert outs[0][k]["shape"][0] == 4  # dp x batch_size, not processes x batch_size
        n = want["timestamps"].shape[1]
        assert np.array_equal(np.array(outs[0][k]["rows"], np.float32)[:, :n], want["timestamps"].astype(np.float32))


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("tp=3", "tp=3 x cp=1 x pp=1 = 3 does not divide world_size 4"),
        ("tp=2,xp=2", "layout 'tp=2,xp=2': 'xp=2' is not one of tp=N, cp=N, pp=N, order=ORDER"),
        ("tp=2,order=tp-tp-cp-dp-pp", "order 'tp-tp-cp-dp-pp': token 'tp' appears 2 times"),
        ("cp=0", "cp must be an integer >= 1, not 0"),
        ("pp_data=halves", "pp_data must be one of both, split, not 'halves'"),
        ("targets=actions+labels", "targets ['actions', 'labels'] must be distinct fields among frames"),
    ],
)
def test_bench_refuses_a_bad_layout_in_one_line_with_exit_2(cat, layout, message):
    from tests.cli.clitools import run as dsbuild

    p = dsbuild("bench", cat[0], "--parallel", layout, "--ranks", "4", "--decode", "bytes", check=2)
    assert message in p.stderr and p.stderr.startswith("error: ") and "Traceback" not in p.stderr

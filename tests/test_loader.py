"""The loader on real catalogs: determinism, exactly-once partition, exact and elastic resume, mixtures,
bucketing, packing, decoding, corrupt samples and the torch DataLoader path (all on CPU)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import UsageError
from dsbuild.loader import Loader, Mixture
from dsbuild.loader.mixture import normalise, schedule
from tests.helpers import index_rows, manifest


@pytest.fixture(scope="module")
def cat(captures, tmp_path_factory):
    """~30 samples of 1-2 s clips across 6 sessions (mixed resolutions and rates)."""
    out = tmp_path_factory.mktemp("loader") / "catalog"
    r = convert(captures, out, ConvertConfig(clip_seconds=1.0), workers=2)
    return str(out), r.version_id


def keys_of(batches) -> list:
    return [k for b in batches for k in b["keys"]]


def run(ref, n=None, state=None, **kw) -> tuple[list, dict]:
    """Take ``n`` batches (all of the epoch if None) from a fresh loader, optionally restored."""
    loader = Loader(ref, **{"decode": "bytes", "batch_size": 3, "seed": 5, **kw})
    if state is not None:
        loader.load_state_dict(json.loads(json.dumps(state)))
    out = []
    for b in loader:
        out.append(b["keys"])
        if n is not None and len(out) == n:
            break
    return out, loader.state_dict()


def test_epoch_order_is_a_pure_function_of_seed_and_epoch(cat):
    ref, _ = cat
    a, _ = run(ref)
    b, _ = run(ref)
    c, _ = run(ref, seed=6)
    assert a == b and a != c
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    e0 = [k for b in loader for k in b["keys"]]
    e1 = [k for b in loader for k in b["keys"]]
    assert sorted(e0) == sorted(e1) and e0 != e1 and loader.epoch == 2


@pytest.mark.parametrize("shuffle", ["global", "blocks", "none"])
def test_one_epoch_over_w_ranks_delivers_every_sample_once(cat, shuffle):
    ref, vid = cat
    every = sorted(r["key"] for r in index_rows(Path(ref), vid))
    for world in (1, 2, 3, 4):
        seen = []
        for rank in range(world):
            batches, _ = run(ref, rank=rank, world_size=world, shuffle=shuffle, block_size=4, block_window=2)
            seen += [k for b in batches for k in b]
        assert sorted(seen) == every


def test_the_stream_does_not_depend_on_worker_threads(cat):
    ref, _ = cat
    assert run(ref, num_workers=0)[0] == run(ref, num_workers=3, prefetch=7)[0]


def test_resume_at_every_position_continues_the_same_stream(cat):
    ref, _ = cat
    full_two_epochs = []
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    for _ in range(2):
        full_two_epochs += [b["keys"] for b in loader]
    per_epoch = len(full_two_epochs) // 2
    for cut in range(0, per_epoch + 1):
        first, state = run(ref, n=cut) if cut else ([], Loader(ref, decode="bytes", batch_size=3, seed=5).state_dict())
        loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
        loader.load_state_dict(state)
        rest = [b["keys"] for b in loader]
        if cut == per_epoch:  # saved at the end of epoch 0: the restored loader is in epoch 1
            rest = rest or [b["keys"] for b in loader]
            assert first + rest == full_two_epochs
        else:
            assert first + rest == full_two_epochs[:per_epoch]
    assert len(json.dumps(state)) < 1000


def test_elastic_resume_4_then_3_then_6_ranks_loses_and_repeats_nothing(cat):
    ref, vid = cat
    seen, state = [], None
    for world, steps in ((4, 1), (3, 1), (6, None)):
        states = []
        for rank in range(world):
            batches, st = run(ref, n=steps, state=state, rank=rank, world_size=world, batch_size=2)
            seen += [k for b in batches for k in b]
            states.append(st)
        if steps is not None:
            assert all(s == states[0] for s in states)  # every rank checkpoints the same state
        state = states[0]
    assert sorted(seen) == sorted(r["key"] for r in index_rows(Path(ref), vid))


def test_restore_refuses_a_checkpoint_for_other_settings(cat):
    ref, _ = cat
    _, state = run(ref, n=1)
    with pytest.raises(UsageError, match="checkpoint has seed=5, loader has seed=6"):
        Loader(ref, decode="bytes", batch_size=3, seed=6).load_state_dict(state)
    with pytest.raises(UsageError, match="batch_size"):
        Loader(ref, decode="bytes", batch_size=4, seed=5).load_state_dict(state)
    bad = {**state, "sources": [{**state["sources"][0], "version_id": "f" * 64}]}
    with pytest.raises(UsageError, match="sources"):
        Loader(ref, decode="bytes", batch_size=3, seed=5).load_state_dict(bad)


def test_mixture_schedule_matches_weights_within_one_percent():
    w = normalise([0.7, 0.3])
    counts = np.bincount(schedule(w, seed=3, start=0, count=10_000), minlength=2) / 10_000
    assert np.all(np.abs(counts - w) < 0.01)
    w3 = normalise([0.5, 0.3, 0.2])
    for start in (0, 12345):
        counts = np.bincount(schedule(w3, seed=9, start=start, count=10_000), minlength=3) / 10_000
        assert np.all(np.abs(counts - w3) < 0.01)


def test_mixture_is_deterministic_resumable_and_reepochs(cat, wds_catalog):
    ref, _ = cat
    other = str(wds_catalog[0])

    def take(n, state=None):
        m = Mixture([(ref, None, 0.7), (other, None, 0.3)], decode="bytes", batch_size=1, seed=2)
        if state:
            m.load_state_dict(state)
        out = []
        for b in m:
            out.append((b["source"], b["keys"][0]))
            if len(out) == n:
                return out, m.state_dict()

    full, _ = take(200)
    head, state = take(77)
    tail, _ = take(123, state)
    assert head + tail == full
    share = Counter(s for s, _ in full)[0] / len(full)
    assert abs(share - 0.7) < 0.02
    assert len(set(k for s, k in full if s == 1)) < Counter(s for s, _ in full)[1]  # source 1 re-epoched


def test_mixture_stop_policy_ends_when_a_source_runs_out(cat, wds_catalog):
    ref, _ = cat
    m = Mixture([(ref, None, 0.5), (str(wds_catalog[0]), None, 0.5)], decode="bytes", batch_size=1, policy="stop")
    got = [b["source"] for b in m]
    small = manifest(wds_catalog[0], wds_catalog[1])["stats"]["samples"]
    assert got.count(1) == small and 0 < got.count(0) <= small + 2


def test_decoded_frames_with_stride_resize_and_buckets(cat):
    ref, vid = cat
    rows = {r["key"]: r for r in index_rows(Path(ref), vid)}
    loader = Loader(ref, batch_size=4, seed=1, frame_stride=2, bucket_by="resolution")
    n = 0
    for b in loader:
        assert b["frames"].dtype == np.uint8 and b["frames"].ndim == 5
        sizes = {(rows[k]["height"], rows[k]["width"]) for k in b["keys"]}
        assert len(sizes) == 1 and b["frames"].shape[2:4] == next(iter(sizes))
        for i, k in enumerate(b["keys"]):
            assert b["lengths"][i] == -(-rows[k]["frames"] // 2)
        assert b["actions"].shape[:2] == b["frames"].shape[:2] == b["telemetry"].shape[:2]
        n += len(b["keys"])
    assert n == len(rows)
    small = next(iter(Loader(ref, batch_size=2, resize=(24, 32), seed=1)))
    assert small["frames"].shape[2:] == (24, 32, 3)
    with pytest.raises(UsageError, match="resolutions"):
        next(iter(Loader(ref, batch_size=2)))


def test_packing_keeps_every_sample_and_exposes_segments(cat):
    ref, vid = cat
    loader = Loader(ref, batch_size=2, seed=1, resize=(16, 16), pack_frames=200)
    seen = []
    for b in loader:
        assert b["frames"].shape[1] == 200 and b["segment_ids"].shape == (len(b["keys"]), 200)
        for item, seg, cu in zip(b["keys"], b["segment_ids"], b["cu_seqlens"]):
            assert len(cu) == len(item) + 1 and int(cu[-1]) == int((seg >= 0).sum())
            seen += item
    assert sorted(seen) == sorted(r["key"] for r in index_rows(Path(ref), vid))
    stats = loader.stats()
    assert 0 <= stats["padding_fraction"] < 1 and stats["samples"] == len(seen)


def test_a_corrupt_sample_is_replaced_the_same_way_on_every_rank(cat, tmp_path):
    src, vid = cat
    ref = tmp_path / "catalog"
    shutil.copytree(src, ref)
    victim = index_rows(ref, vid)[4]
    shard = ref / victim["shard"]
    data = bytearray(shard.read_bytes())
    data[victim["offset"] + 2048] ^= 0xFF  # inside the sample's video member
    shard.write_bytes(bytes(data))
    runs = []
    for _ in range(2):
        per_rank = []
        for rank in range(2):
            loader = Loader(str(ref), decode="bytes", batch_size=3, seed=5, rank=rank, world_size=2)
            per_rank.append(keys_of(list(loader)))
            if victim["key"] in [k.split(":")[0] for k in loader.stats()["corrupt_keys"]]:
                assert loader.stats()["corrupt"] == 1
        runs.append(per_rank)
    assert runs[0] == runs[1]
    delivered = runs[0][0] + runs[0][1]
    assert victim["key"] not in delivered and len(delivered) == len(index_rows(ref, vid))


def test_numpy_by_default_and_torch_tensors_on_cpu(cat):
    torch = pytest.importorskip("torch")
    ref, _ = cat
    b = next(iter(Loader(ref, batch_size=2, resize=(8, 8))))
    assert isinstance(b["frames"], np.ndarray)
    t = next(iter(Loader(ref, batch_size=2, resize=(8, 8), device="auto")))
    assert isinstance(t["frames"], torch.Tensor) and t["frames"].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            iter(Loader(ref, batch_size=2, resize=(8, 8), device="cuda")).__next__()


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_gives_the_same_stream_and_checkpoints(cat, workers):
    torch = pytest.importorskip("torch")
    ref, _ = cat
    expected, _ = run(ref)
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=workers)
    got, state = [], None
    for i, b in enumerate(dl):
        got.append(b["keys"])
        if i == 2:
            state = loader.state_after(b)
    assert got == expected
    rest, _ = run(ref, state=state)
    assert expected[:3] + rest == expected


def test_pooled_read_buffers_are_never_reused_while_a_sample_is_held(cat):
    from dsbuild.loader.source import Source

    ref, _ = cat
    src = Source(ref, verify=False).open()
    held = [bytes(src.read_bytes(i)) for i in range(len(src))]
    views = [src.read_bytes(i) for i in range(len(src))]  # all alive at once: each needs its own buffer
    src.read_bytes(0)
    pooled = len(src._pool._buffers)
    for _ in range(3):
        for i in range(len(src)):
            src.read_bytes((i + 1) % len(src))  # churn the pool while the views above are held
    assert [bytes(v) for v in views] == held
    assert len(src._pool._buffers) == pooled  # the churn reused its released buffer instead of allocating
    del views
    again = [bytes(src.read_bytes(i)) for i in range(len(src))]  # buffers now reused
    assert again == held

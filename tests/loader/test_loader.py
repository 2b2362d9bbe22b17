"""The loader on real catalogs: determinism, exactly-once partition, exact and elastic resume, mixtures,
bucketing, packing, decoding, whole samples in batches, map, corrupt samples (all on CPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dsbuild.core.errors import CorruptDataError, UsageError
from dsbuild.formats.webdataset import payload_offsets
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader, Mixture
from tests.loader.conftest import index_rows, run


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
    every = sorted(r["key"] for r in index_rows(ref, vid))
    for world in (1, 2, 3, 4):
        seen = []
        for rank in range(world):
            batches, _ = run(ref, rank=rank, world_size=world, shuffle=shuffle, block_size=4, block_window=2)
            seen += [k for b in batches for k in b]
        assert sorted(seen) == every


def test_the_stream_does_not_depend_on_worker_threads_or_verification(cat):
    ref, _ = cat
    one = run(ref, num_workers=0)[0]
    assert one == run(ref, num_workers=3, prefetch=7)[0]
    assert one == run(ref, verify="shard")[0] == run(ref, verify=False)[0]


def test_resume_at_every_position_continues_the_same_stream(cat):
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    full_two_epochs = [b["keys"] for _ in range(2) for b in loader]
    per_epoch = len(full_two_epochs) // 2
    for cut in range(0, per_epoch + 1):
        first, state = run(ref, n=cut) if cut else ([], Loader(ref, decode="bytes", batch_size=3, seed=5).state_dict())
        restored = Loader(ref, decode="bytes", batch_size=3, seed=5)
        restored.load_state_dict(state)
        rest = [b["keys"] for b in restored]
        if cut == per_epoch:  # saved after the last batch of epoch 0: this loop ends it, the next is epoch 1
            assert rest == []
            assert first + [b["keys"] for b in restored] == full_two_epochs
        else:
            assert first + rest == full_two_epochs[:per_epoch]


def test_reading_ahead_across_epochs_changes_no_batch_and_a_restore_discards_it(cat):
    """Back-to-back epochs (the next epoch's first batches are built while this one ends) deliver what
    loaders restored at each epoch's start deliver; stopping early, or a restore between epochs, drops
    what was read ahead."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5, prefetch=4, num_workers=2)
    starts, epochs = [], []
    for _ in range(3):
        starts.append(loader.state_dict())
        epochs.append([b["keys"] for b in loader])
    assert len(epochs[0]) > 4 and epochs[0] != epochs[1]  # a global shuffle: epochs differ
    for state, keys in zip(starts, epochs):
        assert run(ref, state=state)[0] == keys
    assert loader._ahead is not None and len(loader._ahead.pending) == 4  # epoch 3's first batches, under way
    loader.load_state_dict(starts[0])
    assert [b["keys"] for b in loader] == epochs[0]
    after = loader.state_dict()
    b = next(iter(loader))  # epoch 1 again, read ahead: stop after its first batch ...
    assert b["keys"] == epochs[1][0]
    assert [b["keys"] for b in loader] == epochs[1][1:]  # ... and the rest follows from the position
    assert run(ref, state=after)[0] == epochs[1]


def assert_equal_batch(a: dict, b: dict) -> None:
    """Every field equal: arrays by dtype and value, clips by their bytes."""
    assert a.keys() == b.keys()
    for name, value in a.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == b[name].dtype and np.array_equal(value, b[name]), name
        elif name == "video":
            assert [bytes(v) for v in value] == [bytes(v) for v in b[name]]
        else:
            assert value == b[name], name


def assert_same_batches(plain: Loader, general: Loader) -> None:
    assert plain.options.plain and not general.options.plain
    n = 0
    for a, b in zip(plain, general, strict=True):
        assert_equal_batch(a, b)
        n += 1
    assert n > 2


def test_plain_batches_are_the_general_routes_batches(cat):
    """Bytes mode with nothing to run per sample is collated straight from the read buffers; a map that
    changes nothing sends the same samples through the general route, with the same batches."""
    ref, _ = cat
    assert_same_batches(
        Loader(ref, decode="bytes", batch_size=3, seed=5),
        Loader(ref, decode="bytes", batch_size=3, seed=5, map=lambda s, rng: s),
    )


def test_worker_threads_share_one_set_of_readers_and_one_preparer(cat):
    """Threads starting together get the same per-process readers and preparer (each used to make its own,
    and the first batch's codec tags came from a preparer the batch no longer saw: None)."""
    import threading

    loader = Loader(cat[0], decode="bytes", batch_size=3).open()
    barrier, got = threading.Barrier(8), []

    def grab():
        barrier.wait()
        got.append(loader._io())

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(readers) for readers, _ in got}) == 1 and len({id(p) for _, p in got}) == 1
    assert None not in next(iter(Loader(cat[0], decode="bytes", batch_size=3, num_workers=4)))["codec_tag"]


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
    assert sorted(seen) == sorted(r["key"] for r in index_rows(ref, vid))


def test_a_mixture_is_deterministic_resumable_and_reepochs(cat, wds_catalog):
    ref, _ = cat
    other = str(wds_catalog[0])

    def take(n, state=None, per="batch"):
        m = Mixture([(ref, None, 0.7), (other, None, 0.3)], per=per, decode="bytes", batch_size=1, seed=2)
        if state:
            m.load_state_dict(state)
        out = []
        for b in m:
            out.append((b["source"][0], b["keys"][0]))
            if len(out) == n:
                return out, m.state_dict()

    for per in ("batch", "sample"):
        full, _ = take(200, per=per)
        head, state = take(77, per=per)
        tail, _ = take(123, state, per=per)
        assert head + tail == full
        share = Counter(s for s, _ in full)[0] / len(full)
        assert abs(share - 0.7) < 0.02
        assert len({k for s, k in full if s == 1}) < Counter(s for s, _ in full)[1]  # source 1 re-epoched
    close = Mixture([(ref, None, 0.7000000001), (other, None, 0.3)], decode="bytes", batch_size=1, seed=2)
    with pytest.raises(UsageError, match=r"weight 0\.7, loader has version \w+ weight 0\.700000000\d+"):
        close.load_state_dict(state)  # (both read "weight 0.7": a refusal no one could act on)


def test_a_stop_mixture_ends_when_a_source_runs_out(cat, wds_catalog):
    ref, _ = cat
    m = Mixture([(ref, None, 0.5), (str(wds_catalog[0]), None, 0.5)], decode="bytes", batch_size=1, policy="stop")
    got = [b["source"][0] for b in m]
    small = len(index_rows(str(wds_catalog[0]), wds_catalog[1]))
    assert got.count(1) == small and 0 < got.count(0) <= small + 2


def test_mixing_per_sample_mixes_sources_within_batches_and_keeps_each_sample_once(cat, wds_catalog):
    ref, _vid = cat
    other, ovid = str(wds_catalog[0]), wds_catalog[1]
    m = Mixture(
        [(ref, None, 0.5), (other, None, 0.5)], per="sample", decode="bytes", batch_size=4, seed=3, policy="stop"
    )
    batches = list(m)
    assert any(len(set(b["source"])) == 2 for b in batches)
    by_source = {0: [], 1: []}
    for b in batches:
        for s, k in zip(b["source"], b["keys"]):
            by_source[s].append(k)
    small = sorted(r["key"] for r in index_rows(other, ovid))
    assert sorted(by_source[1]) == small  # the source that ran out gave each sample exactly once
    assert len(set(by_source[0])) == len(by_source[0])


def test_restore_refuses_other_data_or_order_naming_the_option(cat, wds_catalog):
    ref, _ = cat
    _, state = run(ref, n=1)
    with pytest.raises(UsageError, match="checkpoint has seed=5, loader has seed=6"):
        Loader(ref, decode="bytes", batch_size=3, seed=6).load_state_dict(state)
    for name, value in (
        ("batch_size", 4),
        ("block_size", 8),
        ("block_window", 2),
        ("shuffle", "blocks"),
        ("frame_stride", 2),
        ("bucket_by", "length"),
    ):
        mode = {"resize": (8, 8)} if name == "frame_stride" else {"decode": "bytes"}  # (a stride needs frames)
        with pytest.raises(UsageError, match=f"checkpoint has {name}="):
            Loader(ref, **mode, **{"batch_size": 3, "seed": 5, name: value}).load_state_dict(state)
    with pytest.raises(UsageError, match="checkpoint has source 0 = version"):
        Loader(str(wds_catalog[0]), decode="bytes", batch_size=3, seed=5).load_state_dict(state)
    # what may change on resume: the partition, threads, decoding, verification, prefetch
    Loader(
        ref, batch_size=3, seed=5, world_size=2, rank=1, num_workers=0, verify="shard", prefetch=1, resize=(8, 8)
    ).load_state_dict(state)


def test_a_checkpoint_names_data_by_content_so_a_moved_catalog_resumes(cat, tmp_path, monkeypatch):
    import shutil

    ref, _ = cat
    first, state = run(ref, n=2)
    moved = tmp_path / "elsewhere" / "cat"
    shutil.copytree(ref, moved)
    monkeypatch.chdir(moved.parent)
    full, _ = run(ref)
    assert first + run("./cat", state=state)[0] == full
    assert first + run("cat", state=state)[0] == full


def test_decoded_frames_with_stride_resize_and_buckets(cat):
    ref, vid = cat
    rows = {r["key"]: r for r in index_rows(ref, vid)}
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
    rows = index_rows(ref, vid)
    assert sorted(seen) == sorted(r["key"] for r in rows)
    stats = loader.stats()
    assert 0 <= stats["padding_fraction"] < 1 and stats["samples"] == len(seen)


def test_stats_count_what_was_delivered_not_what_was_built_ahead(cat):
    """The loader builds batches ahead (into the next epoch too); those were counted as delivered, so an
    epoch's stats said more batches and samples than the loop received, and an early stop more still."""
    ref, _ = cat
    # (hashing: its batches are always built ahead)
    loader = Loader(ref, decode="bytes", batch_size=2, seed=3, num_workers=2, prefetch=6, verify="sample")
    got = [len(b["keys"]) for b in loader]
    first = loader.stats()
    assert (first["batches"], first["samples"]) == (len(got), sum(got))
    b = next(iter(loader))  # the next epoch, left after one batch
    after = loader.stats()
    assert (after["batches"], after["samples"]) == (len(got) + 1, sum(got) + len(b["keys"]))
    assert sum(t.get("batches", 0) for t in after["threads"].values()) >= after["batches"]  # the work done


def test_batches_carry_whole_samples(cat):
    ref, vid = cat
    rows = {r["key"]: r for r in index_rows(ref, vid)}
    b = next(iter(Loader(ref, decode="bytes", batch_size=4, seed=2, text=True)))
    for i, k in enumerate(b["keys"]):
        row = rows[k]
        assert (b["title"][i], b["player"][i], b["session_id"][i]) == (row["title"], row["player"], row["session_id"])
        assert b["conditions"][i] == dict(row["conditions"])
        assert (b["codec"][i], b["width"][i], b["height"][i], b["container"][i]) == (
            row["codec"],
            row["width"],
            row["height"],
            "mp4",
        )
        assert len(b["text"][i]) == row["text_events"] and all("text" in e for e in b["text"][i])
        assert bytes(b["video"][i])[4:8] == b"ftyp"  # an MP4 a GPU decoder can be handed as is
    vocabulary = Catalog.open(ref).manifest(vid).vocabulary
    assert b["actions"].shape[2] == len(vocabulary.controls) and b["telemetry"].shape[2] == len(vocabulary.telemetry)


def test_clip_frames_crops_are_seeded_resumable_and_aligned(cat):
    ref, _vid = cat
    kw = dict(batch_size=2, seed=4, resize=(16, 16), clip_frames=6, frame_stride=2)
    a = list(Loader(ref, **kw))
    b = list(Loader(ref, **kw))
    assert all(
        np.array_equal(x["frames"], y["frames"]) and np.array_equal(x["timestamps"], y["timestamps"])
        for x, y in zip(a, b)
    )
    assert all(x["frames"].shape[1] == 6 for x in a)
    full = Loader(ref, batch_size=1, seed=4, resize=(16, 16), shuffle="none")
    whole = {bt["keys"][0]: bt for bt in full}
    for x in a:  # the crop is the same frames and rows as slicing the whole clip at its timestamps
        for i, k in enumerate(x["keys"]):
            ts = whole[k]["timestamps"][0]
            at = np.searchsorted(ts, x["timestamps"][i][0])
            assert np.array_equal(x["timestamps"][i], ts[at : at + 12 : 2])
            assert np.array_equal(x["frames"][i], whole[k]["frames"][0][at : at + 12 : 2])
            assert np.array_equal(x["actions"][i], whole[k]["actions"][0][at : at + 12 : 2])


def test_a_crop_delivers_the_text_lines_of_the_time_its_frames_stand_for(cat):
    """Actions, telemetry, timestamps and audio were cut to the crop; text came whole, lines seconds away
    from the frames delivered with them."""
    ref, _ = cat
    whole = {b["keys"][0]: b["text"][0] for b in Loader(ref, batch_size=1, seed=4, resize=(16, 16), text=True)}
    seen = kept = 0
    for b in Loader(ref, batch_size=2, seed=4, resize=(16, 16), clip_frames=4, frame_stride=2, text=True):
        for key, ts, lines in zip(b["keys"], b["timestamps"], b["text"]):
            step = (ts[1] - ts[0]) / 2 if len(ts) > 1 else 0.0
            inside = [e for e in whole[key] if ts[0] - 1e-9 <= e["t"] < ts[-1] + 2 * step + 1e-9]
            assert lines == inside
            seen += len(whole[key])
            kept += len(lines)
    assert seen > kept  # some lines fell outside the crops


def test_clips_cut_by_max_frames_are_counted_as_truncated(cat):
    """The option says "counted": stats()["truncated"] stayed 0 (only packing counted)."""
    from dsbuild.loader.crop import cut_by_max_frames

    ref, _ = cat
    loader = Loader(ref, batch_size=2, seed=4, resize=(16, 16), max_frames=10, frame_stride=2)
    lengths = [int(n) for b in loader for n in b["lengths"]]
    cut = loader.stats()["truncated"]
    assert cut == sum(n == 10 for n in lengths) and cut > 0
    assert cut_by_max_frames(21, 2, None, 10) and not cut_by_max_frames(20, 2, None, 10)  # ceil(21 / 2) = 11
    assert not cut_by_max_frames(40, 1, 6, 10)  # a crop to 6 is asked for, not a cut


def test_map_runs_per_sample_with_a_seed_that_survives_resume(cat):
    ref, _ = cat

    def jitter(sample, rng):
        sample["actions"] = sample["actions"] + rng.normal(size=sample["actions"].shape).astype(np.float32)
        sample["noise"] = float(rng.random())
        return sample

    def take(n=None, state=None):
        loader = Loader(ref, decode="bytes", batch_size=2, seed=9, map=jitter)
        if state:
            loader.load_state_dict(state)
        out = []
        for b in loader:
            out.append(b["actions"].copy())
            if n and len(out) == n:
                break
        return out, loader.state_dict()

    full, _ = take()
    head, state = take(3)
    tail, _ = take(state=state)
    assert all(np.array_equal(x, y) for x, y in zip(head + tail, full)) and len(head + tail) == len(full)
    plain = [b["actions"] for b in Loader(ref, decode="bytes", batch_size=2, seed=9)]
    assert not np.array_equal(plain[0], full[0])


def test_a_corrupt_sample_is_replaced_the_same_way_on_every_rank(cat_copy):
    ref, vid = cat_copy
    victim = index_rows(ref, vid)[4]
    shard = f"{ref}/{victim['shard']}"
    data = bytearray(Path(shard).read_bytes())
    video_at = payload_offsets(victim["member_bytes"])[1]
    data[victim["byte_offset"] + video_at + 100] ^= 0xFF  # inside the sample's video member
    Path(shard).write_bytes(bytes(data))
    runs = []
    for verify in ("sample", "shard", "sample"):
        per_rank = []
        for rank in range(2):
            loader = Loader(ref, decode="bytes", batch_size=3, seed=5, rank=rank, world_size=2, verify=verify)
            per_rank.append([k for b in loader for k in b["keys"]])
            found = [k.split(":")[0] for k in loader.stats()["corrupt_keys"]]
            # the victim only (found again when the read-ahead into the next epoch reaches it)
            assert set(found) <= {victim["key"]} and loader.stats()["corrupt"] == len(found)
        runs.append(per_rank)
    assert runs[0] == runs[1] == runs[2]
    delivered = runs[0][0] + runs[0][1]
    assert victim["key"] not in delivered and len(delivered) == len(index_rows(ref, vid))
    unverified = [k for b in Loader(ref, decode="bytes", batch_size=3, seed=5, verify=False) for k in b["keys"]]
    assert victim["key"] in unverified  # verify=False trusts the bytes: nothing is replaced


def test_when_every_substitute_is_damaged_the_loader_stops_loudly(cat_copy):
    ref, vid = cat_copy
    for row in index_rows(ref, vid):
        path = f"{ref}/{row['shard']}"
        data = bytearray(Path(path).read_bytes())
        data[row["byte_offset"] + 1024] ^= 0x01
        Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="substitute"):
        list(Loader(ref, decode="bytes", batch_size=2, max_replacements=3))


def test_numpy_by_default_and_torch_tensors_on_cpu(cat):
    torch = pytest.importorskip("torch")
    ref, _ = cat
    b = next(iter(Loader(ref, batch_size=2, resize=(8, 8))))
    assert isinstance(b["frames"], np.ndarray)
    t = next(iter(Loader(ref, batch_size=2, resize=(8, 8), device="auto")))
    assert isinstance(t["frames"], torch.Tensor)
    assert t["frames"].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            next(iter(Loader(ref, batch_size=2, resize=(8, 8), device="cuda")))


def test_parquet_and_webdataset_versions_deliver_the_same_samples(wds_catalog, parquet_catalog):
    def by_key(ref):
        loader = Loader(str(ref), decode="bytes", batch_size=2, seed=1, verify="sample")
        out = {
            k: (bytes(v), a[:n].tobytes())
            for b in loader
            for k, v, a, n in zip(b["keys"], b["video"], b["actions"], b["lengths"])
        }
        stats = loader.stats()
        # bytes read: at least the clips' (a Parquet version's rows counted -1 each)
        assert stats["corrupt"] == 0 and stats["bytes"] >= sum(len(v) for v, _ in out.values()) > 0
        return out

    assert by_key(wds_catalog[0]) == by_key(parquet_catalog[0])


def test_sessions_with_different_controls_land_in_their_own_columns(captures, tmp_path):
    """Each session names its own controls; a batch puts them in the version's vocabulary, by name
    (the demo's Atari games have different action sets)."""
    import json
    import shutil

    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.core.executor import ExecutorSpec

    caps = tmp_path / "caps"
    shutil.copytree(captures, caps)
    own = {}
    for i, session in enumerate(sorted(p.parent for p in caps.rglob("session.json"))):
        controls = ("up", "fire") if i % 2 else ("fire", "down")
        (session / "actions.jsonl").write_text(
            "".join(json.dumps({"t": 0.0, "control": c, "value": 1.0}) + "\n" for c in controls)
        )
        own[json.loads((session / "session.json").read_text())["session_id"]] = set(controls)
    out = tmp_path / "cat"
    vid = convert(caps, out, ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1)).version_id
    vocab = Catalog.open(out).manifest(vid).vocabulary.controls
    assert sorted(vocab) == ["down", "fire", "up"]
    assert_same_batches(
        Loader(str(out), decode="bytes", batch_size=4, seed=3),
        Loader(str(out), decode="bytes", batch_size=4, seed=3, map=lambda s, rng: s),
    )
    seen = 0
    for b in Loader(str(out), decode="bytes", batch_size=4, seed=3):
        for i, session in enumerate(b["session_id"]):
            n = int(b["lengths"][i])
            for j, control in enumerate(vocab):
                expected = 1.0 if control in own[session] else 0.0
                assert (b["actions"][i, :n, j] == expected).all(), (session, control)
            seen += 1
    assert seen == len(index_rows(str(out), vid))


@pytest.mark.parametrize("dropped", [("telemetry.jsonl",), ("telemetry.jsonl", "actions.jsonl")])
def test_captures_without_telemetry_or_actions_deliver_empty_columns(captures, tmp_path, dropped):
    """Recorders often write video and inputs only (or video alone): the vocabulary is then empty and
    every batch carries [B, T, 0] arrays, in bytes mode on both routes and in frames mode."""
    import shutil

    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.core.executor import ExecutorSpec

    caps = tmp_path / "caps"
    shutil.copytree(captures, caps)
    for name in dropped:
        for f in caps.rglob(name):
            f.unlink()
    out = str(tmp_path / "cat")
    convert(caps, out, ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    assert_same_batches(
        Loader(out, decode="bytes", batch_size=4, seed=3),
        Loader(out, decode="bytes", batch_size=4, seed=3, map=lambda s, rng: s),
    )
    for b in Loader(out, decode="frames", batch_size=4, seed=3, resize=(16, 16), bucket_by="resolution"):
        n = len(b["keys"])
        assert b["telemetry"].shape[::2] == (n, 0) and b["timestamps"].shape[0] == n
        assert (b["actions"].shape[2] == 0) == ("actions.jsonl" in dropped)
        assert (b["timestamps"][:, 1] > b["timestamps"][:, 0]).all()


def test_a_version_made_before_blake3_was_recorded_still_verifies_each_sample(cat_copy):
    """Its index has no blake3 column: it reads as NULL and ``verify="sample"`` checks the sha256."""
    from pathlib import Path

    from tests.helpers import as_older_version

    ref, vid = cat_copy
    old = as_older_version(Path(ref), vid)
    assert set(Catalog.open(ref).index(old, ["blake3"])["blake3"].to_pylist()) == {None}
    at = f"{ref}@{old}"
    keys = [k for b in Loader(at, decode="bytes", batch_size=3, seed=5, verify="sample") for k in b["keys"]]
    assert sorted(keys) == sorted(r["key"] for r in index_rows(ref, vid))
    victim = index_rows(ref, vid)[2]
    shard = Path(ref) / victim["shard"]
    damaged = bytearray(shard.read_bytes())
    damaged[victim["byte_offset"] + payload_offsets(victim["member_bytes"])[1] + 50] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    loader = Loader(at, decode="bytes", batch_size=3, seed=5, verify="sample")
    assert victim["key"] not in [k for b in loader for k in b["keys"]]
    assert {k.split(":")[0] for k in loader.stats()["corrupt_keys"]} == {victim["key"]}
    assert all(k.count(victim["key"]) == 1 for k in loader.stats()["corrupt_keys"])  # (it was named twice)


@pytest.mark.parametrize("mix", ["batch", "sample"])
def test_the_checkpoint_after_an_epochs_last_batch_is_the_same_at_any_world_size(cat, mix):
    """Where an epoch's batches are not a multiple of the world size, the rank holding the last batch
    used to get the next epoch's start as its checkpoint: restored, "the rest of this epoch" delivered
    all of the next one, and a loop over E epochs ran E + 1."""
    ref, _ = cat
    opts = dict(decode="bytes", batch_size=4, seed=3, mix=mix)
    batches = len(list(Loader(ref, **opts)))
    states = {}
    for world in (1, 2, 3):
        if batches % world == 0 and world > 1:
            continue
        last = (batches - 1) % world
        mine = len(list(Loader(ref, rank=last, world_size=world, **opts)))
        loader = Loader(ref, rank=last, world_size=world, **opts)
        for k, _ in enumerate(loader, 1):
            if k == mine:  # its epoch's last batch consumed; the loop has not yet seen the end
                states[world] = loader.state_dict()
                break
        resumed = Loader(ref, rank=last, world_size=world, **opts)
        resumed.load_state_dict(states[world])
        assert resumed.epoch == 0 and list(resumed) == []  # the rest of epoch 0: nothing
        fresh = Loader(ref, rank=last, world_size=world, **opts)
        list(fresh)  # epoch 0
        assert [b["keys"] for b in resumed] == [b["keys"] for b in fresh]  # then both deliver epoch 1
    assert len(states) >= 2 and all(
        s["position"] == states[1]["position"] and s["cursors"] == states[1]["cursors"] for s in states.values()
    )


def test_a_restore_inside_a_running_loop_takes_effect_at_once(cat):
    """Rolling back mid-loop used to be undone: the loop went on with its old stream and wrote its own
    position over the restored one."""
    ref, _ = cat
    opts = dict(decode="bytes", batch_size=2, seed=4)
    loader = Loader(ref, **opts)
    stream, states = [], []
    for b in Loader(ref, **opts):
        stream.append(b["keys"])
    got = []
    for k, b in enumerate(loader):
        got.append(b["keys"])
        states.append(loader.state_dict())
        if k == 5:
            loader.load_state_dict(states[1])  # back to just after batch 1
        if len(got) == 8:
            break
    assert got == stream[:6] + stream[2:4]
    assert loader.state_dict() == states[3]


@pytest.mark.parametrize("mix", ["batch", "sample"])
@pytest.mark.parametrize("world", [1, 3])
def test_len_is_the_batches_this_rank_still_gets_this_epoch_at_any_point(cat, mix, world):
    ref, _ = cat
    opts = dict(decode="bytes", batch_size=2, seed=8, mix=mix, world_size=world, rank=world - 1)
    loader = Loader(ref, **opts)
    total = len(list(Loader(ref, **opts)))
    assert len(loader) == total
    for k, _ in enumerate(loader, 1):
        assert len(loader) == total - k
        if k == 3:
            break
    restored = Loader(ref, **opts)
    restored.load_state_dict(loader.state_dict())
    assert len(restored) == total - 3 == len(list(restored))
    # at the epoch's end (mix="sample" counted its last, partial planning chunk as not begun: len == total)
    whole = Loader(ref, **opts)
    for k, _ in enumerate(whole, 1):
        assert len(whole) == total - k
        end = whole.state_dict()  # after the last batch: taken before the loop moves on to the next epoch
    at_end = Loader(ref, **opts)
    at_end.load_state_dict(end)
    assert len(at_end) == 0 == len(list(at_end))


def test_sources_that_share_keys_get_their_own_map_draws(cat, wds_catalog):
    """Two datasets converted from captures with the same session names share sample keys: a per-sample
    seed of (seed, epoch, key) alone gave both the same augmentation."""
    ref, _ = cat
    other = str(wds_catalog[0])

    def draw(sample, rng):  # the sample's first draw, carried in its actions (a batch keeps only known fields)
        sample["actions"] = np.full_like(sample["actions"], rng.random())
        return sample

    def draws():
        m = Mixture(
            [(ref, None, 0.5), (other, None, 0.5)],
            per="sample",
            decode="bytes",
            batch_size=4,
            seed=3,
            policy="stop",
            map=draw,
        )
        return {(s, k): float(a[0, 0]) for b in m for s, k, a in zip(b["source"], b["keys"], b["actions"])}

    got = draws()
    shared = {k for s, k in got if s == 0} & {k for s, k in got if s == 1}
    assert len(shared) >= 3  # the fixture's two versions do share keys
    assert all(got[(0, k)] != got[(1, k)] for k in shared)
    assert draws() == got  # and each source's draws are still a function of the seed

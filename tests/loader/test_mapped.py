"""Shards read through memory mappings (``read="map"``, the default unless ``verify="sample"``) deliver
exactly what copied reads (``read="pread"``) deliver, as read-only views that outlive the shard's place in
the LRU; a shard file that is not its record's size is read, never mapped (a mapped page past the end of
a file is a SIGBUS that kills the process; a short read is damage the loader replaces); a shard whose
mapped bytes do not hash to their record is not trusted; and who builds a batch follows the consumer."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from dsbuild.core.errors import UsageError
from dsbuild.formats.sample import MEMBERS
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader
from dsbuild.loader.files import ShardFiles
from dsbuild.loader.source import Source

from .test_loader import assert_equal_batch, assert_same_batches


def mapped_view(v: memoryview) -> bool:
    return type(v.obj).__name__ == "MappedShard"  # ``files.map_file``'s block


def epoch(ref: str, **kw) -> tuple[list[dict], dict]:
    """Every batch of one epoch, kept (so every view they hold must stay valid), and the loader's stats."""
    with Loader(ref, **{"batch_size": 3, "seed": 4, "decode": "bytes", **kw}) as loader:
        return list(loader), loader.stats()


def assert_equal_epochs(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 2
    for x, y in zip(a, b):
        assert_equal_batch(x, y)


@pytest.mark.parametrize(
    "kw",
    [
        dict(verify="none"),
        dict(verify="shard"),
        dict(verify="none", shuffle="blocks"),
        dict(decode="frames", resize=(24, 32), verify="none"),
    ],
)
def test_mapped_and_copied_reads_deliver_the_same_batches(cat, kw):
    ref, _ = cat
    mapped, _ = epoch(ref, **kw)
    if kw.get("decode") != "frames":
        assert all(mapped_view(v) for b in mapped for v in b["video"])
    copied, _ = epoch(ref, read="pread", **kw)
    assert not any(mapped_view(v) for b in copied for v in b.get("video", []))
    assert_equal_epochs(mapped, copied)


def test_plain_batches_from_mapped_shards_are_the_general_routes_batches(cat):
    """With nothing to run per sample, batches are collated straight from the mappings (``collate_spans``);
    a map that changes nothing sends the same samples through the general route."""
    ref, _ = cat
    assert_same_batches(
        Loader(ref, decode="bytes", batch_size=3, seed=5, verify="none"),
        Loader(ref, decode="bytes", batch_size=3, seed=5, verify="none", map=lambda s, rng: s),
    )


def test_delivered_clips_are_read_only_and_outlive_the_lru(cat):
    ref, vid = cat
    assert len(Catalog.open(ref).manifest(vid).shards) > 3
    kept, _ = epoch(ref, verify="none", max_open_shards=1, num_workers=2)  # every shard evicted and remapped
    copied, _ = epoch(ref, verify="none", read="pread")
    assert_equal_epochs(kept, copied)
    with pytest.raises(TypeError):
        kept[0]["video"][0][:1] = b"x"
    for kw in ({"read": "pread"}, {"verify": "sample"}):  # copies, read-only all the same (they were writable)
        batches, _ = epoch(ref, **kw)
        assert all(v.readonly for b in batches for v in b["video"])


def test_state_after_names_what_to_use_for_the_loaders_own_batches(cat):
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3)
    with pytest.raises(UsageError, match="state_dict"):  # was a bare KeyError('state')
        loader.state_after(next(iter(loader)))


def test_a_shard_file_of_another_size_is_read_not_mapped(cat_copy):
    ref, _vid = cat_copy
    before, _ = epoch(ref, verify="none", read="pread")
    src = Source(ref).open()
    longer, shorter = (Path(ref) / src.shards[k].path for k in (0, 1))
    with open(longer, "ab") as f:  # the samples are where the index says; the mapping would be too long
        f.write(b"\0" * 5000)
    files = ShardFiles(src.catalog, src.shards, src.format, 4, verify_shards=False)
    assert files.mapped(0) is None and files.mapped(2) is not None
    files.close()
    after, stats = epoch(ref, verify="none")
    assert_equal_epochs(after, before) and stats["corrupt"] == 0
    shorter.write_bytes(shorter.read_bytes()[: shorter.stat().st_size // 2])  # mapped, reading it would SIGBUS
    damaged, stats = epoch(ref, verify="none")
    assert stats["corrupt"] > 0 and all("shard ends inside the sample" in k for k in stats["corrupt_keys"])
    assert sum(len(b["keys"]) for b in damaged) == sum(len(b["keys"]) for b in before)


def test_a_mapped_shard_whose_bytes_do_not_hash_to_its_record_is_not_trusted(cat_copy):
    ref, _ = cat_copy
    src = Source(ref).open()
    victim = int(np.flatnonzero(src.shard_id == 0)[0])
    path = Path(ref) / src.shards[0].path
    data = bytearray(path.read_bytes())
    at = int(src.byte_offset[victim] + src.payload_offsets[victim][1]) + 10  # inside its clip
    data[at] ^= 0xFF
    path.write_bytes(data)  # same size: mappable, but not the bytes the record hashes
    files = ShardFiles(src.catalog, src.shards, src.format, 4, verify_shards=True)
    assert files.mapped(0) is None and files.mapped(1) is not None
    files.close()
    batches, stats = epoch(ref, verify="shard")
    assert stats["corrupt"] == 1 and src.keys[victim] in stats["corrupt_keys"][0]
    assert src.keys[victim] not in {k for b in batches for k in b["keys"]}


def test_read_must_be_map_or_pread(cat):
    with pytest.raises(UsageError, match="read must be one of"):
        Loader(cat[0], read="mmap")


def test_a_consumer_faster_than_a_hand_off_builds_plain_batches_itself_and_a_slow_one_gets_them_ahead(cat):
    """Timing only decides who builds; the batches are the same either way."""
    ref, _ = cat

    def run(pause: float) -> tuple[list, dict]:
        with Loader(ref, decode="bytes", batch_size=2, seed=3, verify="none", num_workers=2) as loader:
            keys = []
            for _ in range(3):
                for b in loader:
                    keys.append(b["keys"])
                    time.sleep(pause)
            return keys, loader.stats()["threads"]

    fast_keys, fast = run(0.0)
    slow_keys, slow = run(0.02)
    assert fast_keys == slow_keys

    def share(threads: dict, mine) -> float:
        total = sum(t.get("batches", 0) for t in threads.values())
        return sum(t.get("batches", 0) for name, t in threads.items() if mine(name)) / total

    # (On a loaded machine a consumer that never pauses is still preempted between batches, and that time
    # away can look like a training step: it builds fewer of its batches itself, never more than a slow one.)
    mine = share(fast, lambda name: name == "MainThread")
    assert mine > share(slow, lambda name: name == "MainThread") and mine > 0
    assert share(slow, lambda name: name.startswith("dsbuild-load")) > 0.5


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_kept_clips_hold_no_file_descriptors(cat):
    """Python's mmap keeps a duplicate descriptor per mapping: clips kept from every shard of an epoch
    held one descriptor per shard whatever max_open_shards said, past ``ulimit -n`` on big versions."""
    import gc

    ref, vid = cat
    shards = len(Catalog.open(ref).manifest(vid).shards)
    gc.collect()
    base = _open_fds()
    with Loader(ref, decode="bytes", batch_size=2, seed=1, verify="none", max_open_shards=1) as loader:
        kept = list(loader)
        assert len({id(v.obj) for b in kept for v in b["video"]}) >= shards  # a mapping per shard, alive
        assert _open_fds() - base <= 3, "descriptors held by kept clips"
    assert sum(len(b["keys"]) for b in kept) == len(Source(ref).open())


SHORTENED = """
import os, sys
from dsbuild.loader import Loader
from dsbuild.loader.source import Source
ref, verify = sys.argv[1], sys.argv[2]
src = Source(ref).open()
with Loader(ref, decode="bytes", batch_size=2, seed=1, verify=verify, num_workers=1) as loader:
    first = sum(len(b["keys"]) for b in loader)  # every shard mapped (and, with verify="shard", trusted)
    for rec in src.shards[:2]:  # another program cuts two shards short in place
        path = os.path.join(ref, rec.path)
        os.truncate(path, os.path.getsize(path) // 2)
    second = sum(len(b["keys"]) for b in loader)
    print(first, second, loader.stats()["corrupt"])
"""


@pytest.mark.parametrize("verify", ["none", "shard"])
def test_a_mapped_shard_cut_short_in_place_is_read_as_damage_not_a_crash(cat_copy, verify):
    """Touching a mapped page past a file's new end is a SIGBUS that kills the process; the loader looks
    at the file before each read through its mapping and reads a shard cut short instead."""
    import subprocess
    import sys

    ref, _ = cat_copy
    r = subprocess.run([sys.executable, "-c", SHORTENED, ref, verify], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (-7: SIGBUS): {r.stderr[-2000:]}"
    first, second, corrupt = map(int, r.stdout.split())
    assert first == second == len(Source(ref).open()) and corrupt > 0


def test_a_mapped_shard_whose_file_is_removed_is_still_served(cat_copy):
    """A shard cache evicting a cached copy (or gc removing a file) while it is mapped: the mapping still
    shows the bytes it was proven by; the loader must not fail on the missing path."""
    ref, _ = cat_copy
    with Loader(ref, decode="bytes", batch_size=2, seed=1, verify="shard") as loader:
        first = [b["keys"] for b in loader]
        for rec in Source(ref).open().shards:
            (Path(ref) / rec.path).unlink()
        second = [b["keys"] for b in loader]
        assert sorted(k for b in second for k in b) == sorted(k for b in first for k in b)
        assert loader.stats()["corrupt"] == 0


@pytest.mark.parametrize("kw", [dict(read="map"), dict(read="pread"), dict(read="map", shuffle="global", seed=3)])
def test_a_sessions_first_sample_with_damaged_json_is_refused_whichever_sample_is_read_first(cat_copy, kw):
    """Bytes mode takes a session's codec facts from the JSON of its first sample in index order; with
    verify="none" nothing else reads that JSON, so a damaged one is damage like any other: refused and
    replaced, whatever order the samples come in and whichever thread reads one of them first."""
    ref, _ = cat_copy
    src = Source(ref).open()
    victim = 0  # (the first sample of its session in index order)
    at = int(src.byte_offset[victim] + src.payload_offsets[victim][MEMBERS.index("json")])
    with open(Path(ref) / src.shards[int(src.shard_id[victim])].path, "r+b") as f:
        f.seek(at)
        f.write(b"x")  # same size: mapped, and its hash is not asked
    for _ in range(2):
        batches, stats = epoch(ref, **{"verify": "none", "shuffle": "none", **kw})
        assert stats["corrupt"] == 1 and "invalid JSON" in stats["corrupt_keys"][0]
        assert src.keys[victim] in stats["corrupt_keys"][0]
        assert src.keys[victim] not in {k for b in batches for k in b["keys"]}
        assert sum(len(b["keys"]) for b in batches) == len(src.keys)

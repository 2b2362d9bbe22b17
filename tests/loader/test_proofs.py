"""The machine's proof cache: a shard hashed to its record (``verify="shard"``) and found safe by the
shard-safety checks is trusted by later loaders — other ranks, workers and jobs on the machine — without
hashing or checking it again, as long as its file is unchanged (device, inode, size, mtime and ctime); a
file changed in place since is proven again, and its damage found. The same holds for what opening
derives from a version's index."""

from __future__ import annotations

import os
import sqlite3
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from dsbuild.core import hashcache
from dsbuild.core.errors import LineageError
from dsbuild.loader.source import DERIVED_ARRAYS, Source
from dsbuild.split import SplitOptions, make_split

from .test_mapped import assert_equal_epochs, epoch


def settled(root: str) -> None:
    """Wait out the racy window after the catalog's last change (a proof of a file changed within
    ``RACY_NS`` before it began is not kept: the kernel's file clock may not have ticked since)."""
    newest = max(p.stat().st_ctime_ns for p in Path(root).rglob("*"))
    left = newest + hashcache.RACY_NS - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9 + 0.01)  # (a condition on the file clock, not a wait for other work)


def shards(ref: str) -> int:
    return len(Source(ref).open().shards)


def shard_proofs(stats: dict) -> dict:
    """The shards' proof counts (an index's are tested below: whether one was kept depends on the racy
    window of the catalog's making)."""
    return {k: v for k, v in stats["proofs"].items() if not k.startswith("indexes_")}


def test_a_fact_is_kept_only_for_a_file_still_since_before_its_proof_began(tmp_path):
    f = tmp_path / "shard"
    f.write_bytes(b"x" * 100)
    ident = hashcache.identity(f.stat())
    hashcache.remember(ident, "safe racy", began_ns=ident[4] + hashcache.RACY_NS // 2)
    hashcache.remember(ident, "safe still", began_ns=ident[4] + hashcache.RACY_NS)
    assert not hashcache.known(ident, "safe racy") and hashcache.known(ident, "safe still")
    assert not hashcache.known(ident, "safe other")
    with open(f, "r+b") as w:  # written in place, same size: another ctime, another identity
        w.write(b"y")
    assert not hashcache.known(hashcache.identity(f.stat()), "safe still")


def test_a_later_loader_trusts_unchanged_shards_on_an_earlier_ones_proofs(cat_copy, monkeypatch):
    ref, _ = cat_copy
    n = shards(ref)
    settled(ref)
    first, stats = epoch(ref, verify="shard")
    assert shard_proofs(stats) == {"shards_hashed": n, "hashes_known": 0, "shards_checked": n, "checks_known": 0}
    later, stats = epoch(ref, verify="shard")
    assert shard_proofs(stats) == {"shards_hashed": 0, "hashes_known": n, "shards_checked": 0, "checks_known": n}
    assert_equal_epochs(later, first) and stats["corrupt"] == 0
    _, stats = epoch(ref, verify="none")  # (the checks' proof serves any verify level; "none" hashes nothing)
    assert shard_proofs(stats) == {"shards_hashed": 0, "hashes_known": 0, "shards_checked": 0, "checks_known": n}
    monkeypatch.setenv("DSBUILD_HASH_CACHE", "0")
    _, stats = epoch(ref, verify="shard")
    assert shard_proofs(stats) == {"shards_hashed": n, "hashes_known": 0, "shards_checked": n, "checks_known": 0}


def test_a_shard_changed_in_place_after_its_proof_is_proven_again_and_its_damage_found(cat_copy):
    ref, _ = cat_copy
    src = Source(ref).open()
    settled(ref)
    epoch(ref, verify="shard")  # proven and remembered
    victim = int(np.flatnonzero(src.shard_id == 0)[0])
    path = Path(ref) / src.shards[0].path
    st = path.stat()
    fd = os.open(path, os.O_WRONLY)  # the same file, one byte of a clip flipped, its mtime put back
    try:
        at = int(src.byte_offset[victim] + src.payload_offsets[victim][1]) + 10
        os.pwrite(fd, bytes([path.read_bytes()[at] ^ 0xFF]), at)
    finally:
        os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_ino == st.st_ino and path.stat().st_mtime_ns == st.st_mtime_ns
    batches, stats = epoch(ref, verify="shard")
    assert stats["proofs"]["shards_hashed"] == 1 and stats["proofs"]["hashes_known"] == len(src.shards) - 1
    assert stats["corrupt"] == 1 and src.keys[victim] in stats["corrupt_keys"][0]
    assert src.keys[victim] not in {k for b in batches for k in b["keys"]}


def test_a_member_header_forged_in_place_after_the_shards_check_is_refused(cat_copy):
    """verify="none" trusts the bytes, never the framing: the safety check's proof is one of the file it
    checked, so a header changed since (here a member made setuid) is checked again and refused."""
    ref, _ = cat_copy
    src = Source(ref).open()
    settled(ref)
    epoch(ref, verify="none")
    victim = int(np.flatnonzero(src.shard_id == 0)[0])
    path = Path(ref) / src.shards[0].path
    header = int(src.byte_offset[victim])  # its first member's tar header
    with open(path, "r+b") as f:
        f.seek(header)
        info = tarfile.TarInfo.frombuf(f.read(512), "utf-8", "strict")
        info.mode = 0o4755
        f.seek(header)
        f.write(info.tobuf(tarfile.USTAR_FORMAT))
    _, stats = epoch(ref, verify="none")
    assert stats["proofs"]["shards_checked"] == 1 and stats["corrupt"] == 1
    assert src.keys[victim] in stats["corrupt_keys"][0]


def test_a_check_proven_against_one_index_is_not_another_ones(cat_copy):
    """A split's loader checks its own rows of each shard (not the whole shard's tiling): the whole
    version's proof does not vouch for them, nor theirs for it."""
    ref, vid = cat_copy
    make_split(ref, vid, "main", SplitOptions(by="session_id", ratios="train=0.5,val=0.5"))
    settled(ref)
    _, whole = epoch(ref, verify="none")
    _, train = epoch(ref, verify="none", split="main/train")
    assert whole["proofs"]["shards_checked"] > 0 and train["proofs"]["checks_known"] == 0
    assert train["proofs"]["shards_checked"] > 0
    _, again = epoch(ref, verify="none", split="main/train")
    assert shard_proofs(again) == {
        **shard_proofs(train),
        "shards_checked": 0,
        "checks_known": train["proofs"]["shards_checked"],
    }


def derived(src: Source) -> dict:
    """Everything opening derived from the index and session records, comparable."""
    out = {name: getattr(src, name) for name in DERIVED_ARRAYS}
    out = {name: None if a is None else (a.dtype.str, a.shape, a.tobytes()) for name, a in out.items()}
    kept = None if src._kept is None else src._kept.to_pylist()
    return {
        **out,
        "keys": (src.keys.dtype, src.keys.tolist()),
        "rest": (src.shards, src.codecs, src.byte_range, src.sessions, kept, src.sha256, src.blake3),
    }


def test_a_later_open_takes_what_an_earlier_one_derived_from_the_unchanged_index(cat_copy, monkeypatch):
    """Opening reads the index (Parquet), checks it and derives the loader's columns: once per machine
    and version. The next open of the unchanged files takes the same columns from the cache, for the
    whole version and for a split; with the cache off, each open reads the index."""
    ref, vid = cat_copy
    make_split(ref, vid, "main", SplitOptions(by="session_id", ratios="train=0.5,val=0.5"))
    settled(ref)
    for split in (None, "main/train"):
        monkeypatch.setenv("DSBUILD_HASH_CACHE", "0")
        read = Source(ref, split).open()
        monkeypatch.delenv("DSBUILD_HASH_CACHE")
        first, later = Source(ref, split).open(), Source(ref, split).open()
        assert not read.from_cache and not first.from_cache and later.from_cache
        assert derived(later) == derived(read)
    _, stats = epoch(ref, verify="none")
    assert (stats["proofs"]["indexes_read"], stats["proofs"]["indexes_known"]) == (0, 1)


def test_an_index_changed_in_place_after_an_open_is_read_again_and_found_altered(cat_copy):
    ref, vid = cat_copy
    settled(ref)
    src = Source(ref).open()
    assert Source(ref).open().from_cache
    path = Path(ref) / "versions" / vid / src.manifest.index.path
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:  # the same file and size, its mtime put back
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(LineageError, match="does not match the sha256 pinned"):
        Source(ref).open()


def test_a_damaged_note_of_an_open_is_not_taken(cat_copy):
    ref, vid = cat_copy
    settled(ref)
    src = Source(ref).open()
    whole = derived(src)
    index = (Path(ref) / "versions" / vid / src.manifest.index.path).stat()
    with sqlite3.connect(Path(os.environ["DSBUILD_CACHE"]) / "sources.sqlite") as db:
        where = "WHERE dev = ? AND ino = ?", (index.st_dev, index.st_ino)
        (value,) = db.execute(f"SELECT value FROM notes {where[0]}", where[1]).fetchone()
        damaged = bytearray(value)
        damaged[-1] ^= 0xFF
        db.execute(f"UPDATE notes SET value = ? {where[0]}", (bytes(damaged), *where[1]))
    again = Source(ref).open()
    assert not again.from_cache and derived(again) == whole

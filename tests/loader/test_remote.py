"""The loader reads a catalog on object storage (an fsspec URL; ``memory://`` here) through the verified
shard cache, and delivers the same stream and bytes as from the local copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsbuild.loader import Loader

fsspec = pytest.importorskip("fsspec")


def test_the_loader_reads_an_fsspec_catalog_like_the_local_one(cat, tmp_path, monkeypatch):
    ref, vid = cat
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    root = Path(ref)
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".tmp" not in p.parts:
            fs.pipe(f"/loader-remote/{p.relative_to(root).as_posix()}", p.read_bytes())

    def stream(where):
        return [
            (k, bytes(v))
            for b in Loader(where, decode="bytes", batch_size=2, seed=3)
            for k, v in zip(b["keys"], b["video"])
        ]

    assert stream("memory://loader-remote") == stream(ref)
    assert stream(f"memory://loader-remote@{vid[:10]}") == stream(ref)


def _upload(ref: str, prefix: str) -> str:
    fs = fsspec.filesystem("memory")
    root = Path(ref)
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".tmp" not in p.parts:
            fs.pipe(f"{prefix}/{p.relative_to(root).as_posix()}", p.read_bytes())
    return f"memory://{prefix}"


@pytest.mark.parametrize("verify", ["shard", "sample"])
def test_a_cached_shard_copy_damaged_on_local_disk_is_fetched_again(cat, tmp_path, monkeypatch, verify):
    """The cache trusted a copy of the right size: one damaged on local disk had its samples replaced every
    epoch (and failed every later process) until the cache happened to evict it."""
    from dsbuild.lineage.catalog import Catalog

    ref, vid = cat
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    url = _upload(ref, f"/loader-damaged-copy-{verify}")

    def stream(loader):  # an epoch's samples, whatever its order
        return sorted((k, bytes(v)) for b in loader for k, v in zip(b["keys"], b["video"]))

    want = stream(Loader(ref, decode="bytes", batch_size=2, seed=3))
    # fills the cache; verify="none": its read-ahead into the next epoch must not judge the copies damaged below
    fill = Loader(url, decode="bytes", batch_size=2, seed=3, verify="none")
    assert stream(fill) == want
    fill.close()
    index = Catalog.open(ref).index(vid).to_pylist()
    firsts = {}
    for row in index:
        if row["shard"] not in firsts or row["byte_offset"] < firsts[row["shard"]]["byte_offset"]:
            firsts[row["shard"]] = row
    for shard, row in firsts.items():
        copy = tmp_path / "cache" / "shards" / Path(shard).name
        at = row["byte_offset"] + 1024 + -(-row["member_bytes"][0] // 512) * 512 + 100  # in its video
        with open(copy, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    loader = Loader(url, decode="bytes", batch_size=2, seed=3, verify=verify)
    first, second = stream(loader), stream(loader)
    corrupt = {k.split(":")[0] for k in loader.stats()["corrupt_keys"]}
    assert second == want and (first == want) == (verify == "shard")
    # (a damaged sample's stand-in may be another shard's damaged sample: counted again, same key)
    assert corrupt == ({row["key"] for row in firsts.values()} if verify == "sample" else set())
    assert stream(Loader(url, decode="bytes", batch_size=2, seed=3, verify="sample")) == want  # a later process

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
        return [(k, bytes(v)) for b in Loader(where, decode="bytes", batch_size=2, seed=3) for k, v in
                zip(b["keys"], b["video"])]

    assert stream("memory://loader-remote") == stream(ref)
    assert stream(f"memory://loader-remote@{vid[:10]}") == stream(ref)

"""Loader fixtures: small real catalogs converted from the shared synthetic captures."""

from __future__ import annotations

import json
import shutil

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader


@pytest.fixture(scope="session")
def cat(captures, tmp_path_factory):
    """(path, version id): ~25 samples of 1-2 s clips across 6 sessions (mixed resolutions and rates),
    in ~15 small shards (64 KiB), so shard-level behaviour (open files, coalescing) is exercised."""
    out = tmp_path_factory.mktemp("loader") / "catalog"
    r = convert(captures, out, ConvertConfig(clip_seconds=1.0, shard_size=1 << 16), executor=ExecutorSpec(workers=1))
    return str(out), r.version_id


@pytest.fixture
def cat_copy(cat, tmp_path):
    """A private, writable copy of ``cat`` (path, version id)."""
    dst = tmp_path / "catalog"
    shutil.copytree(cat[0], dst)
    return str(dst), cat[1]


def index_rows(path: str, version_id: str) -> list[dict]:
    return Catalog.open(path).index(version_id).to_pylist()


def run(ref, n=None, state=None, **kw) -> tuple[list, dict]:
    """Keys of ``n`` batches (the rest of the epoch if None) from a fresh bytes-mode loader, optionally
    restored from ``state`` (passed through JSON, as a checkpoint file would be)."""
    loader = Loader(ref, **{"decode": "bytes", "batch_size": 3, "seed": 5, **kw})
    if state is not None:
        loader.load_state_dict(json.loads(json.dumps(state)))
    out = []
    for b in loader:
        out.append(b["keys"])
        if n is not None and len(out) == n:
            break
    return out, loader.state_dict()

"""Shared fixtures: real captures encoded with PyAV and real catalogs converted from them.

Session-scoped so the suite encodes each set once; tests that change files copy them first.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.samples.synthetic import generate

SLOW = {"test_make_demo_runs_end_to_end", "test_every_document_block_runs_as_written"}
# Modules that take a minute or more of one process on 2 loaded cores, put first. Under ``-n`` pytest-xdist
# deals modules out by their number of tests, most first, so this order only breaks its ties there. (Dealing
# these out first, with --no-loadscope-reorder, was tried: beside two busy loops pytest took 756-760 s
# against 658 s, as the heaviest modules then all run at once.)
LONG_FIRST = ("test_readme.py", "test_model.py", "test_faults.py", "test_interop_docs.py", "test_demo.py")
S3_MODULES = {"test_cli_s3.py", "test_object_store.py", "test_remote.py"}
EXTRA_MODULES = {  # module -> the optional extra its tests need (each skips with the reason without it)
    "test_torch.py": "torch",
    "test_torch_workers.py": "torch",
    "test_jax.py": "jax",
    "test_ray.py": "ray",
    "test_ray_data.py": "ray",
    "test_atari.py": "atari",
    "test_energon.py": "peers",
    "test_litdata.py": "peers",
    "test_mds.py": "peers",
    "test_hf.py": "peers",
    "test_wids.py": "peers",
    "test_interop_docs.py": "peers",
}


def pytest_configure(config):
    """Ctrl-C at its default in the suite's process, so every process a test starts can be interrupted:
    a suite started in the background (``make test &``, a CI runner's job) inherits SIGINT ignored, and
    dsbuild keeps an ignored SIGINT ignored (as it should), so the interruption tests would wait out
    their whole work and fail."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    """Markers by what a test uses, so that ``-m 'not s3'`` or ``-m 'not slow'`` select without a list to
    keep by hand in every module; the ``LONG_FIRST`` modules first."""
    for item in items:
        if item.originalname in SLOW:
            item.add_marker(pytest.mark.slow)
        if "s3" in getattr(item, "fixturenames", ()) or item.path.name in S3_MODULES:
            item.add_marker(pytest.mark.s3)
        if item.path.name in EXTRA_MODULES:
            item.add_marker(getattr(pytest.mark, EXTRA_MODULES[item.path.name]))
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # (stable: the rest keep their order)


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The suite, and every dsbuild it starts, uses a cache of its own: the machine's (~/.cache/dsbuild)
    is shared with any other dsbuild running meanwhile (the hash cache's sqlite, the shard cache); a CI
    failure of the incremental-build test coincided with other builds using it."""
    before = os.environ.get("DSBUILD_CACHE")
    os.environ["DSBUILD_CACHE"] = str(tmp_path_factory.mktemp("dsbuild-cache"))
    yield
    if before is None:
        os.environ.pop("DSBUILD_CACHE", None)
    else:
        os.environ["DSBUILD_CACHE"] = before


@pytest.fixture(scope="session")
def captures(tmp_path_factory) -> Path:
    """Six clean synthetic sessions of 6 s (several titles, players, resolutions, 30/60 fps)."""
    root = tmp_path_factory.mktemp("captures")
    generate(root, sessions=6, seconds=6.0, seed=11)
    return root


@pytest.fixture(scope="session")
def wds_catalog(captures, tmp_path_factory) -> tuple[Path, str]:
    """(catalog path, version id) of the clean captures as WebDataset shards, 3 s clips, ~400 kB shards."""
    out = tmp_path_factory.mktemp("wds") / "catalog"
    r = convert(
        captures,
        out,
        ConvertConfig(format="webdataset", clip_seconds=3.0, shard_size=400_000),
        executor=ExecutorSpec(workers=1),
    )
    return out, r.version_id


@pytest.fixture(scope="session")
def parquet_catalog(captures, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("pq") / "catalog"
    r = convert(
        captures,
        out,
        ConvertConfig(format="parquet", clip_seconds=3.0, shard_size=400_000),
        executor=ExecutorSpec(workers=1),
    )
    return out, r.version_id


@pytest.fixture
def copy_captures(captures, tmp_path):
    """A private, writable copy of the clean captures."""

    def make(name: str = "captures") -> Path:
        dst = tmp_path / name
        shutil.copytree(captures, dst, symlinks=True)
        return dst

    return make


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 endpoint (moto) on 127.0.0.1 with a bucket "data"; the environment points at it."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.s3server import s3_endpoint

    with s3_endpoint(tmp_path_factory.mktemp("cache")) as proxy:
        yield proxy

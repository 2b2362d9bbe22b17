"""Fixtures of the bench tests: a private copy of the shared WebDataset catalog (its folder name holds
markup, to prove the HTML page escapes it) with a split set, and small, fast options."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsbuild.bench import BenchOptions


def _device() -> str:
    """torch's CPU device where the torch extra is installed; "auto" (numpy arrays) where it is not: the
    bench runs either way, and these tests must not fail for an extra the bench does not need."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "auto"
    return "cpu"


DEVICE = _device()

# Bytes mode is fast (batches in milliseconds), so short budgets still give the gate its rounds.
BYTES = {
    "decode": "bytes",
    "batch_size": 2,
    "step_ms": 0,
    "device": DEVICE,
    "duration": 3.0,
    "rounds": 3,
    "compare": ("raw", "sha256"),
}
# Frames mode on small batches of tiny frames: a batch decodes in a fraction of a second.
FRAMES = {"batch_size": 2, "resize": (32, 32), "device": DEVICE, "duration": 3.0, "rounds": 3, "step_ms": 5}


@pytest.fixture(scope="session")
def bench_catalog(wds_catalog, tmp_path_factory) -> tuple[Path, str]:
    """(catalog, version id), with split set ``main`` by session (train holds most sessions)."""
    from dsbuild.split import SplitOptions, make_split

    src, vid = wds_catalog
    cat = tmp_path_factory.mktemp("bench") / "cat<b>&x"
    shutil.copytree(src, cat)
    make_split(cat, vid, "main", SplitOptions(by="session_id", ratios="train=0.7,test=0.3"))
    return cat, vid


def options(cat: Path, **kw) -> BenchOptions:
    return BenchOptions(ref=str(cat), **kw)

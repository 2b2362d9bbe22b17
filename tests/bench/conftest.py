"""Fixtures of the bench tests: a private copy of the shared WebDataset catalog (its folder name holds
markup, to prove the HTML page escapes it) with a split set, small, fast options, and one saved report of
three rounds that the gate's tests share (each run starts a loader process per round: seconds of CPU)."""

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


class SteppingClock:
    """A clock that moves a millisecond each time it is read: the budget grants every round asked for, while
    each measurement inside its slice still runs on real time. (Each slice is then the budget over the
    measurements left, so the measuring takes about 2.8 x --duration for 9 measurements.)"""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


# The gated runs' budget: slices of 0.17 s to 1.5 s (see SteppingClock), hundreds of bytes-mode batches each.
# --duration is not a setting, so these runs are comparable with the executable's.
GATED_DURATION = 1.5


def measured(cat: Path, against=None, **kw):
    """The gated settings (``BYTES``: three rounds, raw and sha256) measured in-process, every round granted
    (``SteppingClock``)."""
    from dsbuild.bench import run_bench

    rep = run_bench(options(cat, **{**BYTES, "duration": GATED_DURATION, **kw}), against=against, clock=SteppingClock())
    assert rep.time.rounds_done == 3
    return rep


@pytest.fixture(scope="session")
def baseline(bench_catalog, tmp_path_factory) -> Path:
    """A saved report of three rounds with the gated settings, written as ``--save`` writes it."""
    from dsbuild.cli.render import json_text

    cat, _ = bench_catalog
    path = tmp_path_factory.mktemp("bench-baseline") / "base.json"
    path.write_text(json_text(measured(cat).to_json()) + "\n")
    return path

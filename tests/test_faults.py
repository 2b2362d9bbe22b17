"""Faults: kill -9 at seeded random moments, a full disk, a killed loader worker, bit flips.
After each: no partial version is listed, every listed version verifies, and re-running finishes
with the same version id (or, for the loader, resuming gives exactly the uninterrupted stream)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from dsbuild.core.executor import ExecutorSpec
from dsbuild.convert import ConvertConfig, convert
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import verify
from tests.helpers import cli_argv

CONFIG = ConvertConfig(clip_seconds=1.0, shard_size=300_000)
ARGS = ["--clip-seconds", "1", "--shard-size", "300000"]


def test_a_killed_loader_worker_is_a_clear_error_and_resume_is_exact(wds_catalog):
    torch = pytest.importorskip("torch")
    from dsbuild.loader import Loader

    ref = str(wds_catalog[0])
    expected = [b["keys"] for b in Loader(ref, decode="bytes", batch_size=1, seed=4)]
    loader = Loader(ref, decode="bytes", batch_size=1, seed=4)
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=2, timeout=60)
    got, state = [], loader.state_dict()
    stream = iter(dl)
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for i, b in enumerate(stream):
            got.append(b["keys"])
            state = loader.state_after(b)
            if i == 2:
                os.kill(stream._workers[0].pid, signal.SIGKILL)
                time.sleep(0.5)
    resumed = Loader(ref, decode="bytes", batch_size=1, seed=4)
    resumed.load_state_dict(state)
    assert got + [b["keys"] for b in resumed] == expected


def test_bit_flips_are_named_by_verify_and_skipped_by_the_loader(wds_catalog, tmp_path):
    from dsbuild.loader import Loader
    from tests.helpers import index_rows

    cat = tmp_path / "cat"
    shutil.copytree(wds_catalog[0], cat)
    vid = wds_catalog[1]
    row = index_rows(cat, vid)[3]
    shard = cat / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["byte_offset"] + 1024] ^= 0x10
    shard.write_bytes(bytes(data))
    report = verify(Catalog.open(cat), vid)
    assert [p["shard"] for p in report.problems if p.get("problem") == "altered"] == [row["shard"]]
    loader = Loader(str(cat), decode="bytes", batch_size=2, seed=1)
    keys = [k for b in loader for k in b["keys"]]
    assert row["key"] not in keys and loader.stats()["corrupt"] == 1
    assert keys == [k for b in Loader(str(cat), decode="bytes", batch_size=2, seed=1) for k in b["keys"]]

"""Faults during convert: kill -9 at seeded random moments (of the whole process group, or of the parent
alone), and a full disk. After each: no partial version is listed, every listed version verifies, no
worker outlives its parent, and re-running finishes with the same version id."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import StorageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import verify
from tests.helpers import alive, children

CONFIG = ConvertConfig(clip_seconds=1.0, shard_size=300_000)
CONVERT = """
import json, sys
from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
r = convert(sys.argv[1], sys.argv[2], ConvertConfig(clip_seconds=1.0, shard_size=300_000),
            executor=ExecutorSpec(workers=int(sys.argv[3])))
print(json.dumps({"version_id": r.version_id}))
"""


def _run(src, cat, workers: int = 2) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CONVERT, str(src), str(cat), str(workers)], capture_output=True, text=True
    )
    assert out.returncode == 0, f"convert exited {out.returncode}:\n{out.stderr}"
    return json.loads(out.stdout)["version_id"]


def test_kill_9_at_20_random_moments_never_leaves_a_partial_version(copy_captures, tmp_path):
    src = copy_captures()
    started = time.monotonic()
    clean = _run(src, tmp_path / "clean")
    duration = time.monotonic() - started
    rng = random.Random(20261129)
    cat = tmp_path / "cat"
    killed = attempt = 0
    # 20 moments, and more (up to 60) until 10 landed: a retry resumes what the last one left, so it may
    # finish before the moment drawn for it, and how often depends on the machine's speed that day
    while attempt < 20 or (killed < 10 and attempt < 60):
        attempt += 1
        if (cat / "catalog.json").exists() and Catalog.open(cat).versions():
            shutil.rmtree(cat)  # every attempt interrupts a build that has work left to do
        proc = subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(src), str(cat), "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # within the first half of a clean build: a retry resumes what the last one left, so it may take
        # less than the whole (in a run without the extras' imports, 8 of 20 kills landed on the whole)
        time.sleep(rng.uniform(0.0, duration / 2))
        if proc.poll() is None:
            killed += 1
            workers = children(proc.pid)
            if attempt % 2:
                os.kill(proc.pid, signal.SIGKILL)  # the parent alone, as an OOM killer would: no orphan worker
            else:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for _ in range(100):
                if not any(alive(w) for w in workers):
                    break
                time.sleep(0.05)
            assert not any(alive(w) for w in workers), "a worker outlived its parent"
        proc.wait()
        if (cat / "catalog.json").exists():
            for v in Catalog.open(cat).versions():
                assert v.version_id == clean and verify(Catalog.open(cat), v.version_id).ok
    assert killed >= 10  # most attempts were really interrupted
    assert _run(src, cat) == clean
    assert not [p for p in (cat / ".tmp").iterdir() if p.is_dir()]  # the next build removed the dead ones


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the disk-full path is not exercised")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_is_a_storage_error_commits_nothing_and_a_rerun_succeeds(copy_captures, small_disk, tmp_path):
    src = copy_captures()
    clean = convert(src, tmp_path / "clean", CONFIG, executor=ExecutorSpec(workers=1)).version_id
    cat = small_disk / "cat"
    with pytest.raises(StorageError, match="No space left on device"):
        convert(src, cat, CONFIG, executor=ExecutorSpec(workers=2))
    assert not cat.exists()  # a first build that failed leaves nothing (no build folder, no empty catalog)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert convert(src, cat, CONFIG, executor=ExecutorSpec(workers=2)).version_id == clean

"""A held catalog lock: a command says at once that it waits and for whom (the pid and command the holder
recorded, and that it is stopped), ``--lock-timeout SECONDS`` (``set_lock_timeout`` in Python) gives up
with exit 3 changing nothing, and a holder that dies hands the lock over to the waiting command."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from dsbuild.core.errors import StorageError
from dsbuild.lineage.catalog import Catalog, set_lock_timeout
from tests.cli.clitools import argv, env, run
from tests.security.test_forged_shards import one_line

HOLDER = """
import os, signal, sys
from dsbuild.lineage.catalog import Catalog
path = sys.argv[2]
sys.argv = ["dsbuild", "gc", sys.argv[1]]
with Catalog.open(path).lock():
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # Ctrl-Z in the middle of a commit
"""


@pytest.fixture
def held(base_catalog, tmp_path):
    """(catalog, version id, holder pid): a copy of the catalog whose lock a stopped process holds."""
    cat = shutil.copytree(base_catalog[0], tmp_path / "catalog")
    p = subprocess.Popen([sys.executable, "-c", HOLDER, "cat", str(cat)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    yield cat, base_catalog[1], p.pid
    p.kill()
    p.wait()


def test_a_waiting_command_names_the_stopped_holder_and_gives_up_after_its_timeout(held):
    cat, vid, pid = held
    before = (cat / "tags.json").read_bytes() if (cat / "tags.json").exists() else None
    p = run("tag", f"{cat}@{vid}", "gold", "--lock-timeout", "0.8", check=3)
    waiting = p.stderr.splitlines()[0]
    assert waiting.startswith("waiting for") and f"pid {pid} (dsbuild gc cat)" in waiting and "stopped" in waiting
    assert f"still held by pid {pid}" in one_line(p)
    assert ((cat / "tags.json").read_bytes() if (cat / "tags.json").exists() else None) == before


def test_the_wait_ends_when_the_holder_dies(held):
    cat, vid, pid = held
    p = subprocess.Popen(argv("tag", f"{cat}@{vid}", "gold"), stderr=subprocess.PIPE, text=True, env=env())
    assert p.stderr.readline().startswith("waiting for")  # said before anything else happens
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    assert Catalog.open(cat).tags()["gold"] == vid


def test_set_lock_timeout_is_the_same_option_in_python(held):
    cat, vid, pid = held
    set_lock_timeout(0.3)
    try:
        with pytest.raises(StorageError, match=f"still held by pid {pid}"):
            Catalog.open(cat).set_tag("gold", vid)
    finally:
        set_lock_timeout(None)
    assert "gold" not in Catalog.open(cat).tags()

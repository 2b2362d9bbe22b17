"""Open shard files stay bounded, and running out of file descriptors is a storage error, never
"corruption": run in a subprocess under ``RLIMIT_NOFILE`` with more shards than the limit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader
from dsbuild.loader.files import BufferPool, ShardFiles
from dsbuild.loader.source import Source

SCRIPT = textwrap.dedent("""
    import json, os, resource, sys
    from dsbuild.core.errors import StorageError
    from dsbuild.loader import Loader
    ref, limit = sys.argv[1], int(sys.argv[2])
    loader = Loader(ref, decode="bytes", batch_size=2, seed=1, num_workers=2, max_open_shards=limit)
    loader.open()  # index read and threads not yet started: what is open now is the baseline
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    try:
        keys = [k for b in loader for k in b["keys"]]
        print(json.dumps({"ok": len(keys), "corrupt": loader.stats()["corrupt"]}))
    except StorageError as e:
        print(json.dumps({"error": str(e), "hint": e.hint, "corrupt": loader.stats()["corrupt"]}))
""")


def run_limited(ref: str, max_open: int) -> dict:
    r = subprocess.run([sys.executable, "-c", SCRIPT, ref, str(max_open)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def many_shards(captures, tmp_path_factory):
    """(path, version id) with about one sample per shard: more shards than the descriptor limit."""
    out = tmp_path_factory.mktemp("fd") / "catalog"
    r = convert(captures, out, ConvertConfig(clip_seconds=1.0, shard_size=1 << 16), executor=ExecutorSpec(workers=1))
    return str(out), r.version_id


def test_more_shards_than_the_fd_limit_load_fine_with_the_bounded_cache(many_shards):
    ref, vid = many_shards
    shards = len(Catalog.open(ref).manifest(vid).shards)
    assert shards > 12  # more shards than the limit leaves room for
    got = run_limited(ref, 4)
    assert got == {"ok": len(Catalog.open(ref).index(vid)), "corrupt": 0}


def test_running_out_of_file_descriptors_is_a_storage_error_not_corruption(many_shards):
    ref, _ = many_shards
    got = run_limited(ref, 1000)
    assert "Too many open files" in got["error"] and "ulimit -n" in got["hint"] and got["corrupt"] == 0


def _fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kw", [{"decode": "bytes", "verify": "shard"}, {"decode": "frames", "resize": (16, 16)}])
def test_close_during_a_loop_releases_and_the_loop_goes_on_where_it_was(many_shards, kw):
    """``close()`` stopped the worker pool the running loop had taken at its start: the next batch it
    handed to a worker raised "cannot schedule new futures after shutdown"."""
    ref, _ = many_shards
    stream = [b["keys"] for b in Loader(ref, batch_size=2, seed=9, **kw)]
    got = []
    with Loader(ref, batch_size=2, seed=9, num_workers=2, **kw) as loader:  # (its read-ahead ends with it)
        for i, b in enumerate(loader):
            got.append(b["keys"])
            if i == 1:
                loader.close()
    assert got == stream


def test_a_closed_or_dropped_loader_releases_its_shard_files(many_shards):
    """One loader per evaluation or restart used to keep up to max_open_shards files open each, until
    the process ran out of descriptors. ``close()`` (or ``with``) releases them at once; a loader that is
    simply dropped releases them when it is collected (once its read-ahead into the next epoch is done)."""
    import gc

    ref, _ = many_shards
    with Loader(ref, decode="bytes", batch_size=2, seed=9) as reference:
        stream = [b["keys"] for b in reference]
    gc.collect()  # loaders earlier tests dropped: their files must not be counted against this one
    base = _fds()
    with Loader(ref, decode="bytes", batch_size=2, seed=9, num_workers=2) as loader:
        assert next(iter(loader))["keys"] == stream[0]
        one = _fds() - base
        assert one > 0
    assert _fds() <= base
    assert next(iter(loader))["keys"] == stream[1]  # usable after close: it reopens where it was
    loader.close()
    assert _fds() <= base
    after, full = [], 0
    for seed in range(12):
        loader = Loader(ref, decode="bytes", batch_size=2, seed=seed, num_workers=2)
        assert sum(len(b["keys"]) for b in loader) > 0
        full = max(full, _fds() - base - max(after, default=0))  # one loader's files after an epoch
        del loader
        gc.collect()
        after.append(_fds() - base)
    # bounded: a dropped loader whose read-ahead still runs at the collection is freed at a later one,
    # so a few may be alive at once, never all twelve (what keeping every loader's files gives)
    assert full > 0 and after[-1] <= 4 * full, (after, full)


def test_the_lru_never_holds_more_than_its_limit_and_reopens_evicted_shards(cat):
    ref, _ = cat
    src = Source(ref).open()
    files = ShardFiles(src.catalog, src.shards, src.format, 3, verify_shards=False)
    for _ in range(2):
        for shard in range(len(src.shards)):
            buf = bytearray(16)
            assert files.read_ranges(shard, [(memoryview(buf), 0)]) == [16] and buf[:6] != b"\0" * 6
            assert files.open_files <= 3
    assert files.opened == 2 * len(src.shards)  # evicted, then opened again
    files.close()


def test_pooled_arrays_are_reused_only_once_no_view_of_them_lives():
    pool = BufferPool()
    a = pool.zeros((4, 512, 512), np.uint8)  # 1 MiB: pooled
    view = a[1:2]
    del a
    b = pool.empty((4, 512, 512), np.uint8)  # the first buffer is still seen through `view`
    assert pool.allocated == 2 and not np.shares_memory(view, b)
    del view, b
    c = pool.zeros((1, 512, 512), np.float32)  # both idle again: one of them is taken
    assert pool.allocated == 2 and c.dtype == np.float32 and not c.any()
    assert pool.zeros((3, 3), np.float64).shape == (3, 3) and pool.allocated == 2  # small: plain numpy


def test_a_full_pool_keeps_its_larger_buffers():
    """Batches of mixed resolutions: a full pool used to drop the large buffer a big batch needed, keep
    the small ones, and make the large one afresh for every big batch."""
    pool = BufferPool(keep=2)
    small = [pool.zeros((1, 1 << 20), np.uint8) for _ in range(2)]  # 2 x 1 MiB: the pool is full
    del small
    big = pool.zeros((3, 1 << 20), np.uint8)  # nothing idle fits: made afresh, kept in a small one's place
    assert pool.allocated == 3
    del big
    again = pool.zeros((3, 1 << 20), np.uint8)
    assert pool.allocated == 3 and not again.any()
    small = pool.zeros((1, 1 << 20), np.uint8)  # the small one left still serves small arrays
    assert pool.allocated == 3 and not np.shares_memory(small, again)


def test_batches_in_reused_memory_equal_batches_kept_alive(cat):
    """Frames big enough to be pooled: an epoch whose batches are all kept (nothing can be reused) and
    one whose batches are dropped at once (everything is) deliver the same bytes, padding included."""
    ref, _ = cat
    opts = dict(batch_size=3, seed=2, resize=(240, 320), num_workers=2, shuffle="global")

    def digests(batches) -> list[str]:
        return [
            hashlib.sha256(b["frames"].tobytes() + b["actions"].tobytes() + b["lengths"].tobytes()).hexdigest()
            for b in batches
        ]

    kept = list(Loader(ref, **opts))
    loader = Loader(ref, **opts)
    dropped = [digests([b])[0] for b in loader]
    assert dropped == digests(kept) and len(kept) > 2
    assert loader._preparer.arrays.allocated < len(kept) * (opts["batch_size"] + 1)  # memory was reused


def test_a_shard_evicted_between_finding_and_taking_its_handle_is_opened_again(cat):
    """``handle`` found an open handle, released the lock, and took it again to count its user: a thread
    that evicted the idle handle in between left it making a handle with no path (a TypeError on open)."""
    ref, _ = cat
    src = Source(ref).open()
    files = ShardFiles(src.catalog, src.shards, src.format, 3, verify_shards=False)
    with files.handle(0):
        pass  # shard 0 is open, and idle
    lock = files._lock

    class EvictingLock:  # another thread's eviction, run whenever this one releases the lock
        def __enter__(self):
            return lock.__enter__()

        def __exit__(self, *exc):
            h = files._open.get(0)
            if h is not None and h.users == 0:  # what ``_evict`` does: never a handle in use
                del files._open[0]
                h.close()
            return lock.__exit__(*exc)

    files._lock = EvictingLock()
    with files.handle(0) as h:
        files._lock = lock
        assert h.path is not None
        buf = bytearray(16)
        assert files.read_ranges(0, [(memoryview(buf), 0)]) == [16]
    files.close()

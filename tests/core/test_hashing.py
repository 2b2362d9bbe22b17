"""FileProof: a record's BLAKE3 is proven on every core, its sha256 where it has no BLAKE3, and a process
forked from one that hashed on every core still proves bytes (rayon's thread pool does not survive fork:
a loader's or validate's forked worker that used it waited forever)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os

from blake3 import blake3

from dsbuild.core.hashing import FileProof

DATA = os.urandom(8 << 20)  # large enough for BLAKE3 to split it across its threads


def _proof(blake3_hex: str | None, data: bytes = DATA) -> FileProof:
    proof = FileProof(hashlib.sha256(DATA).hexdigest(), blake3_hex)
    for start in range(0, len(data), 1 << 20):
        proof.update(data[start : start + (1 << 20)])
    return proof


def _in_child(queue) -> None:
    queue.put(_proof(blake3(DATA).hexdigest()).ok())


def test_the_recorded_hash_decides_and_a_changed_byte_is_named_with_it():
    assert _proof(blake3(DATA).hexdigest()).ok() and _proof(None).ok()
    flipped = bytes([DATA[0] ^ 1]) + DATA[1:]
    assert _proof(blake3(DATA).hexdigest(), flipped).mismatch().startswith("blake3 ")
    assert _proof(None, flipped).mismatch().startswith("sha256 ")


def test_a_process_forked_after_its_parent_hashed_on_every_core_still_proves_bytes():
    assert _proof(blake3(DATA).hexdigest()).ok()  # the parent's thread pool is live now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=300) is True  # a deadlocked child never answers
    finally:
        child.kill()
        child.join()


def test_the_hash_cache_follows_dsbuild_cache_in_every_thread(tmp_path, monkeypatch):
    """A thread kept the connection it made while DSBUILD_CACHE named another folder: its lookups missed
    what other threads had recorded in the current cache (an incremental build then processed every
    session again instead of reusing them, in a process that had changed DSBUILD_CACHE)."""
    import os
    import threading

    from dsbuild.core.hashcache import hashed, lookup

    src = tmp_path / "video.mp4"
    src.write_bytes(b"x" * 5000)
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "first"))
    assert lookup(os.stat(src)) is None  # this thread now holds a connection to the first cache
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "second"))
    got = []
    worker = threading.Thread(target=lambda: got.append(hashed(src)[0]))  # records it in the second cache
    worker.start()
    worker.join()
    assert lookup(os.stat(src)) == got[0]

"""A cache of source-file hashes keyed by what the file system says about the file, so an incremental
build hashes only files that changed (what ``dvc status`` does with its state database).

The key is (device, inode, size, mtime_ns, ctime_ns). Any write to a file changes its ctime, which no
user command can set back, so a hit means the bytes are the ones hashed before. The cache lives in
``$DSBUILD_CACHE/sources.sqlite`` (per machine; never part of a version) and is only an accelerator:
a lost or damaged cache costs one full hash pass, never a wrong hash. ``DSBUILD_HASH_CACHE=0`` turns
it off.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from dsbuild.core.hashing import sha256_file
from dsbuild.core.store import cache_root

_LOCAL = threading.local()


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _db() -> sqlite3.Connection | None:
    if os.environ.get("DSBUILD_HASH_CACHE", "1") == "0":
        return None
    path = cache_root() / "sources.sqlite"
    held = getattr(_LOCAL, "conn", None)
    # (the process and the cache it names: a connection made while DSBUILD_CACHE named another folder
    # kept looking there, while other threads recorded hashes in the current one)
    if held is not None and held[:2] == (os.getpid(), path):
        return held[2]
    if held is not None and held[0] == os.getpid():
        held[2].close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS sources (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
            "ctime INTEGER, sha256 TEXT, PRIMARY KEY (dev, ino, size, mtime, ctime))"
        )
    except sqlite3.Error:
        return None  # an accelerator only: without it, everything is hashed
    _LOCAL.conn = (os.getpid(), path, conn)
    return conn


def lookup(st: os.stat_result) -> str | None:
    """The cached sha256 of a file with this stat, if any."""
    db = _db()
    if db is None:
        return None
    try:
        row = db.execute(
            "SELECT sha256 FROM sources WHERE dev=? AND ino=? AND size=? AND mtime=? AND ctime=?", _identity(st)
        ).fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def hashed(path: Path, root: Path | None = None) -> tuple[str, int, os.stat_result]:
    """(sha256, size, stat before hashing) of a regular file, from the cache when its stat is unchanged.

    A file whose stat changed while it was hashed is not cached (the caller detects the change)."""
    before = os.stat(path)
    digest = lookup(before)
    if digest is not None:
        return digest, before.st_size, before
    digest, size = sha256_file(path, root)
    after = os.stat(path)
    db = _db()
    if db is not None and _identity(after) == _identity(before) and size == before.st_size:
        try:
            db.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?)", (*_identity(before), digest))
        except sqlite3.Error:
            pass
    return digest, size, before

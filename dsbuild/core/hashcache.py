"""Facts about local files keyed by what the file system says about them, so work proven once on a
machine is not done again: source-file hashes, so an incremental build hashes only files that changed
(what ``dvc status`` does with its state database), the loader's shard proofs (``known``,
``remember``), so the ranks and workers of a node hash and check each shard once, not once per process,
and what a loader derives from a version's index when it opens it (``noted``, ``note``).

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
from collections.abc import Callable
from pathlib import Path

from dsbuild.core.hashing import sha256_file
from dsbuild.core.store import cache_root

# One connection per process, shared by its threads (a connection per thread kept a descriptor open for
# every thread that ever asked, past the loader that started it): (pid, path, connection).
_HELD: tuple | None = None
_LOCK = threading.Lock()
# A file changed within this long before its proof began may change again under the same ctime (the
# kernel stamps files from a clock that ticks every few milliseconds): git's "racily clean" entries.
RACY_NS = 50_000_000

Identity = tuple[int, int, int, int, int]


def identity(st: os.stat_result) -> Identity:
    """What keys a file's facts: (device, inode, size, mtime_ns, ctime_ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _connection() -> sqlite3.Connection | None:
    """This process's connection to the cache that ``DSBUILD_CACHE`` names now (under ``_LOCK``)."""
    global _HELD
    path = cache_root() / "sources.sqlite"
    # (the process and the cache it names: a connection made while DSBUILD_CACHE named another folder
    # kept looking there; a forked child makes its own)
    if _HELD is not None and _HELD[:2] == (os.getpid(), path):
        return _HELD[2]
    if _HELD is not None and _HELD[0] == os.getpid():
        _HELD[2].close()
    _HELD = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS sources (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
            "ctime INTEGER, sha256 TEXT, PRIMARY KEY (dev, ino, size, mtime, ctime))"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS facts (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
            "ctime INTEGER, fact TEXT, PRIMARY KEY (dev, ino, size, mtime, ctime, fact))"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS notes (dev INTEGER, ino INTEGER, size INTEGER, mtime INTEGER, "
            "ctime INTEGER, kind TEXT, value BLOB, PRIMARY KEY (dev, ino, size, mtime, ctime, kind))"
        )
    except (sqlite3.Error, OSError):
        return None  # an accelerator only: without it, everything is hashed
    _HELD = (os.getpid(), path, conn)
    return conn


def _execute(sql: str, params: tuple) -> list | None:
    """The rows of one statement (None: the cache is off or failed)."""
    if os.environ.get("DSBUILD_HASH_CACHE", "1") == "0":
        return None
    with _LOCK:
        conn = _connection()
        if conn is None:
            return None
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error:
            return None


def lookup(st: os.stat_result) -> str | None:
    """The cached sha256 of a file with this stat, if any."""
    rows = _execute("SELECT sha256 FROM sources WHERE dev=? AND ino=? AND size=? AND mtime=? AND ctime=?", identity(st))
    return rows[0][0] if rows else None


def hashed(path: Path, root: Path | None = None) -> tuple[str, int, os.stat_result]:
    """(sha256, size, stat before hashing) of a regular file, from the cache when its stat is unchanged.

    A file whose stat changed while it was hashed is not cached (the caller detects the change)."""
    before = os.stat(path)
    digest = lookup(before)
    if digest is not None:
        return digest, before.st_size, before
    digest, size = sha256_file(path, root)
    after = os.stat(path)
    if identity(after) == identity(before) and size == before.st_size:
        _execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?)", (*identity(before), digest))
    return digest, size, before


def known(ident: Identity, fact: str) -> bool:
    """Whether ``fact`` was proven of the file whose identity is ``ident`` (on this machine)."""
    sql = "SELECT 1 FROM facts WHERE dev=? AND ino=? AND size=? AND mtime=? AND ctime=? AND fact=?"
    return bool(_execute(sql, (*ident, fact)))


def remember(ident: Identity, fact: str, began_ns: int, look: Callable[[], os.stat_result] | None = None) -> None:
    """``fact`` proven of the file of identity ``ident`` by work that began at ``began_ns`` (``time_ns``);
    kept only where the file had been still for ``RACY_NS`` before that (a later write could otherwise
    keep the identity) and, given ``look`` (a stat of it now), is unchanged at the work's end (a file gone
    since, OSError, has nothing to remember it by)."""
    if settled(ident, began_ns, look):
        _execute("INSERT OR IGNORE INTO facts VALUES (?, ?, ?, ?, ?, ?)", (*ident, fact))


def settled(ident: Identity, began_ns: int, look: Callable[[], os.stat_result] | None = None) -> bool:
    """Whether what work that began at ``began_ns`` found in the file of identity ``ident`` may be kept
    under that identity (``remember``'s rule)."""
    if began_ns - ident[4] < RACY_NS:
        return False
    try:
        return look is None or identity(look()) == ident
    except OSError:
        return False


def noted(ident: Identity, kind: str) -> bytes | None:
    """What was kept of kind ``kind`` about the file of identity ``ident`` (``note``), if anything."""
    sql = "SELECT value FROM notes WHERE dev=? AND ino=? AND size=? AND mtime=? AND ctime=? AND kind=?"
    rows = _execute(sql, (*ident, kind))
    return bytes(rows[0][0]) if rows else None


def note(ident: Identity, kind: str, value: bytes) -> None:
    """Keep ``value``, derived from the file of identity ``ident`` (the caller checks ``settled``)."""
    _execute("INSERT OR REPLACE INTO notes VALUES (?, ?, ?, ?, ?, ?, ?)", (*ident, kind, value))

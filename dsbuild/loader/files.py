"""Open shard files: a bounded LRU shared by the worker threads, OS errors kept apart from corruption.

At most ``limit`` shards are open at once (default 64, far below common ``ulimit -n`` values), so a
version with thousands of shards never exhausts file descriptors. A handle in use by a thread is never
closed under it: eviction skips handles in use (so the count can exceed the limit by at most the
number of threads). Every OS error opening or reading a shard (EMFILE, ENOMEM, EACCES, EIO, a missing
file) is a ``StorageError`` naming the shard and what to do: the environment failed, the data did not,
and counting it as a corrupt sample would silently replace healthy samples.

A shard is either mapped (``mapped``: one read-only mapping per open handle, holding no descriptor, which
outlives the handle while any delivered view of it lives) or read (``read_ranges``, through the handle's
descriptor).

``verify="shard"`` hashes each shard before any of its bytes are trusted — a mapped one through its
mapping — and remembers the file's identity (device, inode, size, mtime, ctime): in the process, and in
the machine's proof cache (``core.hashcache``), so the other ranks and workers of a node, and later
jobs, trust the same unchanged file without hashing it again. A shard whose hash does not match is not
trusted at all: its samples are then read and checked one by one against their own hashes.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import numpy as np

from dsbuild.core import hashcache
from dsbuild.core.errors import StorageError
from dsbuild.core.hashing import CHUNK
from dsbuild.formats import ShardFormat, ShardReader
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.manifest import ShardRecord
from dsbuild.loader.stats import Stats

RESOURCE_ERRORS: dict[int | None, str] = {  # (keyed like ``OSError.errno``, which may be None)
    errno.EMFILE: "raise `ulimit -n` or lower max_open_shards",
    errno.ENFILE: "the system's open-file table is full; lower max_open_shards",
    errno.ENOMEM: "the process is out of memory; lower num_workers, prefetch or batch_size",
    errno.EACCES: "the shard is not readable by this user; fix its permissions",
    errno.ENOENT: "the shard is missing; `dsbuild verify` names the command that heals it",
}


def storage_error(what: str, e: OSError) -> StorageError:
    """An OS error while touching a shard, as a one-line StorageError with the fix."""
    return StorageError(
        f"{what}: {e.strerror or e}", hint=RESOURCE_ERRORS.get(e.errno, "check the disk and the catalog, then resume")
    )


class _Handle:
    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None
        self.view: memoryview | None = None  # the whole file, mapped read-only (``ShardFiles.mapped``)
        self.ident: tuple = ()  # the identity of the file mapped
        self.unmappable = False  # not its record's size, or the file system cannot map it: read, never mapped
        self.reader: ShardReader | None = None
        self.users = 0
        self.lock = threading.Lock()  # ShardReaders are not thread-safe; byte-range reads need no lock

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.view = None  # unmapped once no delivered sample views it any more
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class ShardFiles:
    """The shards of one source, opened on demand, at most ``limit`` at once."""

    def __init__(
        self,
        catalog: Catalog,
        shards: list[ShardRecord],
        fmt: ShardFormat,
        limit: int,
        verify_shards: bool,
        stats: Stats | None = None,
    ):
        self.catalog, self.shards, self.format, self.limit = catalog, shards, fmt, limit
        self.verify_shards = verify_shards
        self.stats = stats if stats is not None else Stats()  # (its ``proofs`` count what was proven how)
        self._open: OrderedDict[int, _Handle] = OrderedDict()
        self._lock = threading.Lock()
        self._trusted: dict[int, tuple] = {}  # shard -> file identity when its hash matched
        self._damaged: set[int] = set()
        self._fetched_again: set[int] = set()  # remote shards whose damaged local copy was dropped
        self._hash_locks: dict[int, threading.Lock] = {}
        self.opened = 0  # files opened so far (a test and the stats read it)

    def _path(self, shard: int) -> tuple[str, int | None]:
        """The shard's file; for a remote catalog its verified cached copy, opened at once: processes
        sharing the cache evict each other's copies, and the descriptor keeps this one readable."""
        rec = self.shards[shard]
        try:
            if self.catalog.root is not None:
                return str(self.catalog.shard_file(rec)), None
            path, fd = self.catalog.open_shard_copy(rec)
        except OSError as e:
            raise storage_error(f"{rec.path}: cannot fetch shard", e) from None
        self.opened += 1
        return str(path), fd

    @contextmanager
    def handle(self, shard: int) -> Iterator[_Handle]:
        path: str | None = None
        fd: int | None = None
        while True:  # an open handle is taken in the same locked step that finds it (or it may be evicted first)
            with self._lock:
                h = self._open.get(shard)
                if h is None and path is not None:
                    h = self._open[shard] = _Handle(path)
                    h.fd, fd = fd, None
                if h is not None:
                    if fd is not None:  # another thread opened it meanwhile
                        os.close(fd)
                    self._open.move_to_end(shard)
                    h.users += 1
                    self._evict()  # (after counting this user: with a limit of 1 it evicted the handle just made)
                    break
            path, fd = self._path(shard)  # outside the lock: a remote one downloads
        try:
            yield h
        finally:
            with self._lock:
                h.users -= 1
                if shard not in self._open and h.users == 0:
                    h.close()  # evicted while in use: close now that its last user is done

    def _evict(self) -> None:
        for shard in list(self._open):
            if len(self._open) <= self.limit:
                return
            h = self._open[shard]
            if h.users == 0:
                del self._open[shard]
                h.close()

    @property
    def open_files(self) -> int:
        """Shards open now (at most ``limit``, plus any held by threads mid-read when it was reached)."""
        return len(self._open)

    def fd(self, h: _Handle) -> int:
        if h.fd is None:
            with self._lock:
                if h.fd is None:
                    try:
                        h.fd = os.open(h.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    except OSError as e:
                        raise storage_error(f"{h.path}: cannot open shard", e) from None
                    self.opened += 1
        return h.fd

    @contextmanager
    def reader(self, shard: int) -> Iterator[ShardReader]:
        """The format's reader of ``shard``, held by one thread at a time."""
        with self.handle(shard) as h, h.lock:
            if h.reader is None:  # (a remote shard's copy through its descriptor: it may be evicted by now)
                local = self.catalog.root is not None
                h.reader = self.format.reader(Path(h.path if local else f"/proc/self/fd/{h.fd}"))
                self.opened += 1
            yield h.reader

    def mapped(self, shard: int) -> memoryview | None:
        """The whole shard as a read-only view of its memory mapping (made once per open handle; it holds
        no descriptor: ``map_file``), or None where the shard must be read instead (``read_ranges``):
        the file cannot be mapped, or is not the size its record says (a short read is damage; a mapped
        page past a file's end would be a SIGBUS), or with ``verify_shards`` its mapped bytes did not hash
        to their record (the caller then checks each sample's own hash). Each call looks at the file
        again: one cut short in place since it was mapped is read from then on, never touched through
        the mapping (what is left is the race of a truncation between this look and the reads)."""
        if shard in self._damaged:
            return None
        rec = self.shards[shard]
        with self.handle(shard) as h:
            if h.view is None and not h.unmappable:
                with h.lock:
                    if h.view is None and not h.unmappable:
                        self._map(h, rec.bytes)
            view = h.view
            if view is None:
                return None
            try:
                now = hashcache.identity(os.stat(h.path))
            except FileNotFoundError:  # removed (a shard cache evicting its copy): the mapping still shows it
                now = h.ident
            except OSError as e:
                raise storage_error(f"{h.path}: cannot stat shard", e) from None
            if now[:2] != h.ident[:2]:  # replaced since: the mapping shows the file it mapped
                now = h.ident
            elif now[2] != rec.bytes:  # the mapped file itself was cut short or grown in place
                self._damaged.add(shard)
                return None
            if not self.verify_shards:
                return view
            with self._hash_lock(shard):
                return view if self._judge(shard, now, lambda: _proven([view], rec), lambda: os.stat(h.path)) else None

    def _map(self, h: _Handle, size: int) -> None:
        """Map ``h``'s file through a descriptor of its own (a duplicate of ``h.fd`` where the handle holds
        one: a remote copy may have been evicted since), closed at once; a file of another size, or one the
        file system will not map, is marked to be read."""
        try:
            fd = os.dup(h.fd) if h.fd is not None else os.open(h.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise storage_error(f"{h.path}: cannot open shard", e) from None
        self.opened += 1
        try:
            st = os.fstat(fd)
            if st.st_size == 0 or st.st_size != size:
                h.unmappable = True
            else:
                h.view, h.ident = map_file(fd, size), hashcache.identity(st)
        except OSError:  # a file system that cannot map (some FUSE mounts): read it
            h.unmappable = True
        finally:
            os.close(fd)

    def read_ranges(self, shard: int, ranges: list[tuple[memoryview, int]]) -> list[int]:
        """Each ``(buffer, offset)``: the shard's bytes at ``offset`` read into ``buffer`` (``os.preadv``,
        which releases the GIL); the bytes read, per range. One handle for all of them."""
        with self.handle(shard) as h:
            fd = self.fd(h)
            try:
                return [os.preadv(fd, [buf], offset) for buf, offset in ranges]
            except OSError as e:
                raise storage_error(f"{h.path}: cannot read shard", e) from None

    def trusted(self, shard: int) -> bool:
        """verify="shard": True once the shard's bytes, read from its file, hashed to their record (once
        per process and file identity); False if they did not (the caller then checks each sample's own
        hash)."""
        if shard in self._damaged:
            return False
        with self._hash_lock(shard), self.handle(shard) as h:
            fd = self.fd(h)
            st = os.fstat(fd)
            rec = self.shards[shard]
            prove = lambda: st.st_size == rec.bytes and _proven(_file_chunks(fd), rec)  # noqa: E731
            return self._judge(shard, hashcache.identity(st), prove, lambda: os.fstat(fd))

    def _hash_lock(self, shard: int) -> threading.Lock:
        with self._lock:
            return self._hash_locks.setdefault(shard, threading.Lock())

    def _judge(self, shard: int, ident: tuple, prove, look) -> bool:
        """Whether the shard, as the file of identity ``ident`` holds it, is trusted: known (in this process
        or the machine's proof cache), or ``prove()`` now (under the shard's hash lock), then remembered
        where ``look()`` (a stat) finds the file unchanged."""
        if self._trusted.get(shard) == ident:
            return True
        fact, began = hash_fact(self.shards[shard]), time.time_ns()
        if hashcache.known(ident, fact):
            self._trusted[shard] = ident
            self.stats.proof("hashes_known")
            return True
        self.stats.proof("shards_hashed")
        if prove():
            self._trusted[shard] = ident
            hashcache.remember(ident, fact, began, look)
            return True
        if not self.drop_copy(shard, ident):
            self._damaged.add(shard)
        return False

    def suspect(self, shard: int) -> None:
        """A sample read from ``shard`` did not hash to its record: a remote shard's copy is dropped
        (``drop_copy``), a local one is what it is."""
        if self.catalog.root is None:
            with self.handle(shard) as h:
                ident = hashcache.identity(os.fstat(self.fd(h)))
            self.drop_copy(shard, ident)

    def drop_copy(self, shard: int, ident: tuple) -> bool:
        """A remote shard's local copy (file identity ``ident``) found damaged: removed from the shard cache
        and from the open handles, once per process, so that its next read fetches it again (a copy damaged
        on local disk was otherwise used, and its samples replaced, until the cache evicted it). False for a
        local shard, or one fetched again already."""
        with self._lock:
            if shard in self._fetched_again:
                return False
            self._fetched_again.add(shard)
        if not self.catalog.drop_shard_copy(self.shards[shard], lambda st: hashcache.identity(st)[:2] == ident[:2]):
            return False
        with self._lock:
            self._trusted.pop(shard, None)
            h = self._open.pop(shard, None)
            if h is not None and h.users == 0:
                h.close()  # (in use: closed by its last user, as an evicted handle is)
        return True

    def close(self) -> None:
        with self._lock:
            for h in self._open.values():
                if h.users == 0:
                    h.close()
            self._open.clear()


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
MAP_FAILED = ctypes.c_void_p(-1).value


def map_file(fd: int, size: int, *, writable: bool = False) -> memoryview:
    """The first ``size`` bytes of ``fd``'s file mapped (shared; read-only unless ``writable``), as a
    memoryview that holds no descriptor, unmapped once no view of it is left. (Python's ``mmap`` keeps a
    duplicate of ``fd`` for the mapping's life: a loader whose delivered clips keep mappings alive piled
    those up past ``max_open_shards`` and ``ulimit -n``.)"""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    addr = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    name = "MappedBlock" if writable else "MappedShard"
    mapped = cast(type[ctypes.Array[ctypes.c_ubyte]], type(name, (ctypes.c_ubyte * size,), {}))
    block = mapped.from_address(addr)  # (a subclass: weakref-able)
    weakref.finalize(block, _libc.munmap, addr, size)
    view = memoryview(block).cast("B")
    return view if writable else view.toreadonly()


def hash_fact(rec: ShardRecord) -> str:
    """What a shard's proof cache entry says: its bytes hash to the record's BLAKE3 (or sha256)."""
    return f"blake3 {rec.blake3}" if rec.blake3 else f"sha256 {rec.sha256}"


def _file_chunks(fd: int) -> Iterator[memoryview]:
    """The file's bytes through ``fd``, a chunk at a time (in one reused buffer)."""
    view = memoryview(bytearray(CHUNK))
    pos = 0
    while True:
        try:
            n = os.preadv(fd, [view], pos)
        except OSError as e:
            raise storage_error("cannot hash shard", e) from None
        if n <= 0:
            return
        yield view[:n]
        pos += n


def _proven(chunks, rec) -> bool:
    """The shard's bytes (``chunks`` of them, in order) hash to its record (BLAKE3, or sha256 for older
    versions)."""
    h = rec.proof()
    for chunk in chunks:
        for at in range(0, len(chunk), CHUNK):
            h.update(chunk[at : at + CHUNK])  # releases the GIL for large updates
    return h.ok()


ARRAY_MIN = 1 << 20  # smaller arrays come from malloc's own free lists, without page faults


def _nbytes(shape: tuple, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


class BufferPool:
    """Reusable read buffers, and large arrays (``empty``/``zeros``). A fresh 10 MB ``bytes`` per sample
    costs page faults on every read (the allocator hands big blocks back to the OS), which halves
    throughput on page-cached shards. A buffer is reused only when nothing references it any more — no
    delivered sample can change under a user who keeps it: a live memoryview (even a slice of a slice)
    holds a reference to its bytearray."""

    IDLE_REFS = 3  # the pool's list, the local name in ``take`` and getrefcount's argument

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made so far (reuse keeps this flat)

    def take(self, n: int) -> bytearray:
        with self._lock:
            best = None
            for k in range(len(self._buffers)):  # (not enumerate: its cached tuple would hold a reference)
                buf = self._buffers[k]
                if (
                    len(buf) >= n
                    and sys.getrefcount(buf) <= self.IDLE_REFS
                    and (best is None or len(buf) < len(self._buffers[best]))
                ):
                    best = k  # the smallest idle buffer that fits
            if best is not None:
                return self._buffers.pop(best)
        self.allocated += 1
        return bytearray(-(-n // (1 << 20)) << 20)  # whole MiBs, so buffers fit many samples

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        """``np.empty`` in reused memory for arrays of ``ARRAY_MIN`` bytes or more: a fresh frames array
        (tens of MB a clip or batch) costs a page fault per 4 KiB on first write, several times the copy
        that fills it. The array keeps its buffer from reuse for as long as it, or any view, lives."""
        n = _nbytes(shape, dtype)
        if n < ARRAY_MIN:
            return np.empty(shape, dtype)
        buf = self.take(n)
        arr = np.frombuffer(buf, np.uint8, count=n).view(dtype).reshape(shape)
        self.give(buf)  # tracked again; idle once ``arr`` and its views are gone
        return arr

    def zeros(self, shape: tuple, dtype) -> np.ndarray:
        if _nbytes(shape, dtype) < ARRAY_MIN:  # calloc's zeroing beats empty + fill for small arrays
            return np.zeros(shape, dtype)
        arr = self.empty(shape, dtype)
        arr.fill(0)
        return arr

    def give(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._buffers) < self.keep:
                self._buffers.append(buf)
                return
            # full: keep the larger of ``buf`` and the smallest idle buffer. A large buffer serves any
            # smaller request, and one made afresh is written through once by ``bytearray`` (a page fault
            # per 4 KiB): dropping large ones for small ones made batches of mixed resolutions allocate
            # their frames afresh again and again.
            smallest = None
            for k in range(len(self._buffers)):
                held = self._buffers[k]
                if sys.getrefcount(held) <= self.IDLE_REFS and (
                    smallest is None or len(held) < len(self._buffers[smallest])
                ):
                    smallest = k
            if smallest is not None and len(self._buffers[smallest]) < len(buf):
                self._buffers[smallest] = buf

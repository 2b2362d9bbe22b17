"""Where a catalog's bytes live: a local folder or any fsspec URL, behind one small interface.

A ``Store`` maps *keys* (``versions/<id>/manifest.json``, ``shards/ab/<sha256>.tar``) to bytes. Keys
are untrusted when they come from a listing of someone else's bucket, so every key is checked before
it touches a local path: segments of ``[A-Za-z0-9_-]`` plus inner dots, no empty segment, no leading
``/``, no ``..``, no backslash, no drive letter, no control character. Every local target is then
resolved and must stay inside its root. A hostile bucket can at worst be refused, never write outside
the catalog, its mirror or the shard cache.

``LocalStore`` reads and writes a folder (writes are atomic renames). ``FsspecStore`` reads and writes
an object store; keys whose right bytes never change (a version's files, split sets: named by or pinned
to their hashes) are read through a local cache that keeps only bytes their reader proved, and shards go through ``ShardCache``: whole-shard, bounded, LRU,
verified against the manifest's sha256 on arrival.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dsbuild.core.errors import FormatError, LineageError, MissingDependency, StorageError, UsageError
from dsbuild.core.files import inside, open_regular, read_capped, replace_atomically

_SEGMENT = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9._-]{0,254})")
RANGE_BYTES = 8 << 20
RETRIES = 5
DEADLINE = 60.0  # seconds: one request's retries end here, however many are left
CONNECT_TIMEOUT = 5  # seconds: an S3 endpoint that does not accept a connection by then is down
READ_TIMEOUT = 20  # seconds without a byte from a connected S3 endpoint: it will not answer
CACHE_LIMIT = 20 << 30  # shards kept locally for a remote catalog; DSBUILD_CACHE_BYTES overrides
PART_GRACE = 3600.0  # seconds: a partial download older than this was killed (one write per 8 MiB range)


class UnsafeKey(FormatError):
    """A key that could name a place outside its store."""


def check_key(key: object) -> str:
    """``key`` if it is a safe relative key (``check_capture_key``, each segment in [A-Za-z0-9._-]), else
    UnsafeKey naming what is wrong."""
    if not isinstance(key, str) or not key:
        raise UnsafeKey(f"key {key!r} is empty or not a string")
    for seg in check_capture_key(key).split("/"):
        if not _SEGMENT.fullmatch(seg) or seg.endswith("."):
            raise UnsafeKey(f"key {key[:120]!r} has a segment with characters outside [A-Za-z0-9._-]")
    return key


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_capture_key(key: str) -> str:
    """``key`` if it can be a relative path below a staging folder: any characters a file name may hold
    (capture folders are named by people: spaces, accents), but no empty, '.' or '..' segment, no absolute
    path, backslash or control character, and no segment longer than a file name may be (255 bytes).
    UnsafeKey names what is wrong."""
    shown = repr(key[:120])
    if not key:
        raise UnsafeKey("key '' is empty")
    if _CONTROL.search(key):
        raise UnsafeKey(f"key {shown} contains a control character")
    if key.startswith("/") or "\\" in key or re.match(r"[A-Za-z]:", key):
        raise UnsafeKey(f"key {shown} is absolute or has a backslash or drive letter")
    for seg in key.split("/"):
        if seg in ("", ".", ".."):
            raise UnsafeKey(f"key {shown} has an empty, '.' or '..' segment")
        if len(seg.encode("utf-8", "surrogateescape")) > 255:
            raise UnsafeKey(f"key {shown} has a segment longer than a file name may be (255 bytes)")
    return key


def _file_url(text: str) -> bool:
    return text[:5].lower() == "file:"  # (a scheme is case-insensitive: FILE:///x, file:/x, file:///x)


def is_url(path: object) -> bool:
    """An fsspec URL other than a ``file:`` one (which is a local path)."""
    text = str(path)
    return "://" in text and not _file_url(text)


def local_path(path: object) -> Path:
    """The local path a ``file:`` URL names (percent-escapes decoded), or ``path`` itself."""
    text = str(path)
    if not _file_url(text):
        return Path(text)
    from urllib.parse import unquote, urlsplit

    return Path(unquote(urlsplit(text).path))


def is_key(key: object) -> bool:
    """Whether ``check_key`` accepts ``key`` (listings and hold files skip the rest: never followed)."""
    try:
        check_key(key)
    except UnsafeKey:
        return False
    return True


def parses(parse: Callable[[bytes], object]) -> Callable[[bytes], bool]:
    """A ``read(..., proven=)`` check from a parser: bytes it accepts (raising no FormatError)."""

    def proven(data: bytes) -> bool:
        try:
            parse(data)
        except FormatError:
            return False
        return True

    return proven


def cache_root() -> Path:
    return Path(os.environ.get("DSBUILD_CACHE", Path.home() / ".cache" / "dsbuild"))


class Store(Protocol):
    """The interface. ``url`` names the store in messages; ``local_root`` is set for local folders."""

    url: str

    @property
    def local_root(self) -> Path | None: ...

    def read(self, key: str, cap: int, *, proven: Callable[[bytes], bool] | None = None) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int | None: ...
    def modified(self, key: str) -> float | None: ...
    def list(self, prefix: str) -> list[str]: ...
    def write(self, key: str, data: bytes) -> None: ...
    def read_for_update(self, key: str, cap: int) -> tuple[bytes | None, str | None]: ...
    def write_if(self, key: str, data: bytes, token: str | None) -> bool: ...
    def put(self, local: Path, key: str) -> None: ...
    def delete(self, key: str) -> None: ...
    def read_range(self, key: str, start: int, end: int) -> bytes: ...
    def shard_file(self, key: str, sha256: str, size: int) -> Path: ...


class LocalStore:
    def __init__(self, root: Path):
        self.local_root = Path(root)
        self.url = str(root)

    def path(self, key: str) -> Path:
        p = self.local_root / check_key(key)
        if not inside(p.parent, self.local_root):
            raise UnsafeKey(f"{key}: resolves outside {self.local_root}")
        return p

    def read(self, key: str, cap: int, *, proven: Callable[[bytes], bool] | None = None) -> bytes:
        return read_capped(self.path(key), cap, root=self.local_root, what=f"{self.url}/{key}")

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int | None:
        p = self.path(key)
        return p.stat().st_size if p.is_file() else None

    def modified(self, key: str) -> float | None:
        p = self.path(key)
        return p.stat().st_mtime if p.exists() else None

    def list(self, prefix: str) -> list[str]:
        base = self.local_root / prefix if prefix else self.local_root
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = Path(dirpath).relative_to(self.local_root).as_posix()
            out += [key for name in filenames if is_key(key := name if rel == "." else f"{rel}/{name}")]
        return sorted(out)

    def write(self, key: str, data: bytes) -> None:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(p, data)

    def read_for_update(self, key: str, cap: int) -> tuple[bytes | None, str | None]:
        """A small mutable file's bytes (None if absent) for ``write_if``: a local catalog changes them under
        its lock, so there is no token."""
        return _read_or_none(self, key, cap), None

    def write_if(self, key: str, data: bytes, token: str | None) -> bool:
        self.write(key, data)
        return True

    def put(self, local: Path, key: str) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(local, target)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with open_regular(self.path(key), self.local_root) as f:
            f.seek(start)
            return f.read(end - start)

    def shard_file(self, key: str, sha256: str, size: int) -> Path:
        """The shard's file, checked to be a regular file inside the catalog (UnsafeFile otherwise):
        readers open it by its path, and a FIFO there blocked them forever, a symlink out of the catalog
        handed over another file's bytes (an export linked it)."""
        p = self.path(key)
        with open_regular(p, self.local_root):
            pass
        return p


def _fsspec(url: str):
    try:
        import fsspec
    except ImportError:
        raise MissingDependency(url, "s3", "fsspec") from None
    scheme = url.split("://", 1)[0]
    if scheme not in fsspec.available_protocols():
        raise UsageError(
            f"{url[:200]}: no file system is known for {scheme[:20]!r}://",
            hint="a local folder, or an fsspec URL such as s3://bucket/catalog",
        )
    try:
        fs, path = fsspec.core.url_to_fs(url, **_options(scheme))
    except ImportError as e:  # a known protocol whose package is not installed (gcsfs for gs://, ...)
        if scheme in ("s3", "s3a"):
            raise MissingDependency(f"{url} ({e})", "s3") from None
        raise StorageError(
            f"{url[:200]}: {str(e)[:200]}", hint="install the package it names (the s3 extra covers only s3://)"
        ) from None
    except ValueError as e:
        raise UsageError(f"{url[:200]}: {str(e)[:200]}") from None
    if scheme in ("s3", "s3a"):
        fs.retries = 1  # s3fs's own loop (a class attribute, not an option)
    return fs, path.rstrip("/")


def _options(scheme: str) -> dict:
    """s3fs and botocore try each request once, bounded by the timeouts: ``retry`` is the one retry loop.
    Their own retries, each waiting out a read timeout, multiplied by ours kept a command on an endpoint
    that accepts connections and never answers for many minutes."""
    if scheme not in ("s3", "s3a"):
        return {}
    return {
        "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retries": {"total_max_attempts": 1},
        }
    }


def _network_cause(e: FileNotFoundError) -> OSError | None:
    """The network failure behind a "missing file", if any: fsspec's HTTP file system reports a request
    that failed (connection refused, unknown host, timeout: an OSError) as FileNotFoundError, with that
    failure as its cause. A 404 (or s3fs's NoSuchKey) is not an OSError: it stays a missing file."""
    cause = e.__cause__
    return cause if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError) else None


def _read_or_none(store: Store, key: str, cap: int) -> bytes | None:
    try:
        return store.read(key, cap)
    except FileNotFoundError:
        return None


def _precondition_failed(e: OSError) -> bool:
    """s3fs's error for an S3 conditional write whose condition did not hold (HTTP 412)."""
    response = getattr(e.__cause__, "response", None)
    return isinstance(response, dict) and response.get("Error", {}).get("Code") in (
        "PreconditionFailed",
        "ConditionalRequestConflict",
    )


def retry(what: str, fn: Callable):
    """Run ``fn`` and retry transient I/O failures (dropped connections, timeouts) with backoff; give up
    with a StorageError naming ``what`` after ``RETRIES`` tries or ``DEADLINE`` seconds. A missing object is
    not transient: FileNotFoundError passes."""
    started = time.monotonic()
    for attempt in range(RETRIES):
        failure: Exception | None
        try:
            return fn()
        except FileNotFoundError as e:
            failure = _network_cause(e)
            if failure is None:
                raise
        except Exception as e:  # botocore/aiohttp raise their own types for a reset connection
            if "NoSuchKey" in type(e).__name__:
                raise FileNotFoundError(what) from None
            failure = e
        if (
            attempt == RETRIES - 1
            or time.monotonic() - started > DEADLINE
            or isinstance(failure, (FormatError, PermissionError))
        ):
            raise StorageError(
                f"{what}: {type(failure).__name__}: {str(failure)[:200]}",
                hint="check the URL, credentials and network, then run again",
            ) from None
        time.sleep(0.05 * 2**attempt)


class FsspecStore:
    """An object store (or any fsspec file system) with a verified local cache for immutable keys."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.local_root = None
        self.fs, self.root = _fsspec(self.url)
        self._conditional = self.url.split("://", 1)[0] in ("s3", "s3a")  # writes that check an ETag
        self.cache = cache_root() / "stores" / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self._shards: ShardCache | None = None

    def _remote(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _cached(self, key: str) -> Path:
        return self.cache / check_key(key)  # checked keys cannot leave the cache; read_capped re-checks

    def read(self, key: str, cap: int, *, proven: Callable[[bytes], bool] | None = None) -> bytes:
        """The key's bytes. With ``proven`` (for keys whose right bytes never change: manifests, pinned
        files, split files) they come from the local cache when a cached copy passes ``proven``, and are
        cached only once they pass it: a damaged or forged copy never sticks (a copy that fails is read
        again from the store)."""
        if proven is not None:
            p = self._cached(key)
            if p.is_file():
                data = read_capped(p, cap, root=self.cache)
                if proven(data):
                    return data
                p.unlink(missing_ok=True)
        size = retry(f"{self.url}/{key}", lambda: self.fs.size(self._remote(key)))
        if size is not None and size > cap:
            raise FormatError(f"{self.url}/{key}: larger than the limit of {cap} bytes")
        data = retry(f"{self.url}/{key}", lambda: self.fs.cat_file(self._remote(key), start=0, end=cap + 1))
        if len(data) > cap:
            raise FormatError(f"{self.url}/{key}: larger than the limit of {cap} bytes")
        if proven is not None and proven(data):
            p = self._cached(key)
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                replace_atomically(p, data)
            except OSError as e:  # the local cache, not the store: say so (it named the remote key)
                raise StorageError(
                    f"{self.cache}: cannot write the local cache ({e.strerror or e})",
                    hint="DSBUILD_CACHE must name a writable folder with free space",
                ) from None
        return data

    def exists(self, key: str) -> bool:
        """Whether the store holds an object ``key``. Asked through ``info``, not ``fs.exists``: fsspec's HTTP
        file system answers False to a refused connection, which made an unreachable server "not a
        catalog"; here only a missing object is False, a network failure a StorageError."""
        try:
            info = retry(f"{self.url}/{key}", lambda: self.fs.info(self._remote(key)))
        except FileNotFoundError:
            return False
        return info.get("type") != "directory"  # a prefix (keys under ``key/``) is not the object

    def size(self, key: str) -> int | None:
        try:
            return int(retry(f"{self.url}/{key}", lambda: self.fs.size(self._remote(key))))
        except FileNotFoundError:
            return None

    def modified(self, key: str) -> float | None:
        try:
            info = retry(f"{self.url}/{key}", lambda: self.fs.info(self._remote(key)))
        except FileNotFoundError:
            return None
        stamp = info.get("LastModified") or info.get("mtime") or info.get("created")
        return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp) if stamp else None

    def list(self, prefix: str, *, every: bool = False) -> list[str]:
        """The keys below ``prefix``: those ``check_key`` accepts (a hostile key is never followed; the
        catalog's checks name what is missing), or, with ``every``, all of them (staged captures check
        their own)."""
        self.fs.invalidate_cache(self.root)  # other writers may have published since the last listing
        base = f"{self.root}/{prefix}".rstrip("/")
        try:
            found = retry(self.url, lambda: self.fs.find(base))
        except FileNotFoundError:
            return []
        keys = (remote[len(self.root) + 1 :] if remote.startswith(self.root + "/") else None for remote in found)
        return sorted(k for k in keys if k is not None and (every or is_key(k)))

    def write(self, key: str, data: bytes) -> None:
        retry(f"{self.url}/{key}", lambda: self.fs.pipe_file(self._remote(key), data))

    def read_for_update(self, key: str, cap: int) -> tuple[bytes | None, str | None]:
        """A small mutable object's bytes (None if absent) and the token ``write_if`` checks: on S3 the ETag
        seen before the read ("*": absent), so a change made after it fails the write; None elsewhere
        (no conditional writes: one writer at a time)."""
        if not self._conditional:
            return _read_or_none(self, key, cap), None
        self.fs.invalidate_cache(self._remote(key))
        try:
            etag = retry(f"{self.url}/{key}", lambda: self.fs.info(self._remote(key)))["ETag"]
            return self.read(key, cap), etag
        except FileNotFoundError:
            return None, "*"

    def write_if(self, key: str, data: bytes, token: str | None) -> bool:
        """Write ``data`` unless the object changed since ``read_for_update`` gave ``token`` (False then: read
        again and redo the change). S3 checks it (If-Match / If-None-Match); a store that ignores the
        condition writes anyway."""
        if token is None:
            self.write(key, data)
            return True
        bucket, path, _ = self.fs.split_path(self._remote(key))
        condition = {"IfNoneMatch": "*"} if token == "*" else {"IfMatch": token}

        def put() -> bool:
            try:
                self.fs.call_s3("put_object", Bucket=bucket, Key=path, Body=data, **condition)
            except OSError as e:
                if _precondition_failed(e):
                    return False
                raise
            return True

        return retry(f"{self.url}/{key}", put)

    def put(self, local: Path, key: str) -> None:
        retry(f"{self.url}/{key}", lambda: self.fs.put_file(str(local), self._remote(key)))

    def delete(self, key: str) -> None:
        try:
            retry(f"{self.url}/{key}", lambda: self.fs.rm_file(self._remote(key)))
        except FileNotFoundError:
            pass

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return retry(f"{self.url}/{key}", lambda: self.fs.cat_file(self._remote(key), start=start, end=end))

    def shard_file(self, key: str, sha256: str, size: int) -> Path:
        return self._cache().path(key, sha256, size)

    def open_shard_file(self, key: str, sha256: str, size: int) -> tuple[Path, int]:
        return self._cache().open(key, sha256, size)

    def drop_shard_file(self, key: str, sha256: str, same: Callable[[os.stat_result], bool]) -> None:
        self._cache().drop(key, sha256, same)

    def _cache(self) -> ShardCache:
        if self._shards is None:
            self._shards = ShardCache(self)
        return self._shards


def open_store(location: str | Path) -> Store:
    return FsspecStore(str(location)) if is_url(location) else LocalStore(local_path(location))


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def _open_copy(local: Path, size: int) -> int | None:
    """A descriptor of the cached copy if it is there, a regular file and of ``size`` bytes (marked
    recently used), else None (a FIFO put there is never waited on: opened non-blocking, then judged)."""
    try:
        fd = os.open(local, _READ_FLAGS | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        os.utime(fd)  # recently used
    except BaseException:
        os.close(fd)
        raise
    return fd


class ShardCache:
    """Whole-shard local cache of a remote store: bounded, LRU-evicted, verified on arrival."""

    def __init__(self, store: FsspecStore, limit: int | None = None, directory: Path | None = None):
        self.store = store
        self.limit = limit if limit is not None else int(os.environ.get("DSBUILD_CACHE_BYTES", CACHE_LIMIT))
        self.dir = directory or cache_root() / "shards"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.downloads = 0

    def path(self, key: str, sha256: str, size: int) -> Path:
        """Local path of a verified copy of shard ``key`` (``open``, closed again)."""
        local, fd = self.open(key, sha256, size)
        os.close(fd)
        return local

    def open(self, key: str, sha256: str, size: int) -> tuple[Path, int]:
        """A verified copy of shard ``key``, opened (its path and a read-only descriptor); downloads it (by
        ranges) if needed. Processes sharing the cache evict each other's copies: the descriptor, opened
        before the copy could be evicted, keeps it readable.

        The remote object's size must be the record's (and fit the cache) before anything is evicted or
        fetched: a forged record cannot empty the cache or start an endless download. Each download
        writes a temp file of its own (``O_EXCL``; forked workers share thread idents), renamed into
        place only once the bytes written to it hash to ``sha256``."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise UnsafeKey(f"shard sha256 {sha256[:80]!r} is not a hex digest")
        local = self.dir / f"{sha256}{Path(check_key(key)).suffix}"
        with self._lock:
            fd = _open_copy(local, size)
            if fd is not None:
                return local, fd
            remote = self.store.size(key)
            if remote != size:  # the catalog's data is damaged (a LineageError), not the way to it
                raise LineageError(
                    f"{self.store.url}/{key}: "
                    + ("missing" if remote is None else f"{remote} bytes, the manifest says {size}"),
                    hint=f"run `dsbuild verify {self.store.url}` to see what is damaged",
                )
            if size > self.limit:
                raise StorageError(
                    f"{self.store.url}/{key}: {size} bytes do not fit the shard cache ({self.limit} bytes)",
                    hint="raise DSBUILD_CACHE_BYTES",
                )
            self._evict(size)
            tmp = local.with_name(f".{local.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.part")
            h = hashlib.sha256()
            try:
                with open(tmp, "xb") as f:
                    for start in range(0, size, RANGE_BYTES):
                        chunk = self.store.read_range(key, start, min(size, start + RANGE_BYTES))
                        h.update(chunk)
                        f.write(chunk)
                    written = f.tell()
                if written != size or h.hexdigest() != sha256:
                    raise StorageError(
                        f"{self.store.url}/{key}: downloaded bytes do not match the manifest's sha256",
                        hint=f"run `dsbuild verify {self.store.url}` to see what is damaged",
                    )
                fd = os.open(tmp, _READ_FLAGS)  # before it is in place, where another process may evict it
                try:
                    os.replace(tmp, local)
                except BaseException:
                    os.close(fd)
                    raise
            finally:
                tmp.unlink(missing_ok=True)
            self.downloads += 1
            return local, fd

    def drop(self, key: str, sha256: str, same: Callable[[os.stat_result], bool]) -> None:
        """Remove the cached copy of shard ``key`` if it is still the file ``same`` recognises (one found
        damaged on local disk: the next ``path`` fetches it again; a fresh copy another process put in its
        place since is kept)."""
        local = self.dir / f"{sha256}{Path(check_key(key)).suffix}"
        with self._lock:
            try:
                if same(local.stat()):
                    local.unlink()
            except FileNotFoundError:
                pass

    def _evict(self, incoming: int) -> None:
        """Oldest shards out until ``incoming`` bytes fit; temp files of downloads that were killed (older
        than ``PART_GRACE``) out too: nothing else would ever remove them."""
        now = time.time()
        for p in self.dir.glob(".*.part"):
            try:
                if now - p.lstat().st_mtime > PART_GRACE:
                    p.unlink()
            except FileNotFoundError:
                pass
        files = []  # (another process sharing the cache may remove any of them meanwhile)
        for p in self.dir.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and not p.name.startswith("."):
                files.append((st.st_mtime, st.st_size, p))
        files.sort()
        total = sum(size for _, size, _ in files)
        while files and total + incoming > self.limit:
            _, size, victim = files.pop(0)
            total -= size
            victim.unlink(missing_ok=True)

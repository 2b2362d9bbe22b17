"""Catalogs and capture roots on object storage (any fsspec URL, e.g. ``s3://bucket/prefix``).

A remote catalog is worked on through a local mirror of its small files (catalog.json, tags, every
version's manifest/index/commit, split sets) under ``$DSBUILD_CACHE`` (default ``~/.cache/dsbuild``).
Builds commit into the mirror as usual, then ``push`` uploads new shards, the version's index and
commit record, and the manifest last: a version without its manifest is invisible, so a build killed
mid-upload publishes nothing. Shards are read back through ``ShardCache``: downloaded with byte-range
requests (each range retried on a dropped connection), verified against the manifest's sha256,
kept within a size limit and evicted least-recently-used; a cached, verified shard is never
downloaded again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dsbuild.errors import DsbuildError, UsageError
from dsbuild.lineage.catalog import MARKER, Catalog, write_file_durably

RANGE_BYTES = 8 << 20
RETRIES = 5
CACHE_LIMIT = 20 << 30  # 20 GB of shards by default; DSBUILD_CACHE_BYTES overrides


def is_url(path: object) -> bool:
    text = str(path)
    return "://" in text and not text.startswith("file://")


def cache_root() -> Path:
    return Path(os.environ.get("DSBUILD_CACHE", Path.home() / ".cache" / "dsbuild"))


def _fs(url: str):
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{url}: object storage needs fsspec: pip install 'dsbuild[s3]'") from None
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


def _retry(what: str, fn):
    """Run ``fn`` and retry transient I/O failures (dropped connections, timeouts) with backoff."""
    for attempt in range(RETRIES):
        try:
            return fn()
        except (OSError, TimeoutError) as e:
            if isinstance(e, FileNotFoundError) or attempt == RETRIES - 1:
                raise DsbuildError(f"{what}: {e}") from None
            time.sleep(0.05 * 2 ** attempt)
        except Exception as e:  # botocore/aiohttp raise their own types for a reset connection
            if attempt == RETRIES - 1 or "NoSuchKey" in type(e).__name__:
                raise DsbuildError(f"{what}: {type(e).__name__}: {e}") from None
            time.sleep(0.05 * 2 ** attempt)


class RemoteCatalog:
    """A catalog at an fsspec URL, with its local mirror."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.path = _fs(self.url)
        self.mirror = cache_root() / "catalogs" / hashlib.sha256(self.url.encode()).hexdigest()[:16]

    def _remote(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise builds into one remote catalog from this machine (object stores have no rename;
        writers on different machines are kept apart by content addressing and manifest-last commits)."""
        self.mirror.parent.mkdir(parents=True, exist_ok=True)
        with open(self.mirror.parent / f"{self.mirror.name}.lock", "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def exists(self) -> bool:
        self.fs.invalidate_cache(self.path)
        return _retry(self.url, lambda: self.fs.exists(self._remote(MARKER)))

    def pull(self, *, create: bool = False) -> Catalog:
        """Bring the mirror up to date with the remote's small files and return it as a Catalog."""
        if not self.exists():
            if not create:
                raise UsageError(f"{self.url}: not a dsbuild catalog (no {MARKER})")
            if self.mirror.exists():
                shutil.rmtree(self.mirror)
        else:
            self._download_metadata()
        catalog = Catalog.open(self.mirror, create=True)
        catalog.remote = self
        return catalog

    def _download_metadata(self) -> None:
        self.mirror.mkdir(parents=True, exist_ok=True)
        self.fs.invalidate_cache(self.path)  # other writers may have published since the last listing
        files = _retry(self.url, lambda: self.fs.find(self.path))
        for remote in files:
            rel = remote[len(self.path) + 1:]
            if rel.startswith(("shards/", ".tmp/")) or ".." in rel.split("/"):
                continue
            if rel.startswith("versions/") and not self.fs.exists(self._remote(
                    "/".join(rel.split("/")[:2]) + "/manifest.json")):
                continue  # an unfinished upload: invisible
            local = self.mirror / rel
            if local.exists() and rel.startswith(("versions/", "splits/")) and not rel.endswith("tags.json"):
                continue  # versions and split sets are immutable once published
            local.parent.mkdir(parents=True, exist_ok=True)
            data = _retry(remote, lambda: self.fs.cat_file(remote))
            write_file_durably(local, data)

    def push(self, catalog: Catalog, version_id: str) -> int:
        """Upload a version committed in the mirror: shards, then files, manifest last. Returns bytes sent."""
        sent = 0
        if not self.exists():
            self._put(catalog.root / MARKER, MARKER)
        manifest = catalog.manifest(version_id)
        for shard in manifest.shards:
            local = catalog.root / shard.path
            if not _retry(shard.path, lambda: self.fs.exists(self._remote(shard.path))):
                if not local.exists():
                    raise DsbuildError(f"{shard.path}: not in the remote catalog nor in the local build")
                sent += self._put(local, shard.path)
            local.unlink(missing_ok=True)  # the remote holds it now; reads go through ShardCache
        vdir = f"versions/{version_id}"
        for name in (manifest.index["path"], "commit.json", "manifest.json"):  # manifest last
            sent += self._put(catalog.root / vdir / name, f"{vdir}/{name}")
        return sent

    def push_files(self, catalog: Catalog, rels: list[str]) -> None:
        """Upload small catalog files (tags, split sets) after a local change."""
        for rel in rels:
            self._put(catalog.root / rel, rel)

    def _put(self, local: Path, rel: str) -> int:
        _retry(rel, lambda: self.fs.put_file(str(local), self._remote(rel)))
        return local.stat().st_size

    def open(self, rel: str):
        return self.fs.open(self._remote(rel), "rb")

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        return _retry(f"{self.url}/{rel}", lambda: self.fs.cat_file(self._remote(rel), start=start, end=end))


class ShardCache:
    """Whole-shard local cache of a remote catalog: bounded, LRU-evicted, verified on arrival."""

    def __init__(self, remote: RemoteCatalog, limit: int | None = None, directory: Path | None = None):
        self.remote = remote
        self.limit = limit if limit is not None else int(os.environ.get("DSBUILD_CACHE_BYTES", CACHE_LIMIT))
        self.dir = directory or cache_root() / "shards"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.downloads = 0

    def path(self, rel: str, sha256: str, size: int) -> Path:
        """Local path of a verified copy of shard ``rel``; downloads it (by ranges) if needed."""
        local = self.dir / f"{sha256}{Path(rel).suffix}"
        with self._lock:
            if local.exists() and local.stat().st_size == size:
                os.utime(local)  # recently used
                return local
            self._evict(size)
            tmp = local.with_suffix(f".part{threading.get_ident()}")
            h = hashlib.sha256()
            with open(tmp, "wb") as f:
                for start in range(0, size, RANGE_BYTES):
                    chunk = self.remote.read_range(rel, start, min(size, start + RANGE_BYTES))
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != sha256:
                tmp.unlink()
                raise DsbuildError(f"{self.remote.url}/{rel}: downloaded bytes do not match the manifest sha256")
            os.replace(tmp, local)
            self.downloads += 1
            return local

    def _evict(self, incoming: int) -> None:
        files = sorted((p for p in self.dir.iterdir() if p.is_file() and ".part" not in p.name),
                       key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        while files and total + incoming > self.limit:
            victim = files.pop(0)
            total -= victim.stat().st_size
            victim.unlink(missing_ok=True)


@contextmanager
def staged_captures(url: str) -> Iterator[Path]:
    """Download a capture root from object storage into a private temporary folder (removed after).

    Paths inside stay relative to the root, so the build is byte-identical to one from a local copy."""
    fs, root = _fs(url)
    tmp = Path(tempfile.mkdtemp(prefix="dsbuild-captures-", dir=cache_root() if cache_root().exists() else None))
    try:
        files = _retry(url, lambda: fs.find(root))
        if not files:
            raise UsageError(f"{url}: capture folder does not exist or is empty")
        for remote in files:
            rel = remote[len(root) + 1:]
            if not rel or ".." in rel.split("/"):
                continue
            local = tmp / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            _retry(remote, lambda: fs.get_file(remote, str(local)))
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""The catalog: a folder holding versions side by side over one pool of content-addressed shards.

    <root>/catalog.json                 marker {"format": "dsbuild.catalog/1"}
    <root>/shards/ab/<sha256>.<ext>     shards, named by their hash, shared by every version using them
    <root>/versions/<id>/manifest.json  the version (id = sha256 of these bytes)
    <root>/versions/<id>/index.parquet  per-sample index and lineage
    <root>/versions/<id>/commit.json    when it was committed and from what (not part of the id)
    <root>/.tmp/<build>/                work in progress, locked by its build while it runs

A version becomes visible by one atomic rename of a complete folder, after its shards are in place, so
a killed build never leaves a version that looks complete. Stale build folders (their lock is free) are
removed by the next build.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from dsbuild.errors import LineageError, StorageError, UsageError
from dsbuild.formats.safejson import loads_bounded, pretty_json
from dsbuild.lineage.manifest import Manifest

CATALOG_FORMAT = "dsbuild.catalog/1"
TAGS_FORMAT = "dsbuild.tags/1"
MARKER = "catalog.json"
TAGS = "tags.json"
VERSION_RE = re.compile(r"[0-9a-f]{64}")
TAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file_atomically(path: Path, data: bytes) -> None:
    """Readers see the old bytes or the new ones, never a mix (write beside, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    write_file_durably(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass(frozen=True)
class VersionInfo:
    version_id: str
    created_at: str
    commit: dict


class BuildArea:
    """A private, locked scratch folder for one build inside the catalog (same file system: rename works)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = None

    def __enter__(self) -> "BuildArea":
        self.path.mkdir(parents=True)
        self._lock = open(self.path / "lock", "wb")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


class Catalog:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.remote = None  # a RemoteCatalog when this is the local mirror of an object-store catalog
        self._shard_cache = None

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, root: Path, *, create: bool = False) -> "Catalog":
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise UsageError(f"{root}: is a file; a catalog is a folder")
        marker = root / MARKER
        if not marker.is_file():
            if not create:
                raise UsageError(f"{root}: not a dsbuild catalog (no {MARKER}); create one with `dsbuild convert`")
            if root.exists() and any(p.name not in ("shards", "versions", ".tmp") for p in root.iterdir()):
                raise UsageError(f"{root}: folder is not empty and not a dsbuild catalog; choose a new folder")
            for sub in ("shards", "versions", ".tmp"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            write_file_durably(marker, pretty_json({"format": CATALOG_FORMAT}))
        else:
            doc = loads_bounded(marker.read_bytes(), max_bytes=1 << 16, what=str(marker))
            if not isinstance(doc, dict) or doc.get("format") != CATALOG_FORMAT:
                raise UsageError(f"{marker}: unknown catalog format {doc!r}")
        return cls(root)

    # -- layout ---------------------------------------------------------------------------------
    def shard_path(self, sha256: str, ext: str) -> str:
        return f"shards/{sha256[:2]}/{sha256}.{ext}"

    def version_dir(self, version_id: str) -> Path:
        return self.root / "versions" / version_id

    # -- writing --------------------------------------------------------------------------------
    @contextmanager
    def build_area(self) -> Iterator[BuildArea]:
        # Under the catalog lock, so a cleaner never sees a build folder between its mkdir and its flock.
        with self.lock():
            self.clean_stale_builds()
            try:
                area = BuildArea(self.root / ".tmp" / uuid.uuid4().hex).__enter__()
            except OSError as e:
                raise StorageError(f"{self.root}: cannot create a build folder ({e.strerror or e})") from None
        try:
            yield area
        finally:
            area.__exit__(None, None, None)

    def clean_stale_builds(self) -> list[str]:
        """Remove build folders whose build is gone (their lock can be taken)."""
        removed = []
        tmp = self.root / ".tmp"
        for area in sorted(tmp.iterdir()) if tmp.is_dir() else []:
            lock = area / "lock"
            try:
                with open(lock, "rb") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live build
            except OSError:
                pass  # no lock file: the build died before creating it
            shutil.rmtree(area, ignore_errors=True)
            removed.append(area.name)
        return removed

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises commits, tag changes and gc (readers never need it: every write is a rename)."""
        with open(self.root / ".tmp" / "commit.lock", "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def commit(self, area: BuildArea, shards: list[tuple[Path, str]], manifest: Manifest,
               index_bytes: bytes, commit_info: dict) -> tuple[str, bool]:
        """Move shards into place, then publish the version folder with one rename.

        Returns (version id, existed): re-committing an identical version is a no-op, not an error.
        """
        try:
            return self._commit(area, shards, manifest, index_bytes, commit_info)
        except OSError as e:
            raise StorageError(f"{self.root}: commit failed, nothing was committed ({e.strerror or e})") from None

    def _commit(self, area: BuildArea, shards: list[tuple[Path, str]], manifest: Manifest,
                index_bytes: bytes, commit_info: dict) -> tuple[str, bool]:
        manifest_bytes = manifest.to_bytes()
        version_id = manifest.version_id
        with self.lock():
            for tmp_path, rel in shards:
                target = self.root / rel
                if target.exists():
                    tmp_path.unlink()  # same name = same sha256 = same bytes
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp_path, target)
                fsync_dir(target.parent)
            final = self.version_dir(version_id)
            if final.is_dir():
                return version_id, True
            staging = area.path / "version"
            staging.mkdir()
            write_file_durably(staging / manifest.index["path"], index_bytes)
            sequence = 1 + max((v.commit.get("sequence", 0) for v in self.versions()), default=0)
            write_file_durably(staging / "commit.json", pretty_json(
                {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sequence": sequence,
                 **commit_info}))
            write_file_durably(staging / "manifest.json", manifest_bytes)
            fsync_dir(staging)
            os.rename(staging, final)
            fsync_dir(final.parent)
        return version_id, False

    # -- shard access (local files, or a remote catalog through its verified cache) ---------------
    def shard_file(self, rel: str) -> Path:
        """A local path holding shard ``rel`` (for a remote catalog: a verified cached copy)."""
        if self.remote is None:
            return self.root / rel
        if self._shard_cache is None:
            from dsbuild.lineage.remote import ShardCache

            self._shard_cache = ShardCache(self.remote)
        rec = self._shard_records().get(rel)
        if rec is None:
            raise LineageError(f"{self.remote.url}: no version references shard {rel}")
        return self._shard_cache.path(rel, rec.sha256, rec.bytes)

    def _shard_records(self) -> dict:
        if not hasattr(self, "_records"):
            self._records = {s.path: s for v in self.versions() for s in self.manifest(v.version_id).shards}
        return self._records

    def open_shard(self, rel: str):
        """A binary file object over shard ``rel`` as stored (remote bytes are streamed, not cached)."""
        return self.remote.open(rel) if self.remote is not None else open(self.root / rel, "rb")

    def shard_exists(self, rel: str) -> tuple[bool, int]:
        """(exists, size) of a stored shard."""
        if self.remote is not None:
            fs, path = self.remote.fs, self.remote._remote(rel)
            return (True, int(fs.size(path))) if fs.exists(path) else (False, 0)
        p = self.root / rel
        return (True, p.stat().st_size) if p.is_file() else (False, 0)

    # -- reading --------------------------------------------------------------------------------
    def versions(self) -> list[VersionInfo]:
        """Committed versions, newest first."""
        out = []
        vdir = self.root / "versions"
        for d in vdir.iterdir() if vdir.is_dir() else []:
            if not VERSION_RE.fullmatch(d.name) or not (d / "manifest.json").is_file():
                continue
            try:
                commit = json.loads((d / "commit.json").read_text())
            except (OSError, ValueError):
                commit = {}
            out.append(VersionInfo(d.name, str(commit.get("created_at", "")), commit))
        # The commit sequence (assigned under the commit lock) orders versions made within one second.
        return sorted(out, key=lambda v: (v.commit.get("sequence", 0), v.created_at, v.version_id), reverse=True)

    def manifest(self, version_id: str) -> Manifest:
        path = self.version_dir(version_id) / "manifest.json"
        try:
            data = path.read_bytes()
        except OSError:
            raise LineageError(f"{self.root}: version {version_id} has no manifest") from None
        return Manifest.from_bytes(data, str(path))

    def tags(self) -> dict[str, str]:
        path = self.root / TAGS
        if not path.is_file():
            return {}
        doc = loads_bounded(path.read_bytes(), max_bytes=1 << 24, what=str(path))
        tags = doc.get("tags") if isinstance(doc, dict) else None
        if not isinstance(tags, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and VERSION_RE.fullmatch(v) for k, v in tags.items()):
            raise LineageError(f"{path}: malformed tags file")
        return tags

    def set_tag(self, name: str, ref: str | None, *, force: bool = False, delete: bool = False) -> str | None:
        """Create, move (``force``) or delete a tag; returns the version it points at (None if deleted)."""
        if not TAG_RE.fullmatch(name) or VERSION_RE.fullmatch(name):
            raise UsageError(f"tag {name!r}: use a letter then letters, digits, '.', '_' or '-' (max 64)")
        with self.lock():
            tags = self.tags()
            if delete:
                if name not in tags:
                    raise UsageError(f"{self.root}: no tag {name!r}")
                del tags[name]
                target = None
            else:
                target = self.resolve(ref)
                if name in tags and tags[name] != target and not force:
                    raise UsageError(f"tag {name!r} already points at {tags[name][:12]}; use --force to move it")
                tags[name] = target
            replace_file_atomically(self.root / TAGS, pretty_json({"format": TAGS_FORMAT, "tags": tags}))
        return target

    def gc(self, *, dry_run: bool = False) -> list[tuple[str, int]]:
        """Remove shards that no committed version references (every version keeps all of its shards)."""
        with self.lock():
            used = {s.path for v in self.versions() for s in self.manifest(v.version_id).shards}
            garbage = []
            for p in sorted((self.root / "shards").glob("*/*")):
                rel = p.relative_to(self.root).as_posix()
                if rel not in used:
                    garbage.append((rel, p.stat().st_size))
                    if not dry_run:
                        p.unlink()
            if not dry_run:
                self.clean_stale_builds()
        return garbage

    def resolve(self, ref: str | None) -> str:
        """A tag, a version id, a unique prefix of one, or None for the newest. Tags win over prefixes."""
        versions = self.versions()
        if not versions:
            raise UsageError(f"{self.root}: catalog has no versions yet")
        if not ref:
            return versions[0].version_id
        tags = self.tags()
        if ref in tags:
            return tags[ref]
        matches = [v.version_id for v in versions if v.version_id.startswith(ref.lower())]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(f"{self.root}: no version matches {ref!r}")
        raise UsageError(f"{self.root}: {ref!r} is ambiguous ({len(matches)} versions); give more characters")


def parse_ref(ref: str) -> tuple[str, str | None]:
    """'PATH[@VERSION]' -> (path or URL, version or None). VERSION is an id, a unique id prefix or a tag."""
    path, at, version = str(ref).rpartition("@")
    if not at:
        return str(ref), None
    if not version:
        raise UsageError(f"{ref!r}: nothing after '@'; use PATH@VERSION")
    return path, version


def open_catalog(path: str | Path, *, create: bool = False) -> Catalog:
    """A catalog at a local path or an fsspec URL (then: its synced local mirror)."""
    from dsbuild.lineage.remote import RemoteCatalog, is_url

    if is_url(path):
        return RemoteCatalog(str(path)).pull(create=create)
    return Catalog.open(Path(path), create=create)


def open_ref(ref: str) -> tuple[Catalog, str]:
    """'PATH[@VERSION]' -> (catalog, full version id). PATH may be an fsspec URL."""
    path, version = parse_ref(ref)
    catalog = open_catalog(path)
    return catalog, catalog.resolve(version)

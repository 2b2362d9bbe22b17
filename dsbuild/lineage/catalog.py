"""The catalog: versions side by side over one pool of content-addressed shards, on any ``Store``.

    catalog.json                       marker {"format": "dsbuild.catalog/2"}
    shards/ab/<sha256>.<ext>           shards, named by their hash, shared by every version using them
    versions/<id>/manifest.json        the version (id = sha256 of these bytes)
    versions/<id>/index.parquet        per-sample index and lineage, pinned by sha256 in the manifest
    versions/<id>/sessions.json        per-session records and source files, pinned likewise
    versions/<id>/commit.json          when it was committed and from what (not part of the id)
    splits/<id>/<name>.json            pointer to the current split set folder (replaced atomically)
    splits/<id>/<name>/<hash>/...      split set folders (immutable, named by their hash)
    tags.json                          tag -> version id (replaced atomically)
    .tmp/<build>/                      a local build in progress, flock-ed while it runs

Tamper-evidence: a manifest is accepted only if its sha256 is the version folder's name; the index and
sessions files only if their sha256 is the manifest's pin; a shard only if named by its sha256 (and, when
read, its bytes hash to it). Commits: shards first, then the version, manifest last (local: one rename of
a complete folder), and never a version that references a shard the store does not hold or whose pinned
files are not the bytes it pins.
"""

from __future__ import annotations

import difflib
import fcntl
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TypeVar, cast

from dsbuild.core.errors import FormatError, LineageError, StorageError, UsageError
from dsbuild.core.files import INTERRUPTED_WRITE, PARENT_ONLY_FDS, UnsafeFile, fsync_dir, read_capped, write_durably
from dsbuild.core.hashing import hashes_to, sha256_bytes
from dsbuild.core.jsonio import loads_bounded, pretty_json
from dsbuild.core.records import SHA256, Record, spec
from dsbuild.core.store import FsspecStore, Store, cache_root, is_key, open_store, parses
from dsbuild.lineage.index import INDEX_FILE, MAX_INDEX_BYTES, table_from_bytes
from dsbuild.lineage.manifest import (
    MAX_MANIFEST_BYTES,
    MAX_SESSIONS_BYTES,
    FilePin,
    Manifest,
    SessionColumnsTable,
    SessionsFile,
    SessionTable,
    ShardRecord,
)

F = TypeVar("F", bound=SessionsFile)
CATALOG_FORMAT = "dsbuild.catalog/2"
MARKER = "catalog.json"
TAGS = "tags.json"
HOLDS = "holds"  # in a build folder: the catalog keys the build needs kept until it publishes
MAX_HOLDS_BYTES = 64 << 20
MARKER_WRITE_GRACE = 60.0  # seconds: a catalog marker being written by another process is younger
TAG_TRIES = 8  # a tag change re-read and redone when others changed tags.json meanwhile (S3)
VERSION_RE = re.compile(SHA256)
TAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")
MAX_SMALL_FILE = 16 << 20  # tags, commit records, markers
PUBLISHED: list[str] = []  # versions this process published, in order: what an interrupted command kept


@dataclass(frozen=True, slots=True)
class CommitRecord(Record):
    """How a version came to be (not part of its id): when, in which order, from what."""

    FORMAT = "dsbuild.commit/1"
    created_at: str
    sequence: int = field(metadata=spec(minimum=0))
    parent: str | None = field(metadata=spec(pattern=SHA256))
    captures: str | None  # where the captures were (a path or URL on the building machine), for healing
    # A summary, so `log` reads one small file per version (not manifests and indexes):
    shard_format: str
    samples: int = field(metadata=spec(minimum=0))
    bytes: int = field(metadata=spec(minimum=0))
    content_id: str = field(metadata=spec(pattern=SHA256))
    change: dict[str, int]  # added / removed / changed samples against the parent (empty without one)


@dataclass(frozen=True, slots=True)
class TagsFile(Record):
    FORMAT = "dsbuild.tags/1"
    tags: dict[str, str]


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version_id: str
    commit: CommitRecord | None

    @property
    def created_at(self) -> str:
        return self.commit.created_at if self.commit else ""

    @property
    def parent(self) -> str | None:
        return self.commit.parent if self.commit else None


class BuildArea:
    """A private, locked scratch folder for one build (for a local catalog: inside it, so renames work)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock: BinaryIO | None = None  # open, and flocked, while the build runs

    def __enter__(self) -> BuildArea:
        self.path.mkdir(parents=True)
        self._lock = lock = open(self.path / "lock", "wb")
        fcntl.flock(lock, fcntl.LOCK_EX)
        PARENT_ONLY_FDS.add(lock.fileno())
        return self

    def hold(self, key: str) -> None:
        """Name a catalog key this build needs before it publishes (a shard a push sends, or finds there
        unreferenced): ``gc`` keeps what a live build holds. Named before the key is written or checked,
        so a gc that lists the key afterwards also finds it held."""
        with open(self.path / HOLDS, "a", encoding="utf-8") as f:
            f.write(key + "\n")

    def __exit__(self, *exc) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            raise UsageError(f"build area {self.path} left without being entered (use `with BuildArea(path)`)")
        shutil.rmtree(self.path, ignore_errors=True)
        PARENT_ONLY_FDS.discard(lock.fileno())
        lock.close()


_NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def real_folder(path: Path) -> Path:
    """``path``, created if needed, when it is a folder of its own: a symlink in its place would point
    the cleaning of build folders at folders outside the catalog (StorageError)."""
    try:
        path.mkdir(exist_ok=True)
        is_dir = stat.S_ISDIR(path.lstat().st_mode)
    except OSError as e:
        raise StorageError(
            f"{path}: cannot create a folder ({e.strerror or e})",
            hint="check free space and permissions of the catalog",
        ) from None
    if not is_dir:
        raise StorageError(
            f"{path}: is not a folder (a symlink?); dsbuild keeps its build folders there",
            hint="remove it: dsbuild creates it again",
        )
    return path


def _build_is_gone(area: Path) -> bool:
    """Whether the build folder ``area`` (a real folder) is stale: its lock is free, or it has none (the
    build died before creating it). A lock that is a symlink, a FIFO or anything but a file is not
    dsbuild's: the folder is left alone."""
    try:
        fd = os.open(area / "lock", os.O_RDONLY | _NO_FOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False  # a live build
    finally:
        os.close(fd)


LOCK_NOTICE_SECONDS = 0.5  # a command that has waited this long for a catalog lock says for whom
_lock_timeout: float | None = None  # seconds a command waits for a catalog lock; None: as long as it takes


def set_lock_timeout(seconds: float | None) -> None:
    """How long commands wait for a held catalog lock before giving up (StorageError, exit 3) — the
    Python side of ``--lock-timeout``; None (the default) waits as long as the holder holds it. A holder
    that dies releases its lock with it: its waiters take over at once."""
    global _lock_timeout
    if seconds is not None and not (isinstance(seconds, (int, float)) and 0 <= seconds < float("inf")):
        raise UsageError(f"a lock timeout is a number of seconds >= 0, not {str(seconds)[:40]!r}")
    _lock_timeout = seconds


def _printable(text: str, limit: int = 160) -> str:
    """``text`` cut to ``limit`` characters with control characters replaced (a lock file is untrusted)."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


def lock_holder(path: Path) -> str:
    """Who holds the lock file ``path``, as its holder recorded it (pid and command), for a waiting
    message: "pid 4242 (dsbuild tag cat gold v1), stopped"; "another process" where nothing is recorded."""
    try:
        fd = os.open(path, os.O_RDONLY | _NO_FOLLOW)
        try:
            doc = loads_bounded(os.read(fd, 4096), max_bytes=4096, what=path.name)
        finally:
            os.close(fd)
        pid, command = doc["pid"], doc["command"]
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(command, str):
            raise TypeError
    except (OSError, FormatError, TypeError, KeyError):
        return "another process"
    state = ""
    with suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{pid}/stat", "rb") as f:
            code = f.read().rsplit(b")", 1)[1].split()[0]
        state = {b"T": f", stopped (`kill -CONT {pid}` resumes it)", b"t": ", stopped by a debugger"}.get(code, "")
    return f"pid {pid} ({_printable(command)}){state}"


def _record_holder(fd: int) -> None:
    """Write who holds the lock into its file (read by waiters for their message; best effort)."""
    import sys

    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:400]
    # an argument that is not UTF-8 (a folder named in another encoding) arrives with surrogates: escaped
    doc = {"pid": os.getpid(), "command": command.encode("utf-8", "backslashreplace").decode("utf-8")}
    with suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, pretty_json(doc))


@contextmanager
def flocked(
    path: Path, what: str, *, timeout: float | None = None, notify: Callable[[str], None] | None = None
) -> Iterator[None]:
    """An exclusive ``flock`` on the lock file ``path`` (created if needed; a symlink, FIFO or anything but
    a file there is a StorageError, never followed or waited on). A held lock is waited for: after
    ``LOCK_NOTICE_SECONDS`` ``notify`` (default: a line on stderr) says for whom (the pid and command its
    holder recorded), and after ``timeout`` seconds (None: never) the wait ends in a StorageError (exit 3)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NO_FOLLOW, 0o644)
    except OSError as e:
        raise StorageError(
            f"{what} ({e.strerror or e})",
            hint=f"is the catalog read-only? check its permissions; a {path.name} that is not a file must be removed",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StorageError(f"{path}: is not a file", hint="remove it: dsbuild creates it again")
        os.set_blocking(fd, True)
        _wait_for(fd, path, what, timeout, notify)
        _record_holder(fd)
        yield
    finally:
        os.close(fd)


def _wait_for(fd: int, path: Path, what: str, timeout: float | None, notify: Callable[[str], None] | None) -> None:
    """Take the flock on ``fd``, polling while another process holds it (see ``flocked``)."""
    started, told, step = time.monotonic(), False, 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - started
        if not told and waited >= LOCK_NOTICE_SECONDS:  # (before the timeout: a stalled poll still says why)
            told = True
            line = f"waiting for {path}: held by {lock_holder(path)}" + (
                f"; giving up after {timeout:g} s" if timeout is not None else "; --lock-timeout SECONDS gives up"
            )
            (notify or _to_stderr)(line)
        if timeout is not None and waited >= timeout:
            raise StorageError(
                f"{what}: still held by {lock_holder(path)} after {timeout:g} s",
                hint="run again when it is done, or end that process (a dead holder releases the lock at once)",
            )
        time.sleep(step if timeout is None else min(step, max(0.0, timeout - waited)))
        step = min(step * 2, 0.1)


def _to_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def _clean(folder: Path, dry_run: bool) -> list[str]:
    """Remove (unless ``dry_run``) the dead build folders under ``folder`` (locked); return their names."""
    out = []
    for area in stale_builds(folder):
        out.append(area.name)
        if not dry_run:
            shutil.rmtree(area, ignore_errors=True)
    return out


def _held(area: Path) -> set[str]:
    """The keys a live build folder holds (``BuildArea.hold``); only well-formed keys count."""
    try:
        text = read_capped(area / HOLDS, MAX_HOLDS_BYTES, what=f"{area}/{HOLDS}").decode("utf-8", "replace")
    except FileNotFoundError:
        return set()
    return {k for k in text.splitlines() if is_key(k)}


def stale_builds(folder: Path) -> list[Path]:
    """Build folders under ``folder`` whose build is gone; never a symlink, nor anything behind one."""
    try:
        if not stat.S_ISDIR(folder.lstat().st_mode):
            return []
    except FileNotFoundError:
        return []
    out = []
    for area in sorted(folder.iterdir()):
        try:
            if stat.S_ISDIR(area.lstat().st_mode) and _build_is_gone(area):
                out.append(area)
        except FileNotFoundError:  # its build just finished and removed it
            continue
    return out


class Catalog:
    """One catalog on a Store. Construct with ``Catalog.open(path_or_url)``."""

    def __init__(self, store: Store):
        self.store = store
        self._manifests: dict[str, Manifest] = {}
        self._sessions: dict[tuple[str, type], SessionsFile] = {}  # (version, the records read)

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, location: str | Path, *, create: bool = False) -> Catalog:
        store = open_store(location)
        cat = cls(store)
        root = store.local_root
        if root is not None and root.exists() and not root.is_dir():
            raise UsageError(f"{root}: is a file; a catalog is a folder")
        try:
            present = store.exists(MARKER)
        except (OSError, FormatError) as e:
            raise StorageError(f"{store.url}: cannot read the catalog ({e})") from None
        if not present:
            if (root / MARKER).is_dir() if root is not None else store.list(MARKER):
                raise UsageError(
                    f"{store.url}/{MARKER}: is a folder, not the catalog's marker file; not a dsbuild catalog"
                )
            _refuse_a_ref(str(location))
            if not create:
                raise UsageError(
                    f"{store.url}: not a dsbuild catalog (no {MARKER})",
                    hint="create one with `dsbuild convert CAPTURES CATALOG`",
                )
            if parse_ref(str(location))[1] is not None:  # every command would read it as a version of another
                raise UsageError(
                    f"{location}: a catalog's name cannot hold '@' (PATH@VERSION names a version)",
                    hint="choose a name without '@'",
                )
            if root is not None and root.exists():
                for p in root.iterdir():
                    if INTERRUPTED_WRITE.match(p.name) and p.is_file():
                        # a creation killed while it wrote the marker; a young one may be another process
                        # creating the same catalog right now (removing it failed that creation)
                        if _age(p) > MARKER_WRITE_GRACE:
                            p.unlink(missing_ok=True)
                    elif p.name not in ("shards", "versions", ".tmp", MARKER):  # (the marker: another process
                        # creating this catalog right now wrote it since it was looked for: the same bytes)
                        raise UsageError(f"{root}: folder is not empty and not a dsbuild catalog; choose a new folder")
            try:
                store.write(MARKER, pretty_json({"format": CATALOG_FORMAT}))
            except OSError as e:
                raise StorageError(f"{store.url}: cannot create the catalog ({e.strerror or e})") from None
        else:
            doc = loads_bounded(cat._read(MARKER, 1 << 16), max_bytes=1 << 16, what=f"{store.url}/{MARKER}")
            fmt = doc.get("format") if isinstance(doc, dict) else None
            if fmt != CATALOG_FORMAT:
                raise UsageError(
                    f"{store.url}: catalog format {str(fmt)[:40]!r} is not {CATALOG_FORMAT}",
                    hint="it was made by another dsbuild version; convert the captures again",
                )
        if root is not None:
            (root / ".tmp").mkdir(exist_ok=True)
        return cat

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def root(self) -> Path | None:
        """The local folder, for a local catalog (None for an object store)."""
        return self.store.local_root

    def _read(self, key: str, cap: int, *, proven: Callable[[bytes], bool] | None = None) -> bytes:
        """A catalog file's bytes; one the store refuses (over ``cap``, a FIFO, a link out of the catalog) is
        a damaged catalog (exit 3), named."""
        try:
            return self._read_raw(key, cap, proven=proven)
        except FormatError as e:
            raise _damaged(self.url, key, e) from None

    def _read_raw(self, key: str, cap: int, *, proven: Callable[[bytes], bool] | None = None) -> bytes:
        """``_read`` with the store's refusals left as FormatError (a pinned file says why itself)."""
        try:
            return self.store.read(key, cap, proven=proven)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StorageError(f"{self.url}/{key}: cannot read ({e.strerror or e})") from None

    # -- versions -------------------------------------------------------------------------------
    def versions(self) -> list[VersionInfo]:
        """Committed versions (those with a manifest), newest first."""
        out = []
        for key in self.store.list("versions"):
            parts = key.split("/")
            if len(parts) != 3 or parts[2] != "manifest.json" or not VERSION_RE.fullmatch(parts[1]):
                continue
            out.append(VersionInfo(parts[1], self.commit_record(parts[1])))
        # The commit sequence (assigned under the commit lock) orders versions made within one second.
        return sorted(
            out, key=lambda v: (v.commit.sequence if v.commit else 0, v.created_at, v.version_id), reverse=True
        )

    def commit_record(self, version_id: str) -> CommitRecord | None:
        key = f"versions/{version_id}/commit.json"

        def parse(data: bytes) -> CommitRecord:
            return CommitRecord.from_json(loads_bounded(data, max_bytes=MAX_SMALL_FILE, what=key), key)

        try:  # nothing pins it: a copy is kept once it parses
            data = self._read(key, MAX_SMALL_FILE, proven=parses(parse))
        except FileNotFoundError:
            return None
        try:
            return parse(data)
        except FormatError as e:
            raise LineageError(
                f"{self.url}/{e}",
                hint=f"restore {key} or delete it (the version stays intact; only its date and parent are lost)",
            ) from None

    def manifest(self, version_id: str) -> Manifest:
        """The version's manifest, proven: its sha256 must be the version id."""
        if version_id in self._manifests:
            return self._manifests[version_id]
        key = f"versions/{check_version_id(version_id)}/manifest.json"
        try:
            data = self._read(key, MAX_MANIFEST_BYTES, proven=hashes_to(version_id))
        except FileNotFoundError:
            raise LineageError(f"{self.url}: version {version_id[:12]} has no manifest") from None
        if sha256_bytes(data) != version_id:
            raise LineageError(
                f"{self.url}/{key}: sha256 is {sha256_bytes(data)[:16]}…, not the version id: "
                "the manifest was edited or damaged",
                hint="restore it from a copy of the catalog",
            )
        try:
            m = Manifest.from_bytes(data, f"{self.url}/{key}")
        except FormatError as e:
            raise LineageError(
                str(e),
                hint="a version written by another dsbuild: read it with that one, or convert the captures again",
            ) from None
        self._manifests[version_id] = m
        return m

    def pinned_file(self, version_id: str, pin: FilePin, cap: int) -> bytes:
        """A file beside the manifest (index, sessions), proven against the manifest's pin."""
        key = f"versions/{version_id}/{pin.path}"
        try:  # never more than the pinned size (a forged 4 GiB object is refused before it is read)
            data = self._read_raw(key, min(cap, pin.bytes), proven=hashes_to(pin.sha256, pin.bytes))
        except FileNotFoundError:
            raise LineageError(f"{self.url}/{key}: missing") from None
        except FormatError:
            data = b""  # larger than pinned: damaged, said below
        if len(data) != pin.bytes or sha256_bytes(data) != pin.sha256:
            raise LineageError(
                f"{self.url}/{key}: does not match the sha256 pinned in the manifest (altered or damaged)",
                hint="restore it from a copy of the catalog",
            )
        return data

    def pinned_files(self, version_id: str) -> dict[str, bytes]:
        """Every file the manifest pins (name -> bytes), each proven: what a copy of the version needs."""
        m = self.manifest(version_id)
        return {
            m.index.path: self.index_data(version_id),
            m.sessions.path: self.pinned_file(version_id, m.sessions, MAX_SESSIONS_BYTES),
        }

    def index_data(self, version_id: str) -> bytes:
        """The index file's bytes, proven against the manifest's pin."""
        return self.pinned_file(version_id, self.manifest(version_id).index, MAX_INDEX_BYTES)

    def index(self, version_id: str, columns: list[str] | None = None):
        """The version's index as an Arrow table (all or some columns), proven against its pin."""
        return table_from_bytes(self.index_data(version_id), f"{self.url}/versions/{version_id}/{INDEX_FILE}", columns)

    def sessions(self, version_id: str) -> SessionTable:
        """The version's per-session records and their source files, proven against the manifest's pin
        (read only by what needs them: lineage, incremental builds, the sources view)."""
        return self._sessions_file(version_id, SessionTable)

    def session_columns(self, version_id: str) -> SessionColumnsTable:
        """``sessions`` as the loader reads them: each session's id and array columns (the same file,
        proven by the same pin; its other fields are not read into records)."""
        return self._sessions_file(version_id, SessionColumnsTable)

    def _sessions_file(self, version_id: str, kind: type[F]) -> F:
        if (version_id, kind) not in self._sessions:
            pin = self.manifest(version_id).sessions
            data = self.pinned_file(version_id, pin, MAX_SESSIONS_BYTES)
            try:
                table = kind.from_bytes(data, f"{self.url}/versions/{version_id}/{pin.path}")
            except FormatError as e:
                raise LineageError(str(e)) from None
            if len(table.sessions) != pin.rows:
                raise LineageError(
                    f"{self.url}/versions/{version_id}/{pin.path}: {len(table.sessions)} sessions, "
                    f"the manifest says {pin.rows}"
                )
            self._sessions[(version_id, kind)] = table
        return cast(F, self._sessions[(version_id, kind)])

    def shard_file(self, record: ShardRecord, *, proven: bool = False) -> Path:
        """A local file holding the shard (an object store's shards come through a cache, verified on
        arrival). ``proven``: an object store's cached copy is hashed against the record first, and one
        damaged on local disk since it arrived is fetched again (the store's bytes are what is judged)."""
        if not proven or self.root is not None:
            try:
                return self.store.shard_file(record.path, record.sha256, record.bytes)
            except UnsafeFile as e:  # a FIFO, device or folder in its place, or a symlink out of the catalog
                heal = f"run `dsbuild verify {self.url}` (it names the command that heals it)"
                raise LineageError(f"{self.url}/{record.path}: {str(e).split(': ', 1)[-1]}", hint=heal) from None
        path, fd = self.open_shard_copy(record)
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if record.proof().feed(f).ok():
                return path
        self.drop_shard_copy(record, lambda now: (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
        return self.store.shard_file(record.path, record.sha256, record.bytes)

    def open_shard_copy(self, record: ShardRecord) -> tuple[Path, int]:
        """An object store's cached copy of the shard, with a descriptor opened before any other process
        sharing the cache could evict it (``shard_file``'s path alone may be gone by the time it is
        opened)."""
        return self._object_store().open_shard_file(record.path, record.sha256, record.bytes)

    def drop_shard_copy(self, record: ShardRecord, same: Callable[[os.stat_result], bool]) -> bool:
        """An object store's local copy of the shard, found damaged, removed (if ``same`` recognises it) so
        that the next ``shard_file`` fetches it again; False for a local catalog, whose file is the data."""
        if self.root is not None:
            return False
        self._object_store().drop_shard_file(record.path, record.sha256, same)
        return True

    def _object_store(self) -> FsspecStore:
        """The object store of a remote catalog, whose shards come through a local cache."""
        if not isinstance(self.store, FsspecStore):
            raise LineageError(f"{self.url}: a local catalog's shard is its file; it has no cached copy")
        return self.store

    # -- names ----------------------------------------------------------------------------------
    def tags(self) -> dict[str, str]:
        try:
            return self._tags(self._read(TAGS, MAX_SMALL_FILE))
        except FileNotFoundError:
            return {}

    def _tags(self, data: bytes | None) -> dict[str, str]:
        if data is None:
            return {}
        try:
            doc = TagsFile.from_json(
                loads_bounded(data, max_bytes=MAX_SMALL_FILE, what=f"{self.url}/{TAGS}"), f"{self.url}/{TAGS}"
            )
        except FormatError as e:
            raise LineageError(str(e), hint=f"restore {TAGS} from a copy of the catalog") from None
        bad = [k for k, v in doc.tags.items() if not TAG_RE.fullmatch(k) or not VERSION_RE.fullmatch(v)]
        if bad:
            raise LineageError(f"{self.url}/{TAGS}: malformed tag {bad[0][:64]!r}")
        return doc.tags

    def set_tag(self, name: str, ref: str | None, *, force: bool = False, delete: bool = False) -> str | None:
        """Create, move (``force``) or delete a tag; returns the version it points at (None if deleted)."""
        if not TAG_RE.fullmatch(name) or VERSION_RE.fullmatch(name):
            raise UsageError(f"tag {name[:64]!r}: use a letter then letters, digits, '.', '_' or '-' (max 64)")
        with self.lock():
            for attempt in range(TAG_TRIES):
                data, token = self._read_for_update(TAGS)
                tags = self._tags(data)
                if delete and attempt and name not in tags:
                    return None  # deleted meanwhile (perhaps by our own write, whose answer was lost)
                target = self._change_tag(tags, name, ref, force, delete)
                if self._write_if(TAGS, pretty_json(TagsFile(dict(sorted(tags.items()))).to_json()), token):
                    return target
        raise StorageError(
            f"{self.url}/{TAGS}: changed by others {TAG_TRIES} times while this tag change was "
            "made; nothing was changed",
            hint="run the command again",
        )

    def _read_for_update(self, key: str) -> tuple[bytes | None, str | None]:
        try:
            return self.store.read_for_update(key, MAX_SMALL_FILE)
        except OSError as e:
            raise StorageError(f"{self.url}/{key}: cannot read ({e.strerror or e})") from None
        except FormatError as e:
            raise _damaged(self.url, key, e) from None

    def check_new_tag(self, name: str) -> None:
        """Refuse a tag this catalog would read as a version id (hex digits only: 7 or more, or a prefix of
        one of its versions): it would hide the version it names."""
        if re.fullmatch(r"[0-9a-fA-F]+", name) and (
            len(name) >= 7 or any(v.version_id.startswith(name.lower()) for v in self.versions())
        ):
            raise UsageError(
                f"tag {name!r} reads as a version id (hex digits only): it would hide the version it names",
                hint=f"add a letter outside a-f, e.g. v-{name}",
            )

    def _change_tag(self, tags: dict[str, str], name: str, ref: str | None, force: bool, delete: bool) -> str | None:
        """``tags`` with the change made (in place); the version the tag points at now."""
        if delete:
            if name not in tags:
                raise UsageError(f"{self.url}: no tag {name!r}" + _suggest(name, tags))
            del tags[name]
            return None
        target = self.resolve(ref)
        self.check_new_tag(name)
        if name in tags and tags[name] != target and not force:
            raise UsageError(f"tag {name!r} already points at {tags[name][:12]}", hint="use --force to move it")
        tags[name] = target
        return target

    def resolve(self, ref: str | None) -> str:
        """A tag, a version id, a unique prefix of one, or None for the newest. Tags win over prefixes."""
        versions = self.versions()
        if not versions:
            raise UsageError(f"{self.url}: catalog has no versions yet")
        if not ref:
            return versions[0].version_id
        tags = self.tags()
        if ref in tags:
            return tags[ref]
        matches = (
            [v.version_id for v in versions if v.version_id.startswith(ref.lower())]
            if re.fullmatch(r"[0-9a-fA-F]{1,64}", ref)
            else []
        )
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(
                f"{self.url}: no version or tag {ref[:80]!r}" + _suggest(ref, tags),
                hint="`dsbuild log` lists versions and tags",
            )
        raise UsageError(f"{self.url}: {ref!r} is ambiguous ({len(matches)} versions)", hint="give more characters")

    # -- writing --------------------------------------------------------------------------------
    def _write(self, key: str, data: bytes) -> None:
        self._write_if(key, data, None)

    def _write_if(self, key: str, data: bytes, token: str | None) -> bool:
        """``store.write_if``, its failures a StorageError (``token`` None: an unconditional write)."""
        try:
            return self.store.write_if(key, data, token)
        except OSError as e:
            raise StorageError(
                f"{self.url}/{key}: cannot write ({e.strerror or e})",
                hint="check free space and permissions, then run the command again",
            ) from None

    def builds_folder(self) -> Path:
        """Where this catalog's build areas live: inside a local catalog (same file system, so renames
        work), else in the local cache."""
        if self.root is not None:
            return real_folder(self.root / ".tmp")
        cache = cache_root()
        cache.mkdir(parents=True, exist_ok=True)
        return real_folder(cache / "builds")

    @contextmanager
    def _builds(self) -> Iterator[Path]:
        """The builds folder, locked: a cleaner never sees a build folder between its mkdir and its flock
        (also for object stores' catalogs, which share one builds folder and have no catalog lock)."""
        folder = self.builds_folder()
        with flocked(folder / "builds.lock", f"{self.url}: cannot lock its build folders"):
            yield folder

    @contextmanager
    def build_area(self) -> Iterator[BuildArea]:
        with self.lock(), self._builds() as folder:
            _clean(folder, dry_run=False)
            try:
                area = BuildArea(folder / uuid.uuid4().hex).__enter__()
            except OSError as e:
                raise StorageError(
                    f"{self.url}: cannot create a build folder ({e.strerror or e})",
                    hint="check free space and permissions of the catalog",
                ) from None
        try:
            yield area
        finally:
            area.__exit__(None, None, None)

    def live_builds(self) -> list[Path]:
        """The build folders of builds running now (on this machine)."""
        with self._builds() as folder:
            return [a for a in sorted(folder.iterdir()) if a.is_dir() and not a.is_symlink() and not _build_is_gone(a)]

    def held_by_builds(self) -> set[str]:
        """Keys live builds on this machine hold (a push into this catalog, mid-way): read after listing
        what may be removed, since a build names a key before it writes it."""
        return set().union(*map(_held, self.live_builds()))

    def clean_stale_builds(self, *, dry_run: bool = False) -> list[str]:
        """Remove build folders whose build is gone (their lock can be taken); return their names."""
        with self._builds() as folder:
            return _clean(folder, dry_run)

    def interrupted_writes(self, *, older_than: float, now: float, dry_run: bool = False) -> list[str]:
        """Temp files of record writes killed before their rename (local catalogs), older than
        ``older_than`` seconds at ``now`` so a write in progress is never touched; removed unless ``dry_run``."""
        if self.root is None:
            return []
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d != ".tmp"]  # build folders: clean_stale_builds
            for name in filenames:
                p = Path(dirpath) / name
                try:
                    stale = INTERRUPTED_WRITE.match(name) and now - p.lstat().st_mtime >= older_than
                except FileNotFoundError:
                    continue
                if stale:
                    out.append(p.relative_to(self.root).as_posix())
                    if not dry_run:
                        p.unlink(missing_ok=True)
        return sorted(out)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises commits, tag changes and gc of a local catalog (readers never need it: every
        write is a rename). Object stores have no locks: content addressing and manifest-last commits
        keep concurrent writers apart."""
        if self.root is None:
            yield
            return
        path = real_folder(self.root / ".tmp") / "commit.lock"
        with flocked(path, f"{self.root}: cannot lock the catalog", timeout=_lock_timeout):
            yield

    def commit(
        self,
        area: BuildArea,
        shards: list[tuple[Path, ShardRecord]],
        manifest: Manifest,
        pinned: dict[str, bytes],
        commit: CommitRecord,
        *,
        damaged: frozenset[str] = frozenset(),
    ) -> tuple[str, bool]:
        """Put shards in place, prove every shard the manifest names is there, then publish the version:
        the files it pins (``pinned``: name -> bytes), then the manifest. Returns (version id, existed):
        an identical version is not an error.

        A stored shard of the right size is kept (same name = same sha256 = same bytes), unless it is in
        ``damaged`` or the catalog is local (a rename costs nothing and replaces any silent damage with
        bytes this build just wrote and hashed)."""
        try:
            with self.lock():
                return self._commit(area, shards, manifest, pinned, commit, damaged)
        except OSError as e:
            raise StorageError(
                f"{self.url}: commit failed, nothing was committed ({e.strerror or e})",
                hint="fix the cause (free space, permissions) and run the same command again",
            ) from None

    def _commit(
        self,
        area: BuildArea,
        shards,
        manifest: Manifest,
        pinned: dict[str, bytes],
        commit: CommitRecord,
        damaged: frozenset[str],
    ) -> tuple[str, bool]:
        for tmp_path, rec in shards:
            if self.root is None and rec.path not in damaged and self.store.size(rec.path) == rec.bytes:
                tmp_path.unlink()  # same name = same sha256 = same bytes: no upload needed
                continue
            if self.root is not None:
                (self.root / rec.path).parent.mkdir(parents=True, exist_ok=True)
            self.store.put(tmp_path, rec.path)
        missing = [s.path for s in manifest.shards if self.store.size(s.path) != s.bytes]
        if missing:
            raise LineageError(
                f"{self.url}: refusing to commit a version whose shard {missing[0]} is missing "
                f"or has the wrong size ({len(missing)} shard(s))",
                hint="run the same convert again: it rewrites missing shards from the captures",
            )
        for pin in (manifest.index, manifest.sessions):
            if pin.path not in pinned or sha256_bytes(pinned[pin.path]) != pin.sha256:
                raise LineageError(
                    f"{self.url}: refusing to commit a version whose {pin.path} is not the file its "
                    "manifest pins (a bug: please report it)"
                )
        manifest_bytes = manifest.to_bytes()
        vid = sha256_bytes(manifest_bytes)
        if self.store.exists(f"versions/{vid}/manifest.json"):
            self.restore_pins(vid, manifest, pinned)
            return vid, True
        seq = 1 + max((v.commit.sequence for v in self.versions() if v.commit), default=0)
        record = replace(commit, sequence=seq)
        self.publish(
            vid, {**pinned, "commit.json": pretty_json(record.to_json()), "manifest.json": manifest_bytes}, area.path
        )
        return vid, False

    def restore_pins(self, vid: str, manifest: Manifest, pinned: dict[str, bytes]) -> None:
        """The version exists: write back any file its manifest pins that is missing or damaged (a build or
        a copy of that very version has them, byte for byte; every other file of it is left alone)."""
        for pin in (manifest.index, manifest.sessions):
            try:
                self.pinned_file(vid, pin, pin.bytes)
            except LineageError:  # missing, or not the bytes it pins
                self._write(f"versions/{vid}/{pin.path}", pinned[pin.path])

    def publish(self, vid: str, files: dict[str, bytes], scratch: Path) -> None:
        """Write version ``vid``'s files (name -> bytes, ``manifest.json`` last) with the lock held: on an
        object store one by one, the manifest landing last (until then the version is invisible); locally
        as one rename of a complete folder staged in ``scratch``. Then the dataset card names the newest
        version's samples for HF ``datasets`` (``dsbuild.lineage.card``)."""
        vkey = f"versions/{vid}"
        if self.root is None:
            for name, data in files.items():
                self.store.write(f"{vkey}/{name}", data)
            PUBLISHED.append(vid)
            self.write_card()
            return
        staging = scratch / "version"
        staging.mkdir()
        for name, data in files.items():
            write_durably(staging / name, data)
        fsync_dir(staging)
        (self.root / "versions").mkdir(exist_ok=True)
        target = self.root / vkey
        if target.is_dir() and not (target / "manifest.json").exists():
            os.rename(target, scratch / "invisible")  # a leftover without its manifest: replaced whole
        os.rename(staging, target)
        PUBLISHED.append(vid)
        fsync_dir(self.root / "versions")
        self.write_card()

    def write_card(self) -> None:
        """The dataset card for the newest version (``dsbuild.lineage.card``)."""
        from dsbuild.lineage.card import write_card  # (only publishing writes a card)

        newest = self.versions()[0].version_id
        write_card(self.store, self.root, self.url, newest, self.manifest(newest))


def _age(p: Path) -> float:
    """Seconds since ``p`` was last modified (0 if it is gone)."""
    try:
        return time.time() - p.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def _suggest(word: str, names) -> str:
    close = difflib.get_close_matches(word, list(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_version_id(version_id: str) -> str:
    if not isinstance(version_id, str) or not VERSION_RE.fullmatch(version_id):
        raise UsageError(f"{str(version_id)[:80]!r} is not a version id")
    return version_id


def _damaged(url: str, key: str, e: FormatError) -> LineageError:
    why = str(e).removeprefix(f"{url}/{key}: ").removeprefix(f"{key}: ")
    return LineageError(
        f"{url}/{key}: damaged catalog file ({why[:200]})",
        hint="restore it from a copy of the catalog (`dsbuild verify` names what else is damaged)",
    )


def parse_ref(ref: str) -> tuple[str, str | None]:
    """'PATH[@VERSION]' -> (path or URL, version or None). VERSION is an id, a unique id prefix or a tag."""
    path, at, version = str(ref).rpartition("@")
    if not at or "/" in version:
        return str(ref), None
    if not version:
        raise UsageError(f"{ref!r}: nothing after '@'", hint="use PATH@VERSION (an id, a prefix or a tag)")
    return path, version


def _refuse_a_ref(location: str) -> None:
    """``catalog@gold`` where a command takes a whole catalog (log, gc, convert's output): refused, not
    read as (or made into) a folder of that name, when the part before ``@`` is a catalog."""
    head, at, tail = location.rpartition("@")
    catalog = False
    if at and head:
        with suppress(OSError, FormatError, StorageError, UsageError):  # not a catalog: what it is stays to say
            catalog = open_store(head).exists(MARKER)
    if catalog:
        raise UsageError(
            f"{location}: names a version ({tail!r}) of a catalog where a catalog is expected "
            "(a command that takes a catalog, or a second '@' in CATALOG@VERSION)",
            hint=f"give the catalog: {head}, or one version of it: {head}@VERSION",
        )


def open_catalog(location: str | Path, *, create: bool = False) -> Catalog:
    """A catalog at a local path, ``file://`` URL or any fsspec URL (``s3://bucket/cat``)."""
    return Catalog.open(location, create=create)


@contextmanager
def catalog_to_fill(location: str | Path) -> Iterator[Catalog]:
    """The catalog at ``location``, created if needed, for a command that fills it (convert, push, pull). If
    the command fails, a location that held nothing is left holding nothing: a folder it made is removed
    (with the parents it made), an empty one emptied, an object store prefix cleared; a failed copy is not
    a new catalog. Ctrl-C keeps what was sent, so running the command again resumes; Ctrl-C before anything
    was sent leaves nothing, as a failure does (a first convert stopped in its first second left a marker
    and two lock files, a catalog of nothing)."""
    store = open_store(location)
    made = _outermost_missing(store.local_root) if store.local_root is not None else None
    fresh = made is not None or _holds_nothing(store)
    try:
        yield Catalog.open(location, create=True)
    except BaseException as e:
        with suppress(StorageError, OSError):  # the failure is what must be reported, not the cleanup's
            if fresh and (isinstance(e, Exception) or _nothing_sent(store)):
                _clear_unless_used(store, made)
        raise


def _clear_unless_used(store: Store, made: Path | None) -> None:
    """``_clear``, unless another command uses the location now: a version committed there meanwhile, or
    (a local catalog, under its lock, so no commit lands between the look and the removal) a build
    running there."""
    catalog = Catalog(store)
    local = store.local_root is not None and (store.local_root / MARKER).is_file()
    with catalog.lock() if local else nullcontext():
        if any(k.endswith("/manifest.json") for k in store.list("versions")):
            return
        if local and catalog.live_builds():
            return
        _clear(store, made)


def _nothing_sent(store: Store) -> bool:
    """The location holds only what opening a catalog writes: its marker and, locally, the lock files."""
    if store.local_root is None:
        return set(store.list("")) <= {MARKER}
    for folder, _, files in os.walk(store.local_root):
        for name in files:
            key = (Path(folder) / name).relative_to(store.local_root).as_posix()
            if key != MARKER and not (key.startswith(".tmp/") and key.endswith(".lock") and "/" not in key[5:]):
                return False
    return True


def _outermost_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist (what creating ``path`` makes)."""
    if path.exists() or path.is_symlink():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _holds_nothing(store: Store) -> bool:
    """An existing folder with no entries, or an object store prefix with no keys (a catalog's marker
    answers first: its keys are not listed)."""
    if store.local_root is not None:
        return store.local_root.is_dir() and not any(store.local_root.iterdir())
    return not store.exists(MARKER) and not store.list("")


def _clear(store: Store, made: Path | None) -> None:
    """Remove what a failed command put into a location that held nothing (``made``: the folder it made)."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    elif store.local_root is not None:
        for p in store.local_root.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    else:
        for key in store.list(""):
            store.delete(key)


def open_ref(ref: str) -> tuple[Catalog, str]:
    """'PATH[@VERSION]' -> (catalog, full version id). PATH may be an fsspec URL."""
    path, version = parse_ref(ref)
    catalog = open_catalog(path)
    return catalog, catalog.resolve(version)

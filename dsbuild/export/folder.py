"""The export folder: refused unless absent, empty or the same export; built beside it and renamed into
place whole, so an interrupted export leaves nothing a tool could load as a smaller dataset (``datasets``
and duckdb glob whatever Parquet files are there), and finishes when run again.

An export is written into ``.<DEST>.dsbuild-partial``, DEST's sibling: the same filesystem, so the last
step is one rename, and the same depth, so relative links to the catalog stay valid. Its marker
``.dsbuild-export.json`` is written first with ``complete: false`` (it claims that folder) and rewritten
with ``complete: true`` and every file's size after every other file, just before the rename. A
complete export whose files are no longer all there at those sizes is reopened: the damaged files are
removed and written again. Every file lands by rename from a
private temp folder, so a file that exists is whole: a re-run skips files it would write with the same
name (exports are deterministic, so the bytes would be the same). The marker holds no time and no host path.
One export at a time writes into a folder: a second, run meanwhile, finds the partial folder's lock held
and is refused (run again later, it finds the export complete).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsbuild.core.errors import FormatError, StorageError, UsageError
from dsbuild.core.files import fsync_dir, replace_atomically, write_durably
from dsbuild.core.jsonio import loads_bounded, pretty_json
from dsbuild.core.records import SHA256, Record, spec

MARKER = ".dsbuild-export.json"
TMP = ".dsbuild-export.tmp"
LOCK = ".dsbuild-export.lock"  # in the partial folder, held (flock) while an export writes there
PARTIAL = ".{}.dsbuild-partial"  # beside DEST, until the export is complete


@dataclass(frozen=True, slots=True)
class ExportMarker(Record):
    """What an export folder holds: which version, for which tool, with which split set."""

    FORMAT = "dsbuild.export/1"
    tool: str
    version_id: str = field(metadata=spec(pattern=SHA256))
    split: str | None  # NAME or NAME/SPLIT as asked
    split_hash: str | None = field(metadata=spec(pattern=SHA256))
    splits: dict[str, int]  # tool split -> samples
    complete: bool
    files: dict[str, int] | None = None  # complete: each file's size (a link's: its target's); None before 2026-12
    target_bytes: int | None = None  # the size of the files written; None before 2026-12 (any is accepted)

    def describe(self) -> str:
        split = (
            f" split {self.split} (set {self.split_hash[:12]})"
            if self.split and self.split_hash
            else f" split {self.split}"
            if self.split
            else ""
        )
        size = f" in files of {self.target_bytes:,} bytes" if self.target_bytes else ""
        return f"a {self.tool} export of version {self.version_id[:12]}{split}{size}"


def _sizes(root: Path) -> dict[str, int]:
    """Every file of a finished export (but its marker) and its size; a link's is its target's."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel not in (MARKER, LOCK) and (path.is_symlink() or path.is_file()):
            out[rel] = path.stat().st_size if path.exists() else -1  # a dangling link: damaged from the start
    return out


def _damaged(root: Path, files: dict[str, int], editable: Collection[str] = ()) -> list[str]:
    """The recorded files of ``root`` that are gone, or not the size they were written with (a link whose
    target is gone or changed counts; an ``editable`` file that is there is the user's, whatever its size)."""
    out = []
    for rel, size in files.items():
        try:
            if (root / rel).stat().st_size != size and not (rel in editable and (root / rel).is_file()):
                out.append(rel)
        except OSError:
            out.append(rel)
    return out


# mountinfo writes a path's bytes as they are, but space, tab, newline and backslash as octal escapes
# (decoding the line as text escapes garbled every non-ASCII path)
_MOUNTINFO_ESCAPE = re.compile(rb"\\([0-7]{3})")


def _mount_point(folder: Path) -> bool:
    """Whether ``folder`` is mounted on: another device than its parent, or (a bind mount of a folder of
    the same file system) listed as a mount point in /proc/self/mountinfo."""
    if os.stat(folder).st_dev != os.stat(folder.parent).st_dev:
        return True
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            points = {
                _MOUNTINFO_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), line.split()[4])
                for line in f
                if len(line.split()) > 4
            }
    except OSError:
        return False
    return os.fsencode(folder) in points


def _holds_cwd(folder: Path) -> bool:
    try:
        cwd = Path(os.path.realpath(os.getcwd()))
    except OSError:  # the current folder was removed
        return False
    return cwd == folder or folder in cwd.parents


def read_marker(dest: Path) -> ExportMarker | None:
    path = dest / MARKER
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
        return ExportMarker.from_json(loads_bounded(data, max_bytes=1 << 20, what=str(path)), str(path))
    except (OSError, FormatError):
        return None


class ExportFolder:
    """Claims ``dest`` for ``marker`` (refusing anything else there) and writes files beside it, in ``work``."""

    def __init__(self, dest: Path, marker: ExportMarker, editable: dict[str, bytes] | None = None):
        # the folder itself (a link to an empty folder is followed: the rename must land on a folder), and
        # a name to derive the sibling's from, even for "."
        self.dest = Path(os.path.realpath(dest))
        if not self.dest.name:
            raise UsageError(f"{dest}: a file system's root cannot be an export folder; choose an empty folder")
        self.work = self.dest.with_name(PARTIAL.format(self.dest.name))
        self.marker = replace(marker, complete=False)
        self.written = 0  # files written by this run
        self.bytes = 0
        self.kept = 0  # files an earlier run had already written
        self.linked = 0  # catalog shards shared by a symlink
        self.repaired = 0  # files of a complete export found missing or changed, written again
        self._lock: int | None = None  # the partial folder's lock, while this run writes there
        # files the user may edit once written (a tool's config) -> what dsbuild writes: an edited one is
        # left as it is, never rewritten or counted as damage (a removed one is written again)
        self.editable = editable or {}

    def claim(self) -> bool:
        """Take the folder; True when it already holds this export complete (nothing to do)."""
        d, w = self.dest, self.work
        if d.exists() and not d.is_dir():
            raise UsageError(f"{d}: is a file; export into a folder")
        above = next(p for p in d.parents if p.exists())
        if not above.is_dir():
            raise UsageError(f"{above}: is a file, not a folder; export into a folder")
        found = self._mine(d, read_marker(d) if d.is_dir() else None)
        if found is None and d.is_dir() and any(d.iterdir()):
            raise UsageError(f"{d}: folder is not empty and is not an earlier export; choose an empty folder")
        damaged = _damaged(d, found.files or {}, self.editable) if found is not None and found.complete else []
        if found is not None and found.complete and not damaged:
            (d / LOCK).unlink(missing_ok=True)  # (one an interrupt left between the rename and its removal)
            return True
        if d.is_dir() and _mount_point(d):
            raise UsageError(
                f"{d}: is a mount point; an export is built beside its folder and moved in with one "
                "rename, which cannot replace a mount point",
                hint=f"export into a new folder inside it, e.g. {d / 'export'}",
            )
        if d.is_dir() and _holds_cwd(d):
            raise UsageError(
                f"{d}: is the current folder; the finished export replaces it (a shell there would see it empty)",
                hint="export into a new folder, e.g. ./export",
            )
        if damaged:
            self._reopen(d, damaged)
        staged = self._mine(w, read_marker(w))
        try:
            if found is not None and staged is None:  # interrupted in place by an earlier dsbuild: finish it beside
                os.rename(d, w)
            w.mkdir(parents=True, exist_ok=True)
            self._take(w / LOCK)
            shutil.rmtree(w / TMP, ignore_errors=True)  # an interrupted run's half-written files
            (w / TMP).mkdir()
        except OSError as e:
            raise StorageError(f"{w}: cannot create the export folder ({e.strerror or e})") from None
        if staged is None and found is None:
            replace_atomically(w / MARKER, pretty_json(self.marker.to_json()))
        return False

    def _take(self, lock: Path) -> None:
        """Hold ``lock`` for this run (released when the process ends, however it ends)."""
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(
                f"{self.dest}: another export into it is running",
                hint="wait for it to finish; the same command then finds the export complete",
            ) from None
        self._lock = fd

    def _reopen(self, d: Path, damaged: list[str]) -> None:
        """A complete export some of whose files are missing or changed: back to unfinished, without them
        (the run writes them again; exports are deterministic, so the rest stays as it is)."""
        try:
            for rel in damaged:
                if os.path.lexists(d / rel):
                    os.remove(d / rel)
            replace_atomically(d / MARKER, pretty_json(self.marker.to_json()))  # complete: false
        except OSError as e:
            raise StorageError(f"{d}: cannot repair the export ({e.strerror or e})") from None
        self.repaired = len(damaged)

    def _mine(self, where: Path, marker: ExportMarker | None) -> ExportMarker | None:
        """``marker`` if any, refusing the folder when it is another export's."""
        # (a marker written before it recorded file sizes and target accepts any)
        if (
            marker is not None
            and replace(
                marker, complete=False, files=None, target_bytes=marker.target_bytes or self.marker.target_bytes
            )
            != self.marker
        ):
            raise UsageError(
                f"{where}: holds {marker.describe()}, not {self.marker.describe()}; choose an empty folder"
            )
        return marker

    def path(self, rel: str) -> Path:
        return self.work / rel

    def has(self, rel: str) -> bool:
        """The file (or link) is in place from an earlier run: it is whole (files land by rename)."""
        if os.path.lexists(self.work / rel):
            self.kept += 1
            return True
        return False

    def temp(self, name: str) -> Path:
        """A private scratch path (removed when the export finishes)."""
        return self.work / TMP / name

    def put(self, rel: str, data: bytes) -> None:
        if rel in self.editable and self.has(rel):
            return
        tmp = self.temp(rel.replace("/", "__"))
        self._land(rel, lambda: write_durably(tmp, data), tmp)
        self.bytes += len(data)

    def adopt(self, rel: str, tmp: Path) -> None:
        """Move a finished scratch file into place."""
        size = tmp.stat().st_size
        self._land(rel, lambda: None, tmp)
        self.bytes += size

    def link(self, rel: str, target: Path) -> None:
        """A relative symlink ``rel`` -> ``target`` (the catalog's shard: bytes shared, not copied)."""
        where = self.work / rel
        tmp = self.temp(rel.replace("/", "__"))
        self._land(rel, lambda: os.symlink(os.path.relpath(Path(target).resolve(), where.parent.resolve()), tmp), tmp)
        self.linked += 1

    def _land(self, rel: str, make, tmp: Path) -> None:
        where = self.work / rel
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            make()
            os.replace(tmp, where)
        except OSError as e:
            raise StorageError(
                f"{where}: cannot write ({e.strerror or e})",
                hint="check free space and permissions, then run the export again",
            ) from None
        self.written += 1

    def finish(self) -> None:
        """Write the marker last (``complete: true``), drop the scratch folder and move the export into place
        with one rename: DEST holds all of it or nothing."""
        w = self.work
        shutil.rmtree(w / TMP, ignore_errors=True)
        for folder in sorted({p.parent for p in w.rglob("*")} | {w}):
            fsync_dir(folder)
        self.marker = replace(self.marker, complete=True, files=_sizes(w))
        replace_atomically(w / MARKER, pretty_json(self.marker.to_json()))
        try:
            os.rename(w, self.dest)  # replaces DEST only if it is an empty folder
        except OSError as e:
            busy = e.errno == errno.EBUSY  # (a mount point, or a folder another process holds as its root)
            raise StorageError(
                f"{self.dest}: cannot move the finished export there from {w} ({e.strerror or e})",
                hint=f"export into a folder inside it, e.g. {self.dest / 'export'}"
                if busy
                else "empty or remove the folder, then run the export again",
            ) from None
        fsync_dir(self.dest.parent)
        # (still held: a run that opened it meanwhile finds the export complete, and may remove it first)
        (self.dest / LOCK).unlink(missing_ok=True)

    def edited(self) -> list[str]:
        """The editable files of the finished export that differ from what dsbuild writes (kept as they are)."""
        out = []
        for rel, data in self.editable.items():
            path = self.dest / rel
            try:
                if not path.is_file():  # (not a FIFO a read would wait on)
                    out.append(rel)
                    continue
                with open(path, "rb") as f:
                    if f.read(len(data) + 1) != data:
                        out.append(rel)
            except OSError:
                out.append(rel)
        return out

    def release(self) -> None:
        """Let go of the partial folder's lock (the export finished, or failed and may be run again)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

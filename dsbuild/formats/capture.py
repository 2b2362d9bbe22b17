"""The raw capture contract (DESIGN.md section 2): discover sessions and read `session.json` safely.

Everything here treats the capture as untrusted: sizes are bounded, every field is type-checked, and no
path may leave the session folder (``..``, absolute paths and symlinks pointing outside are refused).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dsbuild.core.errors import CaptureError, FormatError
from dsbuild.core.files import inside, read_capped_stat
from dsbuild.core.jsonio import clip_text, loads_bounded, printable, repeated_key

CAPTURE_FORMAT = "capture/1"
SESSION_FILE = "session.json"
SESSION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
STREAM_KINDS = ("actions", "telemetry", "text")
# A session.json is a few hundred bytes; 1 MiB leaves room for rich conditions and stops hostile files.
MAX_SESSION_JSON_BYTES = 1 << 20
MAX_CONDITIONS = 1024
MAX_FIELD_CHARS = 1024
REQUIRED = ("format", "session_id", "title", "player", "video")
OPTIONAL_STRINGS = ("platform", "build", "started_at")


@dataclass(frozen=True)
class Session:
    """One validated capture session. ``rel`` is its folder relative to the capture root (POSIX)."""

    session_id: str
    title: str
    player: str
    video: str
    rel: str
    directory: Path
    platform: str | None = None
    build: str | None = None
    started_at: str | None = None
    conditions: dict[str, str] = field(default_factory=dict)
    streams: dict[str, str] = field(default_factory=dict)
    read_as: tuple[int, int, int] | None = None  # session.json's (size, mtime ns, inode) when it was parsed

    def fields(self) -> dict:
        """The session fields carried into every sample's metadata (no host paths)."""
        return {
            "session_id": self.session_id,
            "title": self.title,
            "player": self.player,
            "platform": self.platform,
            "build": self.build,
            "started_at": self.started_at,
            "conditions": dict(sorted(self.conditions.items())),
        }

    def path_of(self, name: str) -> Path:
        return self.directory / name

    def rel_of(self, name: str) -> str:
        """Path of a session file relative to the capture root, as recorded in manifests."""
        return f"{self.rel}/{name}" if self.rel != "." else name


def discover_sessions(root: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """(every folder under ``root``, itself included, holding a session.json, sorted by relative path;
    (folder, reason) for every folder that could not be listed or was not followed).

    Symlinked folders are not followed (a capture root must not reach outside itself); one that leads
    outside to sessions is reported, as is a folder that cannot be read: sessions are never skipped
    silently.
    """
    found = []
    unreadable: list[tuple[str, str]] = []

    def failed(e: OSError) -> None:
        rel = printable(Path(e.filename).relative_to(root).as_posix()) if e.filename else "."
        unreadable.append((rel, f"folder cannot be read ({e.strerror or e})"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=False):
        dirnames.sort()
        for name in dirnames:
            link = Path(dirpath, name)
            if link.is_symlink() and _sessions_outside(link, root):
                unreadable.append(
                    (
                        printable(link.relative_to(root).as_posix()),
                        "a symbolic link to a folder outside the capture folder that holds sessions: not "
                        "followed (copy or move them into the capture folder)",
                    )
                )
        if SESSION_FILE in filenames:
            found.append(Path(dirpath))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix()), sorted(unreadable)


LINK_LOOK = 10_000  # folders looked at below a symlinked folder, to tell whether it holds sessions


def _sessions_outside(link: Path, root: Path) -> bool:
    """Whether a symlinked folder leads outside the capture root to sessions (which a build would then
    miss): one into the root is walked there anyway, one to a folder without a session.json is nothing
    to report. A tree too large to look through is reported."""
    target = Path(os.path.realpath(link))
    if inside(target, root):
        return False
    for seen, (_, _, filenames) in enumerate(os.walk(target, followlinks=False)):
        if SESSION_FILE in filenames or seen >= LINK_LOOK:
            return True
    return False


def _string(doc: dict, key: str, path: str, *, required: bool) -> str | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise CaptureError(path, f"missing required field '{key}'")
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS:
        shown = f" (found {clip_text(value, 40)!r})" if isinstance(value, str) and value else ""
        raise CaptureError(path, f"field '{key}' must be a non-empty string of at most {MAX_FIELD_CHARS} chars" + shown)
    return value


def safe_member(directory: Path, name: object, path: str, what: str) -> str:
    """Validate a file name from session.json: relative, no '..', resolving inside ``directory``."""
    if not isinstance(name, str) or not name or len(name) > MAX_FIELD_CHARS:
        raise CaptureError(path, f"{what} must be a non-empty relative path")
    if "\n" in name or "\r" in name or "\x00" in name:
        raise CaptureError(path, f"{what} path contains a control character")
    pure = Path(name)
    if pure.is_absolute() or name.startswith(("/", "\\")):
        raise CaptureError(
            path, f"{what} path {clip_text(name, 80)!r} is absolute; it must be inside the session folder"
        )
    if ".." in pure.parts:
        raise CaptureError(path, f"{what} path {clip_text(name, 80)!r} escapes the session folder")
    if not inside(directory / pure, directory):
        raise CaptureError(path, f"{what} path {clip_text(name, 80)!r} resolves outside the session folder (symlink?)")
    return pure.as_posix()


def parse_started_at(text: str | None) -> datetime | None:
    """An ISO 8601 time as UTC (naive times are taken as UTC); None when absent or unparseable (which
    ``read_session`` refuses, so a session's recorded time always parses)."""
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC)


def _object_field(doc: dict, key: str, where: str, what: str) -> dict:
    """An optional object field: absent or null is empty; any other non-object (false, 0, "") is refused."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CaptureError(where, f"{key} must be {what}, not {type(value).__name__}")
    return value


def read_session(directory: Path, root: Path) -> Session:
    """Parse and validate ``directory/session.json``; raise CaptureError with the precise reason."""
    rel = directory.relative_to(root).as_posix()
    sj = directory / SESSION_FILE
    where = f"{rel}/{SESSION_FILE}" if rel != "." else SESSION_FILE
    if any(ord(c) < 32 or c == "\x7f" for c in rel):
        raise CaptureError(rel, "folder name contains a control character (newline?); rename it")
    if printable(rel) != rel:
        raise CaptureError(printable(rel), "folder name is not valid UTF-8 (shown with \\x escapes); rename it")
    try:
        data, st = read_capped_stat(sj, MAX_SESSION_JSON_BYTES, root=directory, what=where)
        doc = loads_bounded(data, max_bytes=MAX_SESSION_JSON_BYTES, what=where)
    except OSError as e:
        raise CaptureError(where, f"cannot read: {e.strerror or e}") from None
    except FormatError as e:
        raise CaptureError(where, str(e).removeprefix(f"{where}: ").removeprefix(f"{sj}: ")) from None
    if not isinstance(doc, dict):
        raise CaptureError(where, "must be a JSON object")
    twice = repeated_key(data)  # a parser keeps the last value: which session_id was meant is unknown
    if twice is not None:
        raise CaptureError(where, f"key {clip_text(twice, 64)!r} appears more than once in an object")
    for key in REQUIRED:
        if key not in doc:
            raise CaptureError(where, f"missing required field '{key}'")
    if doc["format"] != CAPTURE_FORMAT:
        raise CaptureError(where, f"format is {clip_text(str(doc['format']), 80)!r}, expected {CAPTURE_FORMAT!r}")
    sid = doc["session_id"]
    if not isinstance(sid, str) or not SESSION_ID_RE.fullmatch(sid):
        raise CaptureError(where, f"session_id {clip_text(str(sid), 80)!r} must match [A-Za-z0-9_-]{{1,64}}")
    conditions = _object_field(doc, "conditions", where, "an object of strings")
    if len(conditions) > MAX_CONDITIONS:
        raise CaptureError(where, f"{len(conditions)} conditions exceeds the limit of {MAX_CONDITIONS}")
    for k, v in conditions.items():
        if not isinstance(v, str) or len(k) > MAX_FIELD_CHARS or len(v) > MAX_FIELD_CHARS:
            raise CaptureError(where, f"condition {k[:64]!r} must map to a string")
    streams = _object_field(doc, "streams", where, "an object")
    started_at = _string(doc, "started_at", where, required=False)
    if started_at is not None and parse_started_at(started_at) is None:
        raise CaptureError(
            where, f"started_at {clip_text(started_at, 64)!r} is not an ISO 8601 time (e.g. 2026-11-01T10:00:00Z)"
        )
    checked_streams = {}
    for kind, name in streams.items():
        if kind not in STREAM_KINDS:
            raise CaptureError(where, f"unknown stream {kind[:64]!r}; expected one of {', '.join(STREAM_KINDS)}")
        checked_streams[kind] = safe_member(directory, name, where, f"stream '{kind}'")
    return Session(
        session_id=sid,
        title=_string(doc, "title", where, required=True),
        player=_string(doc, "player", where, required=True),
        video=safe_member(directory, doc["video"], where, "video"),
        rel=rel,
        directory=directory,
        platform=_string(doc, "platform", where, required=False),
        build=_string(doc, "build", where, required=False),
        started_at=started_at,
        conditions=dict(sorted(conditions.items())),
        streams=checked_streams,
        read_as=(st.st_size, st.st_mtime_ns, st.st_ino),
    )

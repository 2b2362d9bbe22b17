"""The raw capture contract (docs/capture-format.md): discover sessions and read `session.json` safely.

Everything here treats the capture as untrusted: sizes are bounded, every field is type-checked, and no
path may leave the session folder (``..``, absolute paths and symlinks pointing outside are refused).

The fields of ``session.json`` are checked against the JSON Schema the package ships
(``formats/schemas/session.schema.json``, printed by ``dsbuild schema capture session``), by a small
validator of the keywords that schema uses: the published schema *is* the checker, so they cannot drift.
Every problem of a file is reported at once, not one per run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dsbuild.core.errors import CaptureError, FormatError
from dsbuild.core.files import inside, read_capped_stat
from dsbuild.core.jsonio import clip_text, loads_bounded, printable, repeated_key

CAPTURE_FORMAT = "capture/1"
SESSION_FILE = "session.json"
STREAM_KINDS = ("actions", "telemetry", "text")
SCHEMAS = ("session", *STREAM_KINDS)  # the JSON Schemas of a capture's files (``capture_schema``)
DOCS = "docs/capture-format.md"  # where users read the contract; every message about it points there
# A session.json is a few hundred bytes; 1 MiB leaves room for rich conditions and stops hostile files.
MAX_SESSION_JSON_BYTES = 1 << 20


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
    controls: dict[str, dict] = field(default_factory=dict)  # declared controls: name -> {kind, unit, range}
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

    @property
    def continuous(self) -> frozenset[str]:
        """The controls declared continuous: their action values are any finite float32, not [-1, 1]."""
        return frozenset(name for name, spec in self.controls.items() if spec.get("kind") == "continuous")

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


@functools.cache
def capture_schema(name: str) -> dict:
    """The JSON Schema of one capture file (``SCHEMAS``: session, actions, telemetry, text), as shipped
    in the package. Callers must not mutate it (it is cached)."""
    from importlib.resources import files

    if name not in SCHEMAS:
        raise ValueError(f"no capture schema {name!r}; expected one of {', '.join(SCHEMAS)}")
    return json.loads(files("dsbuild.formats").joinpath("schemas", f"{name}.schema.json").read_text("utf-8"))


_JSON_TYPES = {"string": (str,), "object": (dict,), "number": (int, float), "array": (list,), "null": (type(None),)}


def _is(value: object, type_name: str) -> bool:
    return not isinstance(value, bool) and isinstance(value, _JSON_TYPES[type_name])


def _found(value: object) -> str:
    if isinstance(value, str):
        return repr(clip_text(value, 40))
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)


def _expected(node: dict) -> str:
    """What a schema node asks for, in words (the keywords ``_problems`` implements)."""
    if "const" in node:
        return repr(node["const"])
    types = [t for t in ([node["type"]] if isinstance(node.get("type"), str) else node.get("type", [])) if t != "null"]
    if types == ["object"]:
        items = node.get("additionalProperties")
        text = "an object" + (f" of {items['type']}s" if isinstance(items, dict) and "type" in items else "")
        return text + (f" of at most {node['maxProperties']} entries" if "maxProperties" in node else "")
    if types == ["array"]:
        n, items = node.get("maxItems"), node.get("items", {})
        count = f"{n} " if n is not None and n == node.get("minItems") else ""
        return f"a list of {count}" + ("numbers" if items.get("type") == "number" else "values")
    if types == ["number"]:
        return "a finite number" + (" within float32" if "maximum" in node else "")
    if node.get("format") == "date-time":
        return "an ISO 8601 time (e.g. 2026-11-01T10:00:00Z)"
    if "pattern" in node:
        return f"a string matching {node['pattern'].strip('^$')}"
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    what = "a non-empty string" if node.get("minLength", 0) >= 1 else "a string"
    return what + (f" of at most {node['maxLength']} characters" if "maxLength" in node else "")


def _problems(value: object, node: dict, name: str) -> Iterator[tuple[str, str]]:
    """(field, what is wrong) for every way ``value`` breaks the schema ``node`` (``name``: its field,
    "" for the whole file; a missing field is ``(name, "missing")``).

    The keywords the capture schemas use, and only those: type, const, enum, pattern, minLength,
    maxLength, format (date-time), required, properties, additionalProperties, propertyNames,
    maxProperties, items, minItems, maxItems, minimum, maximum. A field that is null counts as absent."""
    types = [node["type"]] if isinstance(node.get("type"), str) else node.get("type")
    if types is not None and not any(_is(value, t) for t in types):
        yield name, _wrong(node, value)
        return
    if ("const" in node and value != node["const"]) or ("enum" in node and value not in node["enum"]):
        yield name, _wrong(node, value)
    if isinstance(value, str) and (
        not node.get("minLength", 0) <= len(value) <= node.get("maxLength", len(value))
        or ("pattern" in node and not re.search(node["pattern"], value))
        or (node.get("format") == "date-time" and parse_started_at(value) is None)
    ):
        yield name, _wrong(node, value)
    if _is(value, "number") and not node.get("minimum", -math.inf) <= value <= node.get("maximum", math.inf):
        yield name, _wrong(node, value)
    if isinstance(value, list):
        if not node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)):
            yield name, _wrong(node, value)
            return
        for i, item in enumerate(value):
            if "items" in node:
                yield from _problems(item, node["items"], f"{name}.{i}")
    if isinstance(value, dict):
        if len(value) > node.get("maxProperties", len(value)):
            yield name, f"{len(value)} entries, expected at most {node['maxProperties']}"
            return
        known, keys = node.get("properties", {}), node.get("propertyNames")
        for key in node.get("required", ()):
            if value.get(key) is None:
                yield (f"{name}.{key}" if name else key), "missing"
        for key, item in value.items():
            inner = f"{name}.{key}" if name else key
            if keys is not None and next(_problems(key, keys, inner), None) is not None:
                yield name, f"key {clip_text(key, 64)!r} is not allowed; expected {_expected(keys)}"
            elif item is None and (key in known or not isinstance(node.get("additionalProperties"), dict)):
                continue  # null is absent (a required one was said to be missing)
            elif key in known or isinstance(node.get("additionalProperties"), dict):
                yield from _problems(item, known.get(key) or node["additionalProperties"], inner)


def _wrong(node: dict, value: object) -> str:
    return f"expected {_expected(node)}, found {_found(value)}"


def _message(field: str, problem: str) -> str:
    return f"missing required field '{field}'" if problem == "missing" else f"field '{field}': {problem}"


def _member_problem(directory: Path, name: str, what: str) -> str | None:
    """Why a file name from session.json cannot be used (it must be relative, without '..', and resolve
    inside ``directory``), or None."""
    if "\n" in name or "\r" in name or "\x00" in name:
        return f"{what}: the path contains a control character"
    pure = Path(name)
    if pure.is_absolute() or name.startswith(("/", "\\")):
        return f"{what}: the path {clip_text(name, 80)!r} is absolute; it must be inside the session folder"
    if ".." in pure.parts:
        return f"{what}: the path {clip_text(name, 80)!r} escapes the session folder"
    if not inside(directory / pure, directory):
        return f"{what}: the path {clip_text(name, 80)!r} resolves outside the session folder (symlink?)"
    return None


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


def session_problems(doc: object, directory: Path) -> list[str]:
    """Every way a parsed session.json breaks the contract, one line each: the schema's findings, then
    the paths it names that lead out of the session folder. Empty when the session is usable."""
    found = list(_problems(doc, capture_schema("session"), ""))
    problems = [_message(f, p) if f else f"{p} (the file must hold one JSON object)" for f, p in found]
    if not isinstance(doc, dict):
        return problems
    named = [("video", doc.get("video"))]
    if isinstance(doc.get("streams"), dict):
        named += [(f"streams.{k}", v) for k, v in doc["streams"].items()]
    bad = {f for f, _ in found}
    if isinstance(doc.get("controls"), dict) and not any(f.startswith("controls") for f in bad):
        for control, spec in doc["controls"].items():
            low_high = spec.get("range")
            if low_high is not None and low_high[0] > low_high[1]:
                problems.append(
                    f"field 'controls.{clip_text(control, 64)}.range': {low_high[0]:g} is above {low_high[1]:g}"
                )
    for key, name in named:
        if isinstance(name, str) and key not in bad and "streams" not in bad:
            problem = _member_problem(directory, name, f"field '{key}'")
            if problem is not None:
                problems.append(problem)
    return problems


def read_session(directory: Path, root: Path) -> Session:
    """Parse and validate ``directory/session.json``; raise CaptureError naming every problem it has."""
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
    twice = repeated_key(data) if isinstance(doc, dict) else None  # a parser keeps the last value
    problems = session_problems(doc, directory)
    if twice is not None:  # (which session_id was meant is unknown)
        problems.insert(0, f"key {clip_text(twice, 64)!r} appears more than once in an object")
    if problems or not isinstance(doc, dict):  # (session_problems names a non-object)
        many = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise CaptureError(where, many + "; ".join(problems) + f" (see {DOCS})")
    return Session(
        session_id=doc["session_id"],
        title=doc["title"],
        player=doc["player"],
        video=Path(doc["video"]).as_posix(),
        rel=rel,
        directory=directory,
        platform=doc.get("platform"),
        build=doc.get("build"),
        started_at=doc.get("started_at"),
        conditions=dict(sorted((doc.get("conditions") or {}).items())),
        streams={k: Path(v).as_posix() for k, v in (doc.get("streams") or {}).items()},
        controls={k: dict(v) for k, v in sorted((doc.get("controls") or {}).items())},
        read_as=(st.st_size, st.st_mtime_ns, st.st_ino),
    )

"""JSON for untrusted input (bounded size and depth) and canonical JSON for everything we hash.

Parsing uses orjson (native code, ~4-9x the standard library on our event lines; its own recursion
limit keeps a hostile document from exhausting the C stack). Our tighter depth limit is checked on
the parsed value, which costs nothing for the flat objects captures are made of.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from dsbuild.core.errors import FormatError

# Deep nesting is never legitimate in captures or manifests.
MAX_DEPTH = 64


_CONTAINERS = (dict, list)


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """The parsed value nests at most ``limit`` containers deep. Recursive, but never deeper than
    ``limit`` (it stops there), so a hostile document cannot exhaust the stack; scalars cost one type
    test each (manifests hold hundreds of thousands of them)."""
    if type(value) not in _CONTAINERS:
        return True
    return _within(value, limit - 1)


def _within(v: dict | list, left: int) -> bool:
    if left < 0:
        return False
    for c in v.values() if type(v) is dict else v:
        if type(c) in _CONTAINERS and not _within(c, left - 1):
            return False
    return True


def parse(data: bytes | str) -> Any:
    """Strict JSON (no NaN/Infinity); raises ValueError (orjson.JSONDecodeError) on anything else."""
    return orjson.loads(data)


def loads_bounded(data: bytes | str, *, max_bytes: int, what: str, max_depth: int | None = MAX_DEPTH) -> Any:
    """Parse JSON that came from outside: size and nesting are bounded, NaN/Infinity are rejected.

    ``max_depth=None`` is for documents read straight into a typed ``Record``: its loader follows the
    schema (no deeper), refuses unknown fields and bounds the depth of each free-form field itself, so a
    walk of the whole document first would only repeat it. Raises ``FormatError`` naming ``what``.
    """
    if len(data) > max_bytes:
        raise FormatError(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        if isinstance(data, bytes):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as u:
                raise FormatError(f"{what}: not UTF-8 ({u.reason} at byte {u.start})") from None
        if "depth" in str(e):
            raise FormatError(f"{what}: JSON nested deeper than {max_depth or 1024}") from None
        raise FormatError(f"{what}: invalid JSON ({e})") from None
    if max_depth is not None and not depth_ok(value, max_depth):
        raise FormatError(f"{what}: JSON nested deeper than {max_depth}")
    return value


class _Repeated(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _Repeated(k)
        seen.add(k)
    return dict(pairs)


def repeated_key(data: bytes | str) -> str | None:
    """The first key given twice in one object of ``data`` (JSON already parsed once, so bounded), else
    None: parsers silently keep the last value, so a caller that must not guess asks here."""
    import json

    try:
        json.loads(data, object_pairs_hook=_unique, parse_constant=lambda _: 0.0)
    except _Repeated as e:
        return str(e.args[0])
    except ValueError:
        pass
    return None


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, finite numbers only."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError as e:
        raise ValueError(f"not canonical JSON: {e}") from None


def pretty_json(obj: Any) -> bytes:
    """Deterministic, human-readable JSON for records people open (manifests, split manifests)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real finite number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:  # an integer literal beyond the float range (JSON allows any length)
        return None
    return f if math.isfinite(f) else None


# C0/C1 controls, and the bidirectional formatting characters that reorder what a terminal shows (a title
# with U+202E prints reversed text after it: "Trojan Source")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(value: object) -> str:
    """A value as one safe line of text: control characters (newlines, tabs, ANSI escapes, bidi
    overrides) escaped, so text from a catalog or capture can never drive a terminal."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def printable(text: str) -> str:
    """A path from the file system as UTF-8 text: bytes that are not UTF-8 (a Latin-1 folder name, which
    Python reads as lone surrogates) shown as ``\\xNN``, so it can be recorded and printed."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def clip_text(text: str, limit: int = 200) -> str:
    """A capture-derived string cut to ``limit`` characters for a report, noting the original length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"

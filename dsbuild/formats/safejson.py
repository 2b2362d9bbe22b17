"""JSON for untrusted input (bounded size and depth) and canonical JSON for everything we hash."""

from __future__ import annotations

import json
import math
from typing import Any

from dsbuild.errors import FormatError

# Deep nesting is never legitimate in captures or manifests; json's recursion would otherwise decide.
MAX_DEPTH = 64


def _depth_ok(text: str, limit: int) -> bool:
    """Cheap pre-scan: bracket depth outside strings never exceeds ``limit``."""
    depth = 0
    in_str = False
    escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name}")


def loads_bounded(data: bytes | str, *, max_bytes: int, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON that came from outside: size and nesting are bounded, NaN/Infinity are rejected.

    Raises ``FormatError`` naming ``what`` and the problem.
    """
    if len(data) > max_bytes:
        raise FormatError(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{what}: not UTF-8 ({e.reason} at byte {e.start})") from None
    else:
        text = data
    if ("[" in text or "{" in text) and not _depth_ok(text, max_depth):
        raise FormatError(f"{what}: JSON nested deeper than {max_depth}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{what}: invalid JSON ({e})") from None


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, finite numbers only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def pretty_json(obj: Any) -> bytes:
    """Deterministic, human-readable JSON for records people open (manifests, split manifests)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real finite number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None

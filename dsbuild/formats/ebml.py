"""Matroska's outer framing, read from the first bytes of a file: where its Segment says it ends.

A finished Matroska file (OBS's default recording format) declares its Segment's size; a copy cut short
keeps that header, and FFmpeg's demuxer then just stops early ("File ended prematurely") with every
packet it returns whole. Comparing the declared end with the file's size is what tells a file cut short
from one that ended. A live or crashed recording declares the size unknown (all ones): nothing to say.
"""

from __future__ import annotations

EBML_ID = 0x1A45DFA3
SEGMENT_ID = 0x18538067
HEAD_BYTES = 256  # the EBML header (a few dozen bytes) and the Segment's own header


def _vint(data: bytes, at: int, keep_marker: bool) -> tuple[int | None, int]:
    """(value, next offset) of an EBML variable-length integer at ``at``; value None for an unknown size
    (every data bit set). IndexError/ValueError when the bytes are not one."""
    first = data[at]
    if first == 0:
        raise ValueError("not an EBML integer")
    length = 9 - first.bit_length()
    if len(data) < at + length:
        raise IndexError(at)
    raw = int.from_bytes(data[at : at + length], "big")
    if keep_marker:
        return raw, at + length
    value = raw & ((1 << (7 * length)) - 1)
    return (None if value == (1 << (7 * length)) - 1 else value), at + length


def segment_end(head: bytes) -> int | None:
    """The file offset where the Segment declares it ends, from the file's first bytes; None when the
    bytes are not Matroska's framing or the size is unknown."""
    try:
        ident, at = _vint(head, 0, keep_marker=True)
        if ident != EBML_ID:
            return None
        size, at = _vint(head, at, keep_marker=False)
        if size is None:
            return None
        at += size
        ident, at = _vint(head, at, keep_marker=True)
        if ident != SEGMENT_ID:
            return None
        size, at = _vint(head, at, keep_marker=False)
    except (IndexError, ValueError):
        return None
    return None if size is None else at + size

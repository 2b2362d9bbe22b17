"""A dict of arrays, lists of arrays or of byte buffers, and JSON values, laid out in one block of bytes:
a JSON header, then each array and buffer at an aligned offset. Worker processes hand batches over in
shared-memory segments this way (``workers``); a source's derived columns are kept this way for the
machine (``source``). Reading it back gives views of the block, not copies."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson

ALIGN = 64  # bytes: every array in a segment starts on a cache line (and its dtype's alignment)
PREFIX = struct.Struct("<Q")  # a segment starts with its header's length


def _plain(v: Any) -> Any:
    """JSON for numpy scalars (the walk's numbers may be numpy integers)."""
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"{type(v).__name__} cannot be laid out as JSON")


_ENCODER = json.JSONEncoder(default=_plain, separators=(",", ":"))  # (one: made per call it cost ~5 us a message)


def dumps(v: Any) -> bytes:
    return _ENCODER.encode(v).encode()


def loads(data: bytes | memoryview) -> Any:
    """What ``dumps`` wrote: orjson (2.4x the standard library on a batch's header: a tenth of the
    consumer's time per batch), else the standard library, which reads the NaN, Infinity and integers
    past 64 bits that ``dumps`` writes as Python does and orjson refuses."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data))


def aligned(n: int) -> int:
    """``n`` bytes rounded up to whole ``ALIGN``s: where the next array may start."""
    return -(-n // ALIGN) * ALIGN


def copy_in(root: np.ndarray, at: int, array: np.ndarray) -> None:
    """``array``'s bytes into ``root`` (uint8) from ``at``."""
    root[at : at + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _is_buffer(x: Any) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview))


def lay_out(batch: dict, extra: dict) -> tuple[bytes, list[tuple[int, Any]], int]:
    """(header, [(offset, payload)], total bytes) of ``batch`` in a segment: arrays and lists of arrays
    (``cu_seqlens``) or of encoded clips at aligned offsets after the header; every other field in the
    JSON header, in the batch's order, with ``extra``."""
    fields: list = []
    payloads: list[tuple[int, Any]] = []
    at = 0
    for name, v in batch.items():
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise TypeError(f"batch field {name!r} holds Python objects")
            fields.append([name, "array", [at, v.dtype.str, list(v.shape)]])
            payloads.append((at, v))
            at += aligned(v.nbytes)
        elif isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
            specs = []
            for a in v:
                specs.append([at, a.dtype.str, list(a.shape)])
                payloads.append((at, a))
                at += aligned(a.nbytes)
            fields.append([name, "arrays", specs])
        elif isinstance(v, list) and v and all(_is_buffer(x) for x in v):
            sizes = [memoryview(x).nbytes for x in v]
            fields.append([name, "buffers", [at, sizes]])
            payloads.append((at, v))
            at += aligned(sum(sizes))
        else:
            fields.append([name, "json", v])
    header = dumps({"fields": fields, **extra})
    base = aligned(PREFIX.size + len(header))
    return header, [(base + off, p) for off, p in payloads], base + at


def write_batch(root: np.ndarray, header: bytes, payloads: list[tuple[int, Any]]) -> None:
    """The laid-out batch into ``root`` (a segment's bytes as uint8)."""
    root[: PREFIX.size] = np.frombuffer(PREFIX.pack(len(header)), np.uint8)
    root[PREFIX.size : PREFIX.size + len(header)] = np.frombuffer(header, np.uint8)
    for at, p in payloads:
        if isinstance(p, np.ndarray):
            copy_in(root, at, p)
            continue
        for clip in p:
            n = memoryview(clip).nbytes
            root[at : at + n] = np.frombuffer(clip, np.uint8)
            at += n


def _view(root: np.ndarray, at: int, dtype: str, shape: list) -> np.ndarray:
    return np.ndarray(shape, dtype, root, at)  # (checks the bounds; a third of slicing, viewing, reshaping)


def read_batch(root: np.ndarray) -> tuple[dict, dict]:
    """(batch, extra) from a segment written by ``write_batch``: arrays and clips are views of ``root``."""
    (n,) = PREFIX.unpack_from(root.data)
    head = loads(root.data[PREFIX.size : PREFIX.size + n])
    base = aligned(PREFIX.size + n)
    batch: dict = {}
    for name, kind, spec in head.pop("fields"):
        if kind == "array":
            batch[name] = _view(root, base + spec[0], *spec[1:])
        elif kind == "arrays":
            batch[name] = [_view(root, base + s[0], *s[1:]) for s in spec]
        elif kind == "buffers":
            at, sizes, whole = base + spec[0], spec[1], root.data.toreadonly()
            clips = []
            for size in sizes:
                clips.append(whole[at : at + size])
                at += size
            batch[name] = clips
        else:
            batch[name] = spec
    return batch, head

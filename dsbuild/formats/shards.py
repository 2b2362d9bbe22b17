"""Shard layout: where shard boundaries fall, and writing one shard from its samples' segments.

Boundaries are content-defined over the sorted sequence of samples, so they follow ``--shard-size``
whatever the session lengths (short sessions share shards, long ones span several) and a change
only moves the boundaries near it (sizes are what a sample occupies in the shard, framing included):

- a shard closes after a sample once it holds at least half the target and the sample's keyed hash,
  read as a number u in [0, 1), falls below ``size / (target / 2)`` (a cut about every half target of
  bytes past the minimum, so shards average about the target);
- a shard never grows past twice the target: it closes before a sample that would push it over
  (only a single sample bigger than that makes a bigger shard);
- the last shard may be small.

Because a cut depends only on the key and size of the samples since the previous cut, adding,
removing or changing one session rewrites the shard it lands in and at most the next one or two;
every other shard is byte-identical and already in the catalog. For Parquet the sizes are the
uncompressed member sizes (compression of the arrays makes shards somewhat smaller than planned).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import CorruptDataError, FormatError, StorageError
from dsbuild.core.hashing import HashingWriter
from dsbuild.formats.base import Entry, Segment, ShardFormat
from dsbuild.formats.sample import ARRAY_DESCRS, ARRAY_MEMBERS, MAX_NPY_HEADER, MEMBERS, arrays_problem, npy_header

BOUNDARY_SALT = b"dsbuild.shards/1"


def boundary_hash(key: str) -> float:
    """The keyed hash of a sample key as a number in [0, 1)."""
    digest = hashlib.sha256(BOUNDARY_SALT + key.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64


class ShardCutter:
    """The shard boundaries of a sorted sample sequence, decided one sample at a time: ``add`` returns the
    shards (ranges of positions) that sample closes, ``finish`` the last. Each decision looks only at
    the samples before it, so a build can write a shard as soon as its samples are known."""

    def __init__(self, target: int, overhead: int = 0):
        self.lo, self.hi = target // 2, max(2 * target - overhead, target // 2 + 1)
        self.start = self.count = self.acc = 0

    def add(self, key: str, size: int) -> list[range]:
        out, i = [], self.count
        if self.acc >= self.lo and self.acc + size > self.hi:
            out.append(range(self.start, i))
            self.start, self.acc = i, 0
        self.acc += size
        if self.acc >= self.hi or (self.acc >= self.lo and boundary_hash(key) < size / max(self.lo, 1)):
            out.append(range(self.start, i + 1))
            self.start, self.acc = i + 1, 0
        self.count += 1
        return out

    def finish(self) -> list[range]:
        return [range(self.start, self.count)] if self.start < self.count else []


def plan_shards(keys: Sequence[str], sizes: Sequence[int], target: int, overhead: int = 0) -> list[range]:
    """Shards as ranges of positions in the sorted sample sequence (a pure function). ``sizes`` are the
    samples' sizes in the shard; ``overhead`` what a shard adds at most beyond them (tar's end record)."""
    cutter = ShardCutter(target, overhead)
    return [r for key, size in zip(keys, sizes) for r in cutter.add(key, size)] + cutter.finish()


@dataclass(frozen=True)
class WrittenShard:
    tmp_path: Path
    sha256: str
    blake3: str
    bytes: int
    entries: tuple[Entry, ...]


def write_shard(fmt: ShardFormat, segments: Iterable[Segment], path: Path) -> WrittenShard:
    """Write one shard to ``path`` (a temporary name), hashing as it goes; fsynced before returning.

    Output failures (ENOSPC, EROFS, EIO...) are StorageErrors: never the capture's fault."""
    try:
        with open(path, "wb") as f:
            out = HashingWriter(f)
            entries = fmt.write(segments, out)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        path.unlink(missing_ok=True)
        raise StorageError(
            f"cannot write shard {path}: {e.strerror or e}",
            hint="check free space and permissions, then run the command again",
        ) from None
    return WrittenShard(path, out.hexdigest(), out.blake3_hexdigest(), out.tell_bytes, tuple(entries))


# (verify reports everything check_shard refuses: its size, the member headers, the array headers)
UNSAFE_HINT = (
    "the catalog is damaged or forged: `dsbuild verify` names every problem, and the command that heals shards "
    "whose bytes no longer match their hash; take a forged one (its hashes re-pinned) again from a source you trust"
)


# The version of what ``shard_problems`` and ``array_problems`` refuse: raised whenever they come to refuse
# more, so that a shard the loader's proof cache found safe under older checks is checked again.
SAFETY_CHECKS = 1


def shard_problems(
    fmt: ShardFormat, path: Path, entries: Sequence[Entry], size: int, *, whole: bool = True
) -> list[tuple[str, str]]:
    """The one shard-safety check: (key, what is wrong) for every sample of the shard at ``path`` (``size``
    bytes, as recorded) that is not framed exactly as the writer frames it. For a tar: regular files only,
    member names ``<key>.<ext>`` of their own sample, no links, devices or FIFOs, mode 0644 (no
    setuid/setgid bits), sizes inside the sample, and (``whole``: ``entries`` are every sample of the
    shard) samples tiling the shard with nothing but end-of-archive padding after them. Every path that
    hands a shard's bytes to another tool, or reads them, runs it: ``verify``, exports, ``shards``,
    ``push``/``pull`` and the loader."""
    with fmt.reader(path) as reader:
        if whole:
            return reader.check_all(list(entries), size)
        found = []
        for e in entries:
            try:
                reader.check(e, size)
            except FormatError as err:
                found.append((e.key, str(err)))
        return found


Shapes = Mapping[str, Sequence[tuple[int, ...]]]  # sample key -> its array members' shapes (``array_shapes``)


def array_problems(fmt: ShardFormat, path: Path, entries: Sequence[Entry], shapes: Shapes) -> list[tuple[str, str]]:
    """(key, what is wrong, naming the member) for every sample of ``entries`` (in the shard at ``path``,
    framed as ``shard_problems`` proves) whose array members are not exactly the arrays its index row
    records (``shapes``): each .npy member parsed by its header (``arrays_problem``: dtype, byte order,
    ``fortran_order``, shape, a header of at most ``MAX_NPY_HEADER`` bytes), never its bytes reinterpreted;
    nothing is converted. Where a format holds members verbatim at known offsets (``payload_offsets``: a
    tar), only headers are read: the writer's 128 bytes of each array member, up to
    ``MAX_NPY_HEADER + 16`` where they differ. Any other format's array members come through its reader's
    ``array_members`` (a Parquet shard's array columns only, never its clips, re-encoded: their stored
    type fixes dtype and order, so only a shape can disagree)."""
    import numpy as np

    if not entries:
        return []
    slots = [MEMBERS.index(ext) for ext in ARRAY_MEMBERS]
    sized = [(e.offset, e.member_bytes) for e in entries]
    places = [(at, m) for at, m in sized if at is not None and m is not None and len(m) == len(MEMBERS)]
    starts = (
        fmt.payload_offsets(np.asarray([m for _, m in places], dtype=np.int64)) if len(places) == len(sized) else None
    )
    found = []
    if starts is not None:
        with open(path, "rb") as f:
            for e, (offset, m), first in zip(entries, places, starts.tolist()):
                heads = []
                for slot, descr, shape in zip(slots, ARRAY_DESCRS, shapes[e.key]):
                    want, where = npy_header(descr, tuple(shape)), offset + first[slot]
                    head = os.pread(f.fileno(), min(m[slot], len(want)), where)
                    if head != want:  # another header: parsed from its first bytes (bounded)
                        head = os.pread(f.fileno(), min(m[slot], MAX_NPY_HEADER + 16), where)
                    heads.append((head, m[slot]))
                if why := arrays_problem(heads, shapes[e.key]):
                    found.append((e.key, why))
        return found
    with fmt.reader(path) as reader:
        for e, arrays in reader.array_members(entries):
            if isinstance(arrays, FormatError):
                found.append((e.key, str(arrays)))
            elif why := arrays_problem([(v, len(v)) for _, v in arrays], shapes[e.key]):
                found.append((e.key, why))
    return found


def check_shard(
    fmt: ShardFormat,
    path: Path,
    name: str,
    entries: Sequence[Entry],
    size: int,
    *,
    whole: bool = True,
    shapes: Shapes | None = None,
) -> None:
    """``shard_problems`` (and, given ``shapes``, ``array_problems`` of the samples framed right), refused:
    CorruptDataError naming the shard (``name``), the sample and what is wrong with which member, and how
    many other samples are damaged."""
    try:
        actual = os.stat(path).st_size
    except OSError as e:
        raise StorageError(f"{name}: cannot read shard ({e.strerror or e})", hint=UNSAFE_HINT) from None
    if actual != size:
        raise CorruptDataError(f"{name}: holds {actual} bytes, its record says {size}", hint=UNSAFE_HINT)
    found = shard_problems(fmt, path, entries, size, whole=whole)
    if shapes is not None:
        bad = {key for key, _ in found}
        found += array_problems(fmt, path, [e for e in entries if e.key not in bad], shapes)
    if found:
        key, why = found[0]
        more = f" (and {len(found) - 1} more sample(s))" if len(found) > 1 else ""
        raise CorruptDataError(f"{name}: {key}: {why[:300]}{more}", hint=UNSAFE_HINT)

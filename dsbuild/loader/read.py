"""Reading samples' canonical members, with the framing the build recorded and the verification asked.

Formats whose samples are contiguous byte ranges holding members verbatim expose
``payload_offsets`` (WebDataset does): then members are memoryview slices at offsets computed once at
open — no tar header is parsed on the hot path — of the shard's read-only memory mapping (``read="map"``:
no copy; the reader touches each page of a sample, so its consumer never waits on the disk), or, with
``read="pread"`` or ``verify="sample"`` (the bytes hashed must be the bytes delivered), of pooled buffers
filled with one ``os.preadv`` per run of neighbours in a shard (coalesced; the GIL is released). A shard
file that is not the size its record says is never mapped (a page past its end would be a SIGBUS): it is
read, and a short read is damage. Any other format goes through its ``ShardReader.members`` (framing
checked by the format).

Verification (``LoaderOptions.verify``):
- ``"sample"``: each sample's members are hashed on every read and compared with the index: BLAKE3
  (recorded beside the sha256 since it was added; 2.3x faster here), sha256 for older versions. Catches
  any damage to the bytes read, at any time, at one hash pass per read, every epoch.
- ``"shard"``: each shard is hashed once per process (and again if its file changes identity) before
  its bytes are trusted — a mapped shard through its mapping, the bytes delivered; a shard that does not
  match is read and checked sample by sample. Catches damage
  present when the process first reads the shard, for one pass over each shard per process; it does
  not catch a change made in place afterwards that keeps the file's size, inode and mtime.
- ``"none"``: bytes are trusted. Framing stays bounded (the index was checked at open), so damage
  yields wrong content, never an unbounded read.
Arrays are cut by the shapes the index gives (the last ``frames * width * itemsize`` bytes of each
``.npy`` member), so no ``.npy`` header is parsed per read, and stay in the read buffer (``Rows``) until
collation copies them into the batch. What makes that safe is checked once per shard, on its first read
(``SampleReader.refused``): every member header by the shard-safety check ``verify`` runs, and every
array member's .npy header by the array check ``verify`` runs (``formats.shards.array_problems``: a
big-endian float64 or Fortran-order array is a damaged sample, never float32 garbage).
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, final

import numpy as np
from blake3 import blake3

from dsbuild.core import hashcache
from dsbuild.core.errors import FormatError
from dsbuild.formats.sample import (
    ARRAY_MEMBERS,
    MEMBERS,
    VIDEO_EXT,
    array_shapes,
    arrays_problem,
    members_blake3,
    members_sha256,
)
from dsbuild.formats.shards import SAFETY_CHECKS, array_problems, shard_problems
from dsbuild.loader.files import BufferPool, ShardFiles, storage_error
from dsbuild.loader.source import ARRAY_DTYPES, Source

COALESCE_GAP = 64 << 10  # read across a gap this small rather than issue a second read
PAGE = mmap.PAGESIZE
ARRAY_SLOTS = tuple(MEMBERS.index(m) for m in ARRAY_MEMBERS)
VIDEO_SLOT = MEMBERS.index(VIDEO_EXT)


@dataclass(slots=True)
class RawSample:
    """Sample ``index`` of its source: its canonical members' payloads, in ``MEMBERS`` order, and the
    index facts that shape them (taken for a whole read at once: a numpy scalar per sample costs more)."""

    index: int
    key: str
    members: list
    frames: int
    controls: int  # columns of its actions
    channels: int  # columns of its telemetry
    session: int  # its session's code in the source


class SampleReader:
    """Reads samples of one source (thread-safe; one per source per process)."""

    def __init__(self, source: Source, files: ShardFiles, verify: str, mapped: bool = True):
        self.source, self.files, self.verify = source, files, verify
        self.pool = BufferPool()
        self.fast = source.payload_offsets is not None
        self.map = self.fast and mapped  # (``LoaderOptions.mapped``)
        self._refused: dict[int, dict[int, FormatError]] = {}  # shard -> its samples the safety check refuses
        self._checking = threading.Lock()
        self._rows: list[np.ndarray] | None = None  # shard -> its samples' indices

    def refused(self, shards: list[int]) -> dict[int, FormatError]:
        """Samples (by index) of ``shards`` that fail the shard-safety check ``verify`` and the exports run
        (``formats.shards.shard_problems``: links, paths, modes, sizes, padding) or whose array members'
        .npy headers are not the dtype, order and shape the index gives (``array_problems``, as ``verify``
        runs it): damaged samples, replaced and counted like any other. Each shard is checked once per reader, on its first
        read (its member headers only: a few hundred bytes a sample)."""
        out: dict[int, FormatError] = {}
        for s in set(shards):
            found = self._refused.get(s)
            if found is None:
                with self._checking:
                    found = self._refused.get(s)
                    if found is None:
                        found = self._check_shard(s)
                        if found is None:  # not its recorded size: the reads find what it lost (checked again later)
                            continue
                        self._refused[s] = found
            out.update(found)
        return out

    def _check_shard(self, shard: int) -> dict[int, FormatError] | None:
        src = self.source
        if self._rows is None:
            order = np.argsort(src.shard_id, kind="stable")
            cuts = np.searchsorted(src.shard_id[order], np.arange(len(src.shards) + 1))
            self._rows = [order[a:b] for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
        rows, rec = self._rows[shard].tolist(), src.shards[shard]
        fact = self._safety_fact(self._rows[shard], rec.bytes)
        with self.files.handle(shard) as h:
            fd = self.files.fd(h)
            path = h.path if src.catalog.root is not None else f"/proc/self/fd/{fd}"
            try:
                st = os.fstat(fd)
                if st.st_size != rec.bytes:  # damage, not a forgery: no header of it is read
                    return None
                ident, began = hashcache.identity(st), time.time_ns()
                if hashcache.known(ident, fact):
                    self.files.stats.proof("checks_known")
                    return {}
                entries = [src.entry(i) for i in rows]
                found = dict(shard_problems(src.format, Path(path), entries, rec.bytes, whole=not src.split))
                if self.fast:  # (other formats' arrays are checked as each sample is read: ``_generic``)
                    framed = {e.key: (i, e) for i, e in zip(rows, entries) if e.key not in found}
                    shapes = {key: self._shapes(i) for key, (i, _) in framed.items()}
                    found.update(array_problems(src.format, Path(path), [e for _, e in framed.values()], shapes))
                self.files.stats.proof("shards_checked")
                if not found:
                    hashcache.remember(ident, fact, began, lambda: os.stat(path))
            except OSError as e:
                raise storage_error(f"{rec.path}: cannot read shard", e) from None
        return {
            i: FormatError(f"{rec.path}: {src.keys[i]}: {found[src.keys[i]]}") for i in rows if src.keys[i] in found
        }

    def _safety_fact(self, rows: np.ndarray, size: int) -> str:
        """What the proof cache keeps for a shard of ``size`` bytes found safe for index rows ``rows``: a
        digest of everything the checks compared the shard's bytes with (any other index, or newer
        checks, is another fact)."""
        src = self.source
        h = blake3(f"{SAFETY_CHECKS} {src.format.name} {not src.split} {self.fast} {size}\n".encode())
        h.update("\n".join(src.keys[rows].tolist()).encode())
        columns = [src.byte_offset, src.byte_length, src.row_group, src.row_index, src.frames, src.n_controls]
        columns += [src.n_channels] + ([] if src.member_bytes is None else [src.member_bytes])
        for column in columns:
            h.update(np.ascontiguousarray(column[rows], dtype="<i8").tobytes())
        return f"safe {h.hexdigest()}"

    def _shapes(self, i: int) -> tuple[tuple[int, ...], ...]:
        """The shapes the index gives sample ``i``'s array members."""
        src = self.source
        return array_shapes(int(src.frames[i]), int(src.n_controls[i]), int(src.n_channels[i]))

    def read(self, indices: list[int], heal: bool = True) -> list[RawSample | FormatError]:
        """The samples at ``indices`` (a damaged one comes back as its FormatError, in its place); ``heal``:
        a remote shard whose copy gave a damaged sample is fetched again for the next read (a caller that
        only looks, and does not deliver what it read, leaves that to the read that does)."""
        src = self.source
        idx = np.asarray(indices, dtype=np.int64)
        refused = self.refused(src.shard_id[idx].tolist())
        facts = list(
            zip(
                indices,
                [src.keys[i] for i in indices],
                src.frames[idx].tolist(),
                src.n_controls[idx].tolist(),
                src.n_channels[idx].tolist(),
                src.session_code[idx].tolist(),
            )
        )
        spans = self.spans(idx)
        out: list[RawSample | FormatError]
        if spans is not None:  # trusted as it stands (verify="none", or every shard hashed to its record)
            out = []
            for f, v, st, en in zip(facts, spans.views, spans.starts.tolist(), spans.ends.tolist()):
                touch(v, min(st), max(en))
                out.append(RawSample(f[0], f[1], [v[a:b] for a, b in zip(st, en)], *f[2:]))
            return out
        got = self._ranges(idx, facts) if self.fast else [self._generic(f) for f in facts]
        got = [refused.get(i, r) for i, r in zip(indices, got)] if refused else got
        if self.verify == "none":
            return got
        shards = src.shard_id[idx].tolist()
        read = {s for s, r in zip(shards, got) if isinstance(r, RawSample)}
        # verify="shard": each shard's trust is asked once per read, not per sample
        trusted = {s for s in read if self.files.trusted(s)} if self.verify == "shard" else set()
        out = [r if not isinstance(r, RawSample) or s in trusted else self._hashed(r) for s, r in zip(shards, got)]
        if heal:
            for s in {
                s for s, r, o in zip(shards, got, out) if isinstance(r, RawSample) and not isinstance(o, RawSample)
            }:
                self.files.suspect(s)  # a remote shard's local copy: fetched again for the next read
        return out

    def spans(self, idx: np.ndarray) -> Spans | None:
        """Samples ``idx`` as places in their shards' mappings; None where the general ``read`` must run
        instead: the reader copies (``verify="sample"``, ``read="pread"``), a shard cannot be mapped, or
        (``verify="shard"``) a shard's mapped bytes did not hash to its record. Whoever takes members
        out of them faults their pages in (``touch``)."""
        if not self.map:
            return None
        src = self.source
        shards = src.shard_id[idx].tolist()
        refused = self.refused(shards)
        if refused and not refused.keys().isdisjoint(idx.tolist()):
            return None
        mapped = {s: self.files.mapped(s) for s in set(shards)}  # (each shard's mapping is judged, even after a None)
        views = {s: v for s, v in mapped.items() if v is not None}
        if len(views) != len(mapped):
            return None
        payload_offsets, member_bytes = src.sliced()
        starts = src.byte_offset[idx][:, None] + payload_offsets[idx]
        return Spans([views[s] for s in shards], starts, starts + member_bytes[idx])

    def _ranges(self, idx: np.ndarray, facts: list[tuple]) -> list[RawSample | FormatError]:
        src = self.source
        shard, off, length = src.shard_id[idx], src.byte_offset[idx], src.byte_length[idx]
        payload_offsets, member_bytes = src.sliced()
        offsets, sizes = payload_offsets[idx].tolist(), member_bytes[idx].tolist()
        runs = coalesce(shard, off, length)
        # One buffer for the whole read: a buffer per run would keep one per sample of every batch in
        # flight under a shuffle, more than the pool holds (each new one zeroed and faulted in).
        total = sum(r.end - r.start for r in runs)
        buf = self.pool.take(total)
        view = memoryview(buf)[:total]
        self.pool.give(buf)  # reusable again once every view of it is gone
        parts, at = [], 0
        for r in runs:
            parts.append(view[at : at + r.end - r.start])
            at += r.end - r.start
        got: list[int] = []
        for s, group in itertools.groupby(zip(runs, parts), key=lambda rp: rp[0].shard):
            got += self.files.read_ranges(s, [(part, r.start) for r, part in group])
        out: list = [None] * len(facts)
        off, length = off.tolist(), length.tolist()
        for r, part, n_read in zip(runs, parts, got):
            for p in r.samples:
                i, key, frames, controls, channels, session = facts[p]
                a = off[p] - r.start
                if a + length[p] > n_read:
                    out[p] = FormatError(
                        f"{key}: shard ends inside the sample ({max(0, n_read - a)} of {length[p]} bytes)"
                    )
                    continue
                sv = part[a : a + length[p]].toreadonly()  # delivered clips are read-only, however read
                out[p] = RawSample(
                    i, key, [sv[o : o + n] for o, n in zip(offsets[p], sizes[p])], frames, controls, channels, session
                )
        return out

    def _generic(self, facts: tuple) -> RawSample | FormatError:
        src = self.source
        i = facts[0]
        try:
            with self.files.reader(int(src.shard_id[i])) as reader:
                pairs = reader.members(src.entry(i))
        except FormatError as e:
            return e
        except OSError as e:
            raise storage_error(f"{src.shards[int(src.shard_id[i])].path}: cannot read shard", e) from None
        if tuple(name for name, _ in pairs) != MEMBERS:
            return FormatError(f"{src.keys[i]}: members are not the canonical {', '.join(MEMBERS)}")
        arrays = [pairs[slot][1] for slot in ARRAY_SLOTS]
        if why := arrays_problem([(a, len(a)) for a in arrays], self._shapes(i)):
            return FormatError(f"{src.keys[i]}: {why}")
        return RawSample(i, facts[1], [p for _, p in pairs], *facts[2:])

    def _hashed(self, raw: RawSample) -> RawSample | FormatError:
        """``raw`` if its members hash to the index's BLAKE3 (or, in a version made before it was
        recorded, its sha256)."""
        members, src = list(zip(MEMBERS, raw.members)), self.source
        blake3 = src.blake3[raw.index]
        ok = members_blake3(members) == blake3 if blake3 else members_sha256(members) == src.sha256[raw.index]
        if not ok:
            return FormatError(f"{raw.key}: sample bytes do not match their hash (damaged shard?)")
        return raw


def touch(view: memoryview, start: int, end: int) -> None:
    """Fault in the pages of ``view[start:end]`` (one byte of each) now, in the thread building the batch,
    so that whoever reads the bytes later does not wait on the disk."""
    if end > start:
        bytes(view[start:end:PAGE]), view[end - 1]


@dataclass(slots=True)
class Spans:
    """A read's samples as places in their shards' mappings (``SampleReader.spans``): each sample's whole
    shard, and where each of its members' payloads starts and ends there ([samples, members], in
    ``MEMBERS`` order). A batch with nothing to run per sample is collated from these directly."""

    views: list[memoryview]
    starts: np.ndarray
    ends: np.ndarray


class Run(NamedTuple):
    """Bytes [start, end) of a shard, read at once: the samples at positions ``samples`` lie in it."""

    shard: int
    start: int
    end: int
    samples: list[int]


def coalesce(shard: np.ndarray, off: np.ndarray, length: np.ndarray) -> list[Run]:
    """The runs to read for samples at (shard, offset, length): neighbours in a shard, across gaps up to
    ``COALESCE_GAP``, in file order."""
    order = np.lexsort((off, shard)).tolist()
    shard, off, length = shard.tolist(), off.tolist(), length.tolist()
    runs: list[Run] = []
    for p in order:
        last = runs[-1] if runs else None
        if last is not None and last.shard == shard[p] and off[p] <= last.end + COALESCE_GAP:
            last.samples.append(p)
            runs[-1] = last._replace(end=max(last.end, off[p] + length[p]))
        else:
            runs.append(Run(shard[p], off[p], off[p] + length[p], [p]))
    return runs


@final  # (``collate._put`` tells it from an array by ``type(a) is Rows``)
@dataclass(slots=True)
class Rows:
    """One array member of a read sample, left in the read buffer: ``frames`` rows of ``width`` values
    (None: one value a frame), of which ``count`` rows from ``start`` every ``step`` are delivered.
    Collation copies rows that land contiguously in the batch with one memcpy, so the hot path makes no
    numpy view per sample; ``array()`` is the numpy view, for everything else (a user ``map``, strides,
    columns remapped onto the vocabulary)."""

    data: memoryview  # exactly frames rows (``array_bytes``)
    dtype: np.dtype
    frames: int
    width: int | None
    start: int
    count: int
    step: int

    def __len__(self) -> int:
        return self.count

    def clip(self) -> np.ndarray:
        """Every frame's rows (a numpy view)."""
        a = np.frombuffer(self.data, dtype=self.dtype)
        return a if self.width is None else a.reshape(self.frames, self.width)

    def array(self) -> np.ndarray:
        """The delivered rows (a numpy view)."""
        a = self.clip()
        return a[self.start : self.start + (self.count - 1) * self.step + 1 : self.step] if self.count else a[:0]


def array_bytes(raw: RawSample, slot: int, width: int | None, dtype: np.dtype) -> memoryview:
    """The bytes of the array member in ``slot`` ([frames] or [frames, width] of ``dtype``): the member's
    last frames * width * itemsize bytes, as the index shapes it (no .npy header parse)."""
    data, t = memoryview(raw.members[slot]), raw.frames
    need = t * (1 if width is None else width) * dtype.itemsize
    if len(data) < need:
        raise FormatError(f"{raw.key}: {MEMBERS[slot]} holds {len(data)} bytes, less than its {t}-frame array")
    return data[len(data) - need :]


def sample_arrays(raw: RawSample, window: slice) -> tuple[Rows, Rows, Rows]:
    """(actions [T, controls], telemetry [T, channels], timestamps [T]) in the sample's session columns,
    cut to ``window`` (a ``crop.frame_window`` of its frames)."""
    start, step, t = window.start, window.step, raw.frames
    count = len(range(start, min(window.stop, t), step))
    (a, b, c), (da, db, dc) = ARRAY_SLOTS, ARRAY_DTYPES
    return (
        Rows(array_bytes(raw, a, raw.controls, da), da, t, raw.controls, start, count, step),
        Rows(array_bytes(raw, b, raw.channels, db), db, t, raw.channels, start, count, step),
        Rows(array_bytes(raw, c, None, dc), dc, t, None, start, count, step),
    )

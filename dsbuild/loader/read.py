"""Reading samples' canonical members, with the framing the build recorded and the verification asked.

Formats whose samples are contiguous byte ranges holding members verbatim expose
``payload_offsets`` (WebDataset does): then a batch's samples are read with one ``os.preadv`` per run
of neighbours in a shard (coalesced; the GIL is released) into pooled buffers, and members are
memoryview slices at offsets computed once at open — no tar header is parsed on the hot path. Any
other format goes through its ``ShardReader.members`` (framing checked by the format).

Verification (``LoaderOptions.verify``):
- ``"sample"``: each sample's members are hashed (sha256) on every read and compared with the index.
  Catches any damage to the bytes read, at any time, at one hash pass per read, every epoch.
- ``"shard"``: each shard is hashed once per process (and again if its file changes identity) before
  its bytes are trusted; a shard that does not match is checked sample by sample. Catches damage
  present when the process first reads the shard, for one pass over each shard per process; it does
  not catch a change made in place afterwards that keeps the file's size, inode and mtime.
- ``"none"``: bytes are trusted. Framing stays bounded (the index was checked at open), so damage
  yields wrong content, never an unbounded read.
Arrays are sliced by the shapes the index gives (the last ``frames * width * itemsize`` bytes of each
``.npy`` member), so no ``.npy`` header is parsed either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.formats.sample import ARRAY_MEMBERS, MEMBERS, members_sha256
from dsbuild.loader.files import BufferPool, ShardFiles, storage_error
from dsbuild.loader.source import ARRAY_DTYPES, Source

COALESCE_GAP = 64 << 10  # read across a gap this small rather than issue a second read
ARRAY_SLOTS = tuple(MEMBERS.index(m) for m in ARRAY_MEMBERS)


@dataclass(slots=True)
class RawSample:
    """Sample ``index`` of its source: its canonical members' payloads, in ``MEMBERS`` order."""

    index: int
    key: str
    members: list


class SampleReader:
    """Reads samples of one source (thread-safe; one per source per process)."""

    def __init__(self, source: Source, files: ShardFiles, verify: str):
        self.source, self.files, self.verify = source, files, verify
        self.pool = BufferPool()
        self.fast = source.payload_offsets is not None

    def read(self, indices: list[int]) -> list[RawSample | FormatError]:
        """The samples at ``indices`` (a damaged one comes back as its FormatError, in its place)."""
        got = self._ranges(indices) if self.fast else [self._generic(i) for i in indices]
        trust: dict[int, bool] = {}  # verify="shard": each shard's trust asked once per read, not per sample
        return [self._checked(r, trust) if isinstance(r, RawSample) else r for r in got]

    def _ranges(self, indices: list[int]) -> list[RawSample | FormatError]:
        src = self.source
        idx = np.asarray(indices, dtype=np.int64)
        shard, off, length = src.shard_id[idx], src.byte_offset[idx], src.byte_length[idx]
        offsets, sizes = src.payload_offsets[idx].tolist(), src.member_bytes[idx].tolist()
        out: list = [None] * len(indices)
        order = np.lexsort((off, shard)).tolist()
        shard, off, length = shard.tolist(), off.tolist(), length.tolist()
        k = 0
        while k < len(order):
            run = [order[k]]
            s, start, end = shard[order[k]], off[order[k]], off[order[k]] + length[order[k]]
            k += 1
            while k < len(order) and shard[order[k]] == s and off[order[k]] <= end + COALESCE_GAP:
                run.append(order[k])
                end = max(end, off[order[k]] + length[order[k]])
                k += 1
            buf = self.pool.take(end - start)
            view = memoryview(buf)[:end - start]
            got = self.files.read_into(s, [view], start)
            self.pool.give(buf)  # reusable again once every view of it is gone
            for p in run:
                i, a = indices[p], off[p] - start
                if a + length[p] > got:
                    out[p] = FormatError(f"{src.keys[i]}: shard ends inside the sample ({max(0, got - a)} of "
                                         f"{length[p]} bytes)")
                    continue
                sv = view[a:a + length[p]]
                out[p] = RawSample(i, src.keys[i], [sv[o:o + n] for o, n in zip(offsets[p], sizes[p])])
        return out

    def _generic(self, i: int) -> RawSample | FormatError:
        src = self.source
        try:
            with self.files.reader(int(src.shard_id[i])) as reader:
                pairs = reader.members(src.entry(i))
        except FormatError as e:
            return e
        except OSError as e:
            raise storage_error(f"{src.shards[int(src.shard_id[i])].path}: cannot read shard", e) from None
        if tuple(name for name, _ in pairs) != MEMBERS:
            return FormatError(f"{src.keys[i]}: members are not the canonical {', '.join(MEMBERS)}")
        return RawSample(i, src.keys[i], [p for _, p in pairs])

    def _checked(self, raw: RawSample, trust: dict[int, bool]) -> RawSample | FormatError:
        if self.verify == "none":
            return raw
        if self.verify == "shard":
            shard = int(self.source.shard_id[raw.index])
            if shard not in trust:
                trust[shard] = self.files.trusted(shard)
            if trust[shard]:
                return raw
        if members_sha256(list(zip(MEMBERS, raw.members))) != self.source.sha256[raw.index]:
            return FormatError(f"{raw.key}: sample bytes do not match their hash (damaged shard?)")
        return raw


def sample_arrays(source: Source, raw: RawSample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(actions [T, controls], telemetry [T, channels], timestamps [T]) in the sample's session columns:
    views of the members' last bytes, shaped by the index (no .npy header parse)."""
    i = raw.index
    t = int(source.frames[i])
    widths = (int(source.n_controls[i]), int(source.n_channels[i]), None)
    out = []
    for slot, width, dtype in zip(ARRAY_SLOTS, widths, ARRAY_DTYPES):
        data = raw.members[slot]
        n = t * (1 if width is None else width)
        need = n * dtype.itemsize
        if len(data) < need:
            raise FormatError(f"{raw.key}: {MEMBERS[slot]} holds {len(data)} bytes, less than its {t}-frame array")
        arr = np.frombuffer(data, dtype=dtype, count=n, offset=len(data) - need)
        out.append(arr if width is None else arr.reshape(t, width))
    return out[0], out[1], out[2]

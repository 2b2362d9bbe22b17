"""WebDataset tar shards: a deterministic writer and a reader that trusts nothing it has not proven.

Members are ``<key>.<ext>`` USTAR entries with fixed mtime/owner/mode, in canonical member order, so
the same samples always give the same bytes and GNU tar, ``tarfile`` and the ``webdataset`` library
all read them. A sample's members do not depend on where they land, so a sample's segment *is* its
bytes in the shard: assembling a shard is a byte copy, and reusing a sample of an older shard is a
byte-range read.

Readers parse headers only where bytes are untrusted (verify, validate, the scan for unsafe members);
the loader slices members by the payload sizes recorded in the index at build time.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO, Literal, TypeVar, overload

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.formats.base import (
    ByteSink,
    Entry,
    Members,
    MemberViews,
    Segment,
    ShardFormat,
    ShardReader,
    register_format,
)
from dsbuild.formats.sample import KEY_RE, MEMBERS, members_sha256

BLOCK = 512
RECORD = 20 * BLOCK  # tar's record size; archives are padded to it like GNU tar and tarfile do
MAX_MEMBER_BYTES = 1 << 34  # 16 GiB: more than any clip; a header claiming more is corrupt
PICKLE_EXTS = (".pyd", ".pickle", ".pkl", ".pt", ".pth", ".joblib", ".npz")
MODE = 0o644  # every member's mode: what tar -x as root creates (setuid/setgid/sticky bits are refused)


_HEAD = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
_MID = b"00000000000\x00"  # mtime 0
_TAIL = b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * 247  # type, linkname, magic, version, rest
_BLANK_SUM = sum(_HEAD) + sum(_MID) + sum(_TAIL) + 8 * 32  # the checksum field counts as spaces


_P = TypeVar("_P", Members, MemberViews)


def _header(name: str, size: int) -> bytes:
    """A USTAR header, byte-identical to what ``tarfile`` writes for a regular file with mtime 0, uid/gid 0,
    mode 0644 and no owner names (tested against it), at a tenth of its cost."""
    raw = name.encode()
    if len(raw) > 100 or size >= 8**11:
        raise FormatError(f"tar member {name[:120]!r} does not fit a USTAR header")
    head = raw + b"\0" * (100 - len(raw)) + _HEAD + b"%011o\x00" % size + _MID
    check = sum(raw) + sum(b"%011o" % size) + _BLANK_SUM
    return head + b"%06o\x00 " % check + _TAIL


def _octal(values: np.ndarray, digits: int) -> np.ndarray:
    """``values`` as zero-padded octal ASCII digits, one row each (what ``b"%0*o" % v`` writes)."""
    shifts = 3 * np.arange(digits - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] >> shifts) & 7).astype(np.uint8) + ord("0")


def headers_as_written(rows: np.ndarray, names: list[bytes], sizes: np.ndarray) -> np.ndarray:
    """Per 512-byte header row of ``rows`` (uint8, [M, 512]): whether it is byte for byte ``_header(name,
    size)`` — the one comparison ``check`` makes per header, made for a whole shard at once. A name over
    100 bytes or a size tar cannot hold is never as written (``check`` then says why)."""
    m = len(names)
    fits = np.array([len(n) <= 100 for n in names], bool) & (sizes >= 0) & (sizes < 8**11)
    name = np.zeros((m, 100), np.uint8)
    if m:
        name[:] = np.frombuffer(np.array(names, dtype="S100").tobytes(), np.uint8).reshape(m, 100)
    size = _octal(np.where(fits, sizes, 0), 11)
    check = name.sum(1, dtype=np.int64) + size.sum(1, dtype=np.int64) + _BLANK_SUM
    expected = np.concatenate(
        [
            name,
            np.broadcast_to(np.frombuffer(_HEAD, np.uint8), (m, len(_HEAD))),
            size,
            np.zeros((m, 1), np.uint8),
            np.broadcast_to(np.frombuffer(_MID, np.uint8), (m, len(_MID))),
            _octal(check, 6),
            np.broadcast_to(np.frombuffer(b"\0 " + _TAIL, np.uint8), (m, 2 + len(_TAIL))),
        ],
        axis=1,
    )
    return fits & (rows == expected).all(axis=1)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % BLOCK)


def payload_offsets(member_bytes: tuple[int, ...] | list[int]) -> list[int]:
    """Offset of each member's payload from the start of its sample (headers and padding skipped)."""
    out, pos = [], 0
    for n in member_bytes:
        out.append(pos + BLOCK)
        pos += BLOCK + n + (-n % BLOCK)
    return out


def _member(block: bytes, pos: int, key: str | None) -> tarfile.TarInfo:
    """Parse and vet one 512-byte header: a regular ``<key>.<ext>`` file with a sane size."""
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
    except (tarfile.HeaderError, UnicodeDecodeError) as e:
        raise FormatError(f"bad tar header at offset {pos}: {e}") from None
    name = info.name
    if not info.isreg():
        raise FormatError(f"tar member {name[:120]!r} is not a regular file (links and devices are refused)")
    if "/" in name or "\\" in name or name.startswith(".") or ".." in name:
        raise FormatError(f"tar member {name[:120]!r} has a path; members must be <key>.<ext>")
    member_key, dot, _ext = name.partition(".")
    if not dot or not KEY_RE.fullmatch(member_key) or (key is not None and member_key != key):
        raise FormatError(f"tar member {name[:120]!r} does not belong to sample {key or '?'}")
    if not 0 <= info.size <= MAX_MEMBER_BYTES:
        raise FormatError(f"tar member {name[:120]!r} claims {info.size} bytes")
    if info.mode != MODE:
        raise FormatError(f"tar member {name[:120]!r} has {_mode_problem(info.mode)}; members are written 0644")
    return info


def _mode_problem(mode: int) -> str:
    """What is wrong with a member's mode bits (anything but 0644)."""
    special = [what for bit, what in ((0o4000, "setuid"), (0o2000, "setgid"), (0o1000, "sticky")) if mode & bit]
    return f"mode {mode:04o}" + (f" ({', '.join(special)} bit)" if special else "")


@overload
def parse_members(buf: bytes | memoryview, key: str | None = None, *, views: Literal[False] = False) -> Members: ...
@overload
def parse_members(buf: bytes | memoryview, key: str | None = None, *, views: Literal[True]) -> MemberViews: ...
def parse_members(buf: bytes | memoryview, key: str | None = None, *, views: bool = False) -> Members | MemberViews:
    """Parse a byte range of a tar shard into (ext, payload) pairs, refusing anything unsafe.

    ``key``, when given, must own every member (an entry pointing at the wrong bytes is caught). Stops
    at the end-of-archive marker. ``views=True`` returns memoryviews into ``buf`` instead of copies.
    """
    view = memoryview(buf)
    out: MemberViews = []
    pos = 0
    while pos + BLOCK <= len(view):
        block = bytes(view[pos : pos + BLOCK])
        if block == b"\0" * BLOCK:
            break
        info = _member(block, pos, key)
        start = pos + BLOCK
        end = start + info.size
        if end > len(view):
            raise FormatError(f"tar member {info.name!r} is truncated ({len(view) - start} of {info.size} bytes)")
        out.append((info.name.partition(".")[2], view[start:end] if views else bytes(view[start:end])))
        pos = end + (-info.size % BLOCK)
    return out


class TarReader(ShardReader):
    def __init__(self, path: Path):
        super().__init__(path)
        self._f: BinaryIO | None = None

    def _file(self) -> BinaryIO:
        if self._f is None:  # held open between calls (os.pread on it) until close()
            self._f = open(self.path, "rb")  # noqa: SIM115 (closed by close(), not by this function)
        return self._f

    def _range(self, entry: Entry) -> bytes:
        if entry.offset is None or entry.length is None or entry.offset < 0 or entry.length <= 0:
            raise FormatError(f"{entry.key}: the index gives no byte range")
        data = os.pread(self._file().fileno(), entry.length, entry.offset)
        if len(data) != entry.length:
            raise FormatError(f"{entry.key}: shard ends inside the sample ({len(data)} of {entry.length} bytes)")
        return data

    def members(self, entry: Entry) -> Members:
        return self._vetted(entry, parse_members(self._range(entry), entry.key))

    def member_views(self, entry: Entry) -> Members:
        # Views stand in for bytes here as the base class documents: typing them as such would carry
        # ``bytes | memoryview`` into Sample and the validators that read it (issue 38: left to them).
        return self._vetted(entry, parse_members(self._range(entry), entry.key, views=True))  # type: ignore[arg-type]

    def _vetted(self, entry: Entry, pairs: _P) -> _P:
        names = tuple(ext for ext, _ in pairs)
        if names != MEMBERS:
            raise FormatError(
                f"{entry.key}: members {', '.join('.' + n for n in names)} are not the "
                f"canonical {', '.join('.' + n for n in MEMBERS)}"
            )
        if entry.member_bytes is not None and tuple(len(p) for _, p in pairs) != tuple(entry.member_bytes):
            raise FormatError(f"{entry.key}: member sizes differ from the index")
        return pairs

    def verified_segment(self, entry: Entry, fmt: ShardFormat) -> Segment:
        """Members sliced by the index's sizes, hashed against the sample hash, then re-encoded: the
        payloads are proven and the headers are written anew, so no byte of the old framing is trusted."""
        if entry.member_bytes is None or len(entry.member_bytes) != len(MEMBERS):
            return super().verified_segment(entry, fmt)
        data = memoryview(self._range(entry))
        offsets = payload_offsets(entry.member_bytes)
        if offsets[-1] + entry.member_bytes[-1] > len(data):
            raise FormatError(f"{entry.key}: member sizes overrun the sample's byte range")
        members = [(ext, data[o : o + n]) for ext, o, n in zip(MEMBERS, offsets, entry.member_bytes)]
        if members_sha256(members) != entry.sha256:
            raise FormatError(f"{entry.key}: bytes in {self.path.name} no longer match the sample hash (damaged shard)")
        return fmt.encode(entry.key, entry.sha256, members)

    def check(self, entry: Entry, size: int) -> None:
        """Every member header of ``entry`` read (512 bytes each): a regular file named ``<key>.<ext>``,
        mode 0644, of a size inside the sample's range. A header byte-identical to what the writer makes
        for its recorded name and size is proven by one comparison; any other is parsed and vetted."""
        if entry.offset is None or entry.length is None or entry.offset < 0 or entry.offset + entry.length > size:
            raise FormatError(f"byte range {entry.offset}+{entry.length} is outside the shard")
        f = self._file()
        end = entry.offset + entry.length
        expected = (
            entry.member_bytes if entry.member_bytes is not None and len(entry.member_bytes) == len(MEMBERS) else ()
        )
        pos, sizes = entry.offset, list[int]()
        while pos < end:
            block = os.pread(f.fileno(), BLOCK, pos)
            if len(block) < BLOCK:
                raise FormatError(f"shard ends inside the header at offset {pos}")
            k = len(sizes)
            if k < len(expected) and block == _header(f"{entry.key}.{MEMBERS[k]}", expected[k]):
                n = expected[k]
            else:
                info = _member(block, pos, entry.key)
                n = info.size
                if pos + BLOCK + n > end:
                    raise FormatError(
                        f"tar member {info.name[:120]!r} claims {n} bytes, beyond its sample's range "
                        f"(which ends {end - pos - BLOCK} bytes after its header)"
                    )
            sizes.append(n)
            pos += BLOCK + n + (-n % BLOCK)
        if pos != entry.offset + entry.length or not sizes:
            raise FormatError(
                f"index range {entry.offset}+{entry.length} does not end on a member boundary of {entry.key}"
            )
        if entry.member_bytes is not None and tuple(sizes) != tuple(entry.member_bytes):
            raise FormatError(f"member sizes {sizes} differ from the index's {list(entry.member_bytes)}")

    def check_all(self, entries: list[Entry], size: int) -> list[tuple[str, str]]:
        """Entries must tile the shard: sorted by offset they start at 0, follow each other without gap
        or overlap, each length equals its members' framed sizes, and the end-of-archive padding
        follows the last; and every member's tar header must be a regular file named ``<key>.<ext>`` of
        its recorded size (parsed from its 512 bytes): a shard's bytes are proven by its hashes, but a
        forged catalog's own hashes prove a header named ``../../x`` or a symlink just as well, and an
        export hands the shard to tools that extract it."""
        out = []
        pos = 0
        ordered = sorted(entries, key=lambda e: e.offset if e.offset is not None else -1)
        for e in ordered:
            if e.offset is None or e.length is None or e.member_bytes is None:
                out.append((e.key, "the index gives no byte range or member sizes"))
                continue
            framed = sum(BLOCK + n + (-n % BLOCK) for n in e.member_bytes)
            if e.offset != pos:
                out.append((e.key, f"byte range starts at {e.offset}, expected {pos} (gap or overlap)"))
            if e.length != framed or len(e.member_bytes) != len(MEMBERS):
                out.append((e.key, f"length {e.length} is not its {len(e.member_bytes)} members' framed size"))
            pos = e.offset + e.length
        tail = size - pos
        if ordered and not (
            2 * BLOCK <= tail <= WebDatasetFormat.max_overhead and tail % BLOCK == 0 and size % RECORD == 0
        ):
            out.append(
                (ordered[-1].key, f"shard does not end with tar padding after the last sample ({tail} bytes left)")
            )
        elif ordered and os.pread(self._file().fileno(), tail, pos).strip(b"\0"):
            # (tar readers stop at the first zero block: a member hidden in the padding is what they extract)
            out.append((ordered[-1].key, f"the end-of-archive padding after the last sample holds data (at {pos})"))
        flagged = {k for k, _ in out}
        todo = [e for e in ordered if e.key not in flagged]
        for e in self._unproven(todo, size):  # (a header not as written is parsed and vetted: one message)
            try:
                self.check(e, size)
            except FormatError as err:
                out.append((e.key, str(err)))
        return out

    def _unproven(self, entries: list[Entry], size: int) -> list[Entry]:
        """Those of ``entries`` (which tile the shard) with a member header that is not byte for byte what
        the writer makes for its recorded name and size: every header of the shard read, then compared at
        once (``headers_as_written``), where ``check`` builds and compares them one by one."""
        if not entries or size == 0:
            return entries
        names, sizes, starts, owner = [], [], [], []
        for i, e in enumerate(entries):
            member_bytes = list(e.member_bytes or ())
            for ext, n, at in zip(MEMBERS, member_bytes, payload_offsets(member_bytes)):
                names.append(f"{e.key}.{ext}".encode())
                sizes.append(n)
                starts.append((e.offset or 0) + at - BLOCK)  # (each member's header precedes its payload)
                owner.append(i)
        fd = self._file().fileno()
        blocks = [os.pread(fd, BLOCK, at) if 0 <= at <= size - BLOCK else b"" for at in starts]
        inside = np.array([len(b) == BLOCK for b in blocks], bool)  # (else ``check`` says where it ends)
        rows = np.frombuffer(b"".join(b if len(b) == BLOCK else bytes(BLOCK) for b in blocks), np.uint8)
        good = inside & headers_as_written(rows.reshape(-1, BLOCK), names, np.asarray(sizes, np.int64))
        bad = np.unique(np.asarray(owner)[~good])
        return [entries[i] for i in bad.tolist()]

    def scan(self, keys: set[str]) -> list[tuple[str, str]]:
        out = []
        try:
            with tarfile.open(self.path, "r:") as tf:
                for info in tf:
                    why = _member_problems(info, keys)
                    if why:
                        out.append((f"{self.path.name}:{info.name[:120]}", "; ".join(why)))
        except (tarfile.TarError, OSError, EOFError) as e:
            out.append(
                (self.path.name, f"tar structure unreadable ({str(e)[:120]}); its members cannot be proven safe")
            )
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _member_problems(info: tarfile.TarInfo, keys: set[str]) -> list[str]:
    name = info.name
    out = []
    if not info.isreg():
        kind = (
            "symlink"
            if info.issym()
            else "hard link"
            if info.islnk()
            else "directory"
            if info.isdir()
            else "special file"
        )
        out.append(f"{kind} member (only regular files are allowed)")
    if "/" in name or "\\" in name or name.startswith(".") or ".." in name:
        out.append("member name has a path")
    if info.mode != MODE:
        out.append(_mode_problem(info.mode) + " (members are written 0644)")
    if name.lower().endswith(PICKLE_EXTS):
        out.append("pickle-like member (never unpickled; must not be shipped)")
    key, _, ext = name.partition(".")
    if key not in keys:
        out.append("member belongs to no sample in the index")
    elif ext not in MEMBERS and not out:
        out.append(f"unknown member type .{ext[:40]}")
    return out


class WebDatasetFormat(ShardFormat):
    name = "webdataset"
    ext = "tar"
    max_overhead = 2 * BLOCK + RECORD  # end-of-archive blocks, padded to a whole record

    def planned_size(self, member_bytes: tuple[int, ...]) -> int:
        return sum(BLOCK + n + (-n % BLOCK) for n in member_bytes)

    def encode(self, key: str, sha256: str, members: Sequence[tuple[str, bytes | memoryview]]) -> Segment:
        parts = []
        for ext, payload in members:
            parts += [_header(f"{key}.{ext}", len(payload)), payload, _pad(len(payload))]
        return Segment(key, sha256, b"".join(parts), tuple(len(p) for _, p in members))

    def write(self, segments: Iterable[Segment], out: ByteSink) -> list[Entry]:
        entries, pos = [], 0
        for seg in segments:
            out.write(seg.data)
            entries.append(Entry(seg.key, seg.sha256, offset=pos, length=len(seg.data), member_bytes=seg.member_bytes))
            pos += len(seg.data)
        end = pos + 2 * BLOCK
        out.write(b"\0" * (2 * BLOCK + (-end % RECORD)))
        return entries

    def reader(self, path: Path) -> TarReader:
        return TarReader(path)

    def payload_offsets(self, member_bytes):
        import numpy as np

        framed = BLOCK + member_bytes + (-member_bytes % BLOCK)
        return np.cumsum(framed, axis=1) - framed + BLOCK


register_format(WebDatasetFormat())

"""WebDataset tar shards: a deterministic writer and a validating member parser.

Members are ``<key>.<ext>`` USTAR entries with fixed mtime/owner/mode, sorted by key then canonical
member order, so the same samples always give the same bytes and GNU tar, ``tarfile`` and the
``webdataset`` library all read them. The parser trusts nothing: it accepts only regular files whose
names are ``<key>.<known ext>`` with no path separators.
"""

from __future__ import annotations

import tarfile

from dsbuild.errors import FormatError
from dsbuild.formats.sample import KEY_RE, Sample
from dsbuild.formats.shards import IndexEntry, ShardWriter

BLOCK = 512
RECORD = 20 * BLOCK  # tar's record size; archives are padded to it like GNU tar and tarfile do
MAX_MEMBER_BYTES = 1 << 34  # 16 GiB: more than any clip; a header claiming more is corrupt


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")


def _pad(n: int) -> bytes:
    return b"\0" * (-n % BLOCK)


class TarShardWriter(ShardWriter):
    ext = "tar"

    def _append(self, sample: Sample, members: list[tuple[str, bytes]], sha256: str) -> IndexEntry:
        start = self.out.tell_bytes
        for ext, payload in members:
            self.out.write(_header(f"{sample.key}.{ext}", len(payload)))
            self.out.write(payload)
            self.out.write(_pad(len(payload)))
        return IndexEntry(sample.key, sha256, offset=start, length=self.out.tell_bytes - start)

    def _finish(self) -> None:
        end = self.out.tell_bytes + 2 * BLOCK
        self.out.write(b"\0" * (2 * BLOCK + (-end % RECORD)))


def _member(block: bytes, pos: int, key: str | None) -> tarfile.TarInfo:
    """Parse and vet one 512-byte header: a regular ``<key>.<ext>`` file with a sane size."""
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
    except (tarfile.HeaderError, UnicodeDecodeError) as e:
        raise FormatError(f"bad tar header at offset {pos}: {e}") from None
    name = info.name
    if not info.isreg():
        raise FormatError(f"tar member {name!r} is not a regular file (links and devices are refused)")
    if "/" in name or "\\" in name or name.startswith(".") or ".." in name:
        raise FormatError(f"tar member {name!r} has a path; members must be <key>.<ext>")
    member_key, dot, _ext = name.partition(".")
    if not dot or not KEY_RE.fullmatch(member_key) or (key is not None and member_key != key):
        raise FormatError(f"tar member {name!r} does not belong to sample {key or '?'}")
    if not 0 <= info.size <= MAX_MEMBER_BYTES:
        raise FormatError(f"tar member {name!r} claims {info.size} bytes")
    return info


def parse_members(buf: bytes | memoryview, key: str | None = None, *, views: bool = False) -> list[tuple[str, bytes]]:
    """Parse a byte range of a tar shard into (name, payload) pairs, refusing anything unsafe.

    ``key``, when given, must own every member (an index entry pointing at the wrong bytes is caught).
    Stops at the end-of-archive marker. Raises FormatError naming the problem. ``views=True`` returns
    memoryviews into ``buf`` instead of copies (for readers that only hash or scan the payloads).
    """
    view = memoryview(buf)
    out = []
    pos = 0
    while pos + BLOCK <= len(view):
        block = bytes(view[pos:pos + BLOCK])
        if block == b"\0" * BLOCK:
            break
        info = _member(block, pos, key)
        start = pos + BLOCK
        end = start + info.size
        if end > len(view):
            raise FormatError(f"tar member {info.name!r} is truncated ({len(view) - start} of {info.size} bytes)")
        out.append((info.name, view[start:end] if views else bytes(view[start:end])))
        pos = end + (-info.size % BLOCK)
    return out


def member_headers(f, offset: int, length: int, key: str) -> list[tuple[str, int]]:
    """(name, size) of the members in ``[offset, offset + length)`` of an open shard, reading only the
    headers: proves an index entry frames exactly its own sample without touching the payloads."""
    out = []
    pos = offset
    while pos < offset + length:
        f.seek(pos)
        block = f.read(BLOCK)
        if len(block) < BLOCK:
            raise FormatError(f"shard ends inside the header at offset {pos}")
        info = _member(block, pos, key)
        out.append((info.name, info.size))
        pos += BLOCK + info.size + (-info.size % BLOCK)
    if pos != offset + length or not out:
        raise FormatError(f"index range {offset}+{length} does not end on a member boundary of {key}")
    return out

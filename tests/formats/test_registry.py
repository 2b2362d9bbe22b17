"""The format layer is open: a third format registered by a user goes through convert and verify
without any other package knowing its bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import FormatError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats import Entry, Segment, ShardFormat, ShardReader, format_names, get_format, register_format
from dsbuild.formats.sample import MEMBERS, members_sha256
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import verify


class FramedReader(ShardReader):
    """Samples as length-prefixed members, one after another."""

    def members(self, entry: Entry):
        with open(self.path, "rb") as f:
            f.seek(entry.offset)
            data = f.read(entry.length)
        out, pos = [], 0
        for ext in MEMBERS:
            (n,) = struct.unpack_from("<Q", data, pos)
            out.append((ext, data[pos + 8 : pos + 8 + n]))
            pos += 8 + n
        if pos != len(data):
            raise FormatError(f"{entry.key}: framing does not fill its range")
        return out

    def check(self, entry: Entry, size: int) -> None:
        if entry.offset + entry.length > size:
            raise FormatError("outside the shard")
        self.members(entry)

    def scan(self, keys):
        return []


class FramedFormat(ShardFormat):
    name = "framed"
    ext = "bin"

    def encode(self, key, sha256, members):
        data = b"".join(struct.pack("<Q", len(p)) + bytes(p) for _, p in members)
        return Segment(key, sha256, data, tuple(len(p) for _, p in members))

    def write(self, segments, out):
        entries, pos = [], 0
        for seg in segments:
            out.write(seg.data)
            entries.append(Entry(seg.key, seg.sha256, offset=pos, length=len(seg.data), member_bytes=seg.member_bytes))
            pos += len(seg.data)
        return entries

    def reader(self, path: Path) -> FramedReader:
        return FramedReader(path)


def test_a_registered_third_format_converts_verifies_and_reads_back(captures, tmp_path):
    register_format(FramedFormat())
    assert "framed" in format_names()
    r = convert(
        captures,
        tmp_path / "cat",
        ConvertConfig(format="framed", clip_seconds=3.0, shard_size=300_000),
        executor=ExecutorSpec(workers=2),
    )
    cat = Catalog.open(tmp_path / "cat")
    assert verify(cat, r.version_id).ok and r.shards > 1
    m = cat.manifest(r.version_id)
    assert all(s.path.endswith(".bin") for s in m.shards)
    table = cat.index(r.version_id)
    rows = table.to_pylist()
    shards = {s.path: s for s in m.shards}
    for row in rows:
        with get_format("framed").reader(cat.shard_file(shards[row["shard"]])) as reader:
            entry = Entry(row["key"], row["sha256"], row["byte_offset"], row["byte_length"])
            assert members_sha256(reader.members(entry)) == row["sha256"]
            assert reader.read(entry).meta.key == row["key"]
    wds = convert(captures, tmp_path / "wds", ConvertConfig(clip_seconds=3.0), executor=ExecutorSpec(workers=1))
    assert wds.content_id == r.content_id  # the same samples, whatever the bytes around them


def test_an_unknown_format_is_a_clear_error():
    with pytest.raises(FormatError, match="unknown shard format 'nope'; known: "):
        get_format("nope")

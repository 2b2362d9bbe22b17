"""Hostile inputs are refused with a clear message and nothing is written outside the target.
And no pickle is ever loaded: the library runs end to end with unpickling disabled."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import av
import numpy as np
import pyarrow as pa
import pytest
import zstandard

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import CaptureError, FormatError, LineageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats.capture import read_session
from dsbuild.formats.sample import decompress_events
from dsbuild.formats.webdataset import parse_members
from dsbuild.lineage.catalog import Catalog
from dsbuild.samples.synthetic import generate


def _tar(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for m in members:
            tf.addfile(m, io.BytesIO(data) if m.isreg() else None)
    return buf.getvalue()


def _member(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member, message",
    [
        (_member("../evil.json"), "has a path"),
        (_member("/etc/passwd.json"), "has a path"),
        (_member("k__000000.json", tarfile.SYMTYPE, "/etc/passwd"), "not a regular file"),
        (_member("k__000000.json", tarfile.LNKTYPE, "other"), "not a regular file"),
        (_member("k__000000"), "does not belong"),
    ],
)
def test_unsafe_tar_members_are_refused(member, message, tmp_path):
    with pytest.raises(FormatError, match=message):
        parse_members(_tar(member))
    assert not (tmp_path.parent / "evil.json").exists()


def test_zstd_bombs_are_bounded():
    claims = zstandard.ZstdCompressor(level=19).compress(b"\0" * (300 << 20))
    with pytest.raises(FormatError, match="claims"):
        decompress_events(claims, limit=16 << 20)
    hidden = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (64 << 20))
    with pytest.raises(FormatError, match="expand beyond"):
        decompress_events(hidden, limit=16 << 20)


def test_json_nested_100000_deep_is_refused(tmp_path):
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True)
    (d / "session.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CaptureError, match="nested deeper"):
        read_session(d, tmp_path / "root")


def test_ten_million_conditions_are_refused_by_size(tmp_path):
    d = tmp_path / "root" / "s"
    d.mkdir(parents=True)
    with open(d / "session.json", "w") as f:
        f.write(
            '{"format": "capture/1", "session_id": "s", "title": "t", "player": "p", "video": "v.mp4", "conditions": {'
        )
        f.write(",".join(f'"c{i}": "v"' for i in range(10_000_000)))
        f.write("}}")
    with pytest.raises(CaptureError, match="larger than the limit"):
        read_session(d, tmp_path / "root")


def _huge_resolution_video(path):
    """A Matroska rawvideo track whose header declares 32767x32767 (patched after encoding 4096x256)."""
    with av.open(str(path), "w", format="matroska") as c:
        s = c.add_stream("rawvideo", rate=1)
        s.width, s.height, s.pix_fmt = 4096, 256, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((256, 4096, 3), np.uint8), format="rgb24").reformat(
            format="yuv420p"
        )
        for p in s.encode(frame):
            c.mux(p)
    data = bytearray(path.read_bytes())
    for element, value in ((b"\xb0\x82\x10\x00", b"\xb0\x82\x7f\xff"), (b"\xba\x82\x01\x00", b"\xba\x82\x7f\xff")):
        at = data.find(element)
        assert at > 0, "PixelWidth/PixelHeight not found"
        data[at : at + 4] = value
    path.write_bytes(bytes(data))


def test_hostile_sessions_are_quarantined_with_reasons(tmp_path):
    cap = tmp_path / "cap"
    generate(cap, sessions=3, seconds=2, seed=1)
    (cap / "ks-1-0000").rename(cap / "evil\nname")
    sr = cap / "sr-1-0002"
    _huge_resolution_video(sr / "video.mp4")
    r = convert(cap, tmp_path / "cat", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    reasons = {q.path: q.reason for q in r.quarantined}
    assert "control character" in reasons["evil\nname"]  # the path itself (was its Python repr)
    assert any("declared resolution" in why for why in reasons.values())
    assert r.sessions == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap", "cat"]  # nothing written beside the target


def test_a_manifest_pointing_outside_the_catalog_is_refused(wds_catalog, tmp_path):
    import shutil

    src, vid = wds_catalog
    cat = tmp_path / "cat"
    shutil.copytree(src, cat)
    path = cat / "versions" / vid / "manifest.json"
    doc = json.loads(path.read_text())
    doc["shards"][0]["path"] = "../../../etc/passwd"
    path.write_text(json.dumps(doc))
    with pytest.raises(LineageError, match="not the version id"):
        Catalog.open(cat).manifest(vid)
    from dsbuild.lineage.manifest import Manifest

    with pytest.raises(FormatError, match="does not match"):
        Manifest.from_bytes(path.read_bytes(), "manifest.json")


@pytest.mark.parametrize("kind", ["fifo", "outside"])
def test_a_shard_that_is_a_fifo_or_a_symlink_out_of_the_catalog_is_refused_never_read(wds_catalog, tmp_path, kind):
    """A hostile catalog's shard file: a FIFO hung validate, export and the loader forever; a symlink to
    a file outside the catalog (its size in the record) was linked by `export --to wids` (shipping, say,
    a private key) and read by the loader. Each is now a damaged catalog, named, before any read."""
    import os
    import shutil

    from tests.helpers import cli

    src, vid = wds_catalog
    cat = tmp_path / "cat"
    shutil.copytree(src, cat)
    shard = cat / Catalog.open(cat).manifest(vid).shards[0].path
    if kind == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    else:
        secret = tmp_path / "secret"
        secret.write_bytes(shard.read_bytes())  # the size its record says
        shard.unlink()
        shard.symlink_to(secret)
    why = "is a FIFO" if kind == "fifo" else "resolves outside"
    for args, code in (
        (("export", cat, tmp_path / "out", "--to", "wids"), 3),
        (("shards", cat), 3),
        (("validate", cat, "--quiet"), 1),
    ):
        p = cli(*args)  # (a FIFO opened for reading would block until the timeout)
        assert p.returncode == code, (args, p.stderr)
    assert why in cli("export", cat, tmp_path / "out2", "--to", "wids").stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.tar"))
    from dsbuild.loader import Loader

    with pytest.raises(LineageError, match=why):
        next(iter(Loader(cat, decode="bytes", batch_size=2, verify="none")))


@pytest.mark.parametrize("shape", ["(1099511627776,)", "(3000000000,)", "(4611686018427387904, 4)", "(2, 5)"])
def test_an_npy_header_must_account_for_exactly_the_bytes_that_follow(shape):
    """``np.load`` allocates what a header declares before reading: a 2-KB member declaring 2^40 floats
    made validate and export fail with "out of memory" (exit 3) instead of naming a damaged sample."""
    from dsbuild.formats.sample import npy_load

    body = np.arange(12, dtype="<f4").tobytes()
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    with pytest.raises(ValueError, match="declares"):
        npy_load(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + body)
    buf = io.BytesIO()
    np.save(buf, np.arange(12, dtype="<f4").reshape(3, 4))
    assert npy_load(buf.getvalue()).shape == (3, 4)


def test_parquet_that_declares_more_than_its_size_allows_is_refused_before_it_is_decompressed(
    parquet_catalog, wds_catalog, tmp_path, monkeypatch
):
    """A 3.4-MB Parquet shard whose one row holds 1.5 GB of zeros (and a 73-KB index of 30-MB keys) made
    validate and the loader decompress it all (7-11 GB of memory); what the column chunks declare is now
    bounded by the file's size before any page is read (the floors are lowered here so small files show it)."""
    import pyarrow.parquet as pq

    import dsbuild.formats.parquet as pqfmt
    import dsbuild.lineage.index as index_module
    from dsbuild.formats.base import Entry
    from dsbuild.lineage.index import table_from_bytes

    monkeypatch.setattr(pqfmt, "EXPANSION_FLOOR", 0)
    monkeypatch.setattr(index_module, "EXPANSION_FLOOR", 0)
    src, vid = parquet_catalog
    row = Catalog.open(src).index(vid).slice(0, 1).to_pylist()[0]
    shard = src / row["shard"]
    entry = Entry(row["key"], row["sha256"], row_group=row["row_group"], row=row["row_index"])
    assert pqfmt.ParquetReader(shard).read(entry).key == row["key"]  # an honest shard is within the bound
    table = pq.read_table(shard)
    videos = table.column("video").to_pylist()
    videos[0] = bytes(4 << 20)
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(
        table.set_column(table.schema.get_field_index("video"), "video", pa.array(videos, pa.binary())),
        bomb,
        compression="zstd",
        use_dictionary=False,
        row_group_size=pqfmt.ROW_GROUP_SAMPLES,
    )
    with pytest.raises(FormatError, match="declares .* once decompressed, over the limit"):
        pqfmt.ParquetReader(bomb).read(Entry(row["key"], row["sha256"], row_group=0, row=0))
    wsrc, wvid = wds_catalog
    index = Catalog.open(wsrc).index(wvid)
    padded = index.set_column(
        index.schema.get_field_index("title"), "title", pa.array(["t" * (1 << 20)] * index.num_rows, pa.string())
    )
    sink = io.BytesIO()
    pq.write_table(padded, sink, compression="zstd", use_dictionary=False)
    with pytest.raises(FormatError, match="once decompressed"):
        table_from_bytes(sink.getvalue(), "index.parquet")


@pytest.mark.parametrize("forged", ["../../../../tmp/PWNED.mp4", "/etc/cron.d/x.mp4", "symlink"])
def test_every_samples_tar_headers_are_checked_not_only_the_first_and_last(wds_catalog, tmp_path, forged):
    """verify parsed the headers of a shard's first and last sample only: a middle sample's member named
    ``../../x`` or absolute, or a symlink to /etc/passwd, passed (its forged catalog's hashes prove those
    bytes as well as any), and `export --to wids` then handed the shard to tools that extract it."""

    from dsbuild.formats.webdataset import TarReader
    from dsbuild.lineage.index import rows_from_table

    src, vid = wds_catalog
    cat = Catalog.open(src)
    rows = rows_from_table(cat.index(vid))
    shard = max({r.shard for r in rows}, key=lambda sh: sum(r.shard == sh for r in rows))
    mine = sorted((r for r in rows if r.shard == shard), key=lambda r: r.byte_offset)
    middle = mine[len(mine) // 2]
    data = bytearray((src / shard).read_bytes())
    at = middle.byte_offset  # the sample's first member header
    info = tarfile.TarInfo.frombuf(bytes(data[at : at + 512]), "utf-8", "strict")
    if forged == "symlink":
        info.type, info.linkname, info.size = tarfile.SYMTYPE, "/etc/passwd", 0
    else:
        info.name = forged
    data[at : at + 512] = info.tobuf(tarfile.GNU_FORMAT)[:512]
    copy = tmp_path / "shard.tar"
    copy.write_bytes(bytes(data))
    found = TarReader(copy).check_all([r.entry() for r in mine], len(data))
    assert [k for k, _ in found] == [middle.key], found


NO_PICKLE = """
import pickle, sys
def refuse(*a, **k):
    raise AssertionError("pickle was asked to load data")
pickle.load = pickle.loads = refuse
pickle.Unpickler = refuse
from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import verify
from dsbuild.loader import Loader
cap, out = sys.argv[1], sys.argv[2]
for fmt in ("webdataset", "parquet"):
    r = convert(cap, out + fmt, ConvertConfig(format=fmt, clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    assert verify(Catalog.open(out + fmt), r.version_id).ok
    n = sum(len(b["keys"]) for b in Loader(out + fmt, batch_size=2, resize=(16, 16), num_workers=2))
    assert n == r.samples, (n, r.samples)
print("ok")
"""


def test_no_pickle_is_ever_loaded(tmp_path):
    generate(tmp_path / "cap", sessions=2, seconds=2, seed=3, damage={1: "malformed_lines"})
    r = subprocess.run(
        [sys.executable, "-c", NO_PICKLE, str(tmp_path / "cap"), str(tmp_path / "out-")], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr

"""Small readers used by tests to look at what convert wrote, through the real libraries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq


def manifest(catalog: Path, version_id: str) -> dict:
    return json.loads((catalog / "versions" / version_id / "manifest.json").read_text())


def session_records(catalog: Path, version_id: str) -> dict:
    """The version's sessions.json: {"sessions": [...], "sources": [...]}."""
    return json.loads((catalog / "versions" / version_id / "sessions.json").read_text())


def index_rows(catalog: Path, version_id: str) -> list[dict]:
    return pq.ParquetFile(catalog / "versions" / version_id / "index.parquet").read().to_pylist()


def shard_files(catalog: Path, version_id: str) -> list[Path]:
    return [catalog / s["path"] for s in manifest(catalog, version_id)["shards"]]


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under a catalog except commit records and scratch space, by relative path."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".tmp" not in p.parts and p.name != "commit.json"
    }


def cli_argv(*args) -> list[str]:
    """The argv of `dsbuild ARGS` run with this interpreter (no dependence on PATH)."""
    return [sys.executable, "-c", "from dsbuild.cli.app import main; main()", *map(str, args)]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=300)


def unprivileged(code: str, *args) -> subprocess.CompletedProcess:
    """Run Python ``code`` where file permissions apply, even for root (DAC override capabilities are
    dropped from the bounding set), so permission-denied paths are tested on any CI machine."""
    import os
    import shutil

    import pytest

    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: permissions cannot be enforced")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    return subprocess.run(
        [*prefix, sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300
    )


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid``."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def with_index(catalog: Path, version_id: str, edit, older: tuple[str, ...] = (), remove: bool = False) -> str:
    """A sealed version whose index is ``edit(table)`` of this one's, re-pinned; returns its id. ``older``:
    what a dsbuild from before BLAKE3 was recorded left out — "index" (the ``blake3`` column), "shards"
    (each shard's ``blake3``). ``remove``: the original version goes (so the new one is the newest)."""
    import shutil
    from dataclasses import replace

    import pyarrow as pa

    from dsbuild.core.hashing import sha256_bytes
    from dsbuild.lineage.catalog import Catalog
    from dsbuild.lineage.manifest import FilePin

    cat = Catalog.open(catalog)
    m = cat.manifest(version_id)
    table = edit(cat.index(version_id))
    schema, shards = m.schema, m.shards
    if "index" in older:
        table = table.drop_columns(["blake3"])
        schema = {**m.schema, "index_columns": [c for c in m.schema["index_columns"] if c != "blake3"]}
    if "shards" in older:
        shards = tuple(replace(s, blake3=None) for s in m.shards)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", store_schema=False)
    data = sink.getvalue().to_pybytes()
    new = replace(
        m, schema=schema, shards=shards, index=FilePin(m.index.path, sha256_bytes(data), m.index.rows, len(data))
    )
    vdir = Path(catalog) / "versions" / new.version_id
    vdir.mkdir()
    (vdir / m.index.path).write_bytes(data)
    shutil.copy(Path(catalog) / "versions" / version_id / m.sessions.path, vdir / m.sessions.path)
    (vdir / "manifest.json").write_bytes(new.to_bytes())
    if remove:
        shutil.rmtree(Path(catalog) / "versions" / version_id)
    return new.version_id


def as_older_version(
    catalog: Path, version_id: str, remove: bool = False, older: tuple[str, ...] = ("index", "shards")
) -> str:
    """The version as a dsbuild from before BLAKE3 was recorded wrote it (``older``: see ``with_index``)."""
    return with_index(catalog, version_id, lambda table: table, older=older, remove=remove)


def lose_a_frames_tail(clip: bytes) -> bytes:
    """``clip`` with the last three quarters of its middle video packet zero-filled (a torn write, a bad
    sector): damage FFmpeg conceals and decodes on from. Placed by the packet table, not by file offsets:
    encoded bytes differ between CPUs (swscale's SIMD paths round differently), and bit flips at fixed
    offsets were caught in only 8 of 20 random clips, as CABAC decodes random bits without complaint."""
    import io

    import av

    with av.open(io.BytesIO(clip)) as c:
        packets = [(p.pos, p.size) for p in c.demux(video=0) if p.size]
    pos, size = packets[len(packets) // 2]
    data = bytearray(clip)
    data[pos + size // 4 : pos + size] = bytes(size - size // 4)
    return bytes(data)

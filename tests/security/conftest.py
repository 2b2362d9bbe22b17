"""The red team's catalogs: one small real catalog, and copies of it forged the way an attacker who can
edit a catalog and re-pin it would (every hash, the index and the manifest consistent with the edit), so
only dsbuild's own checks stand between the edit and a user. Session-scoped: each forged case is made
once and read by every command that reads a catalog (tests copy one before anything writes into it)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from tests.validators.support import reseal, write_moving_session

BLOCK = 512


def retar(header: bytes, **fields) -> bytes:
    """A 512-byte tar header with ``fields`` replaced (name, mode, size, type, linkname: as the raw bytes
    or values tar would hold) and its checksum recomputed, as a forger would."""
    h = bytearray(header)
    if "name" in fields:
        h[0:100] = fields["name"].encode().ljust(100, b"\0")
    if "mode" in fields:
        h[100:108] = b"%07o\0" % fields["mode"]
    if "size" in fields:
        h[124:136] = b"%011o\0" % fields["size"]
    if "type" in fields:
        h[156:157] = fields["type"]
    if "linkname" in fields:
        h[157:257] = fields["linkname"].encode().ljust(100, b"\0")
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _first_header(**fields):
    """The edit of shard 0's first member header (the first sample's ``.json``)."""

    def edit(n: int, data: bytes) -> bytes:
        return data if n else retar(data[:BLOCK], **fields) + data[BLOCK:]

    return edit


def _member_ends(data: bytes) -> list[int]:
    """Where each member of a tar ends (its padding included), in order, up to the end-of-archive blocks."""
    out, pos = [], 0
    while data[pos : pos + BLOCK].strip(b"\0"):
        size = int(data[pos + 124 : pos + 135], 8)
        pos += BLOCK + size + (-size % BLOCK)
        out.append(pos)
    return out


def _padded(data: bytes) -> bytes:
    end = len(data) + 2 * BLOCK
    return data + b"\0" * (2 * BLOCK + (-end % (20 * BLOCK)))


def _truncated(n: int, data: bytes) -> bytes:
    """Shard 0 cut after its first sample (six members), with tar's end padding: a complete-looking,
    shorter tar, while the index still lists every sample the shard held."""
    return _padded(data[: _member_ends(data)[5]]) if n == 0 else data


def _hidden_in_padding(n: int, data: bytes) -> bytes:
    """A member ``evil.sh`` written into shard 0's end-of-archive padding (GNU tar with
    --ignore-zeros, and readers that skip zero blocks, extract it)."""
    if n:
        return data
    end = _member_ends(data)[-1]
    evil = retar(data[:BLOCK], name="evil.sh", size=3, mode=0o755) + b"id\n".ljust(BLOCK, b"\0")
    return data[:end] + evil + data[end + len(evil) :]


# Each forged shard case: what shard 0's bytes become. All keep every payload (sample hashes unchanged).
SHARD_CASES = {
    "dotdot_name": _first_header(name="../../../x.json"),
    "absolute_name": _first_header(name="/tmp/dsbuild-redteam-x.json"),
    "symlink": _first_header(type=b"2", linkname="/etc/passwd", size=0),
    "hardlink": _first_header(type=b"1", linkname="/etc/passwd", size=0),
    "fifo": _first_header(type=b"6", size=0),
    "setuid": _first_header(mode=0o4755),
    "setgid": _first_header(mode=0o2644),
    "huge_size": _first_header(size=8_000_000_000),
    "truncated": _truncated,
    "hidden_in_padding": _hidden_in_padding,
}


def restat(cat: Path, vid: str) -> str:
    """The version with its manifest's statistics made to agree with its shards and index, as a careful
    forger leaves them (``verify`` checks them); returns the new id (the old version is removed)."""
    import pyarrow.compute as pc

    catalog = Catalog.open(cat)
    m = catalog.manifest(vid)
    index = catalog.index(vid, ["frames", "t_start", "t_end"])
    seconds = pc.sum(pc.subtract(index["t_end"], index["t_start"])).as_py() or 0.0
    stats = replace(
        m.stats,
        bytes=sum(s.bytes for s in m.shards),
        frames=pc.sum(index["frames"]).as_py() or 0,
        hours=round(seconds / 3600, 6),
    )
    new = replace(m, stats=stats)
    if new.version_id == vid:
        return vid
    shutil.copytree(cat / "versions" / vid, cat / "versions" / new.version_id)
    (cat / "versions" / new.version_id / "manifest.json").write_bytes(new.to_bytes())
    shutil.rmtree(cat / "versions" / vid)
    return new.version_id


@pytest.fixture(scope="session")
def base_catalog(tmp_path_factory) -> tuple[Path, str]:
    """(catalog, version id): two small sessions of 4 s (two players) cut into 1 s clips, a few to a
    shard, with a split set ``main`` (train/val by player)."""
    root = tmp_path_factory.mktemp("redteam")
    for i in range(2):
        write_moving_session(root / "captures", f"s{i}", "Kart", f"p-{i}", seconds=4.0, seed=i, size=(64, 48))
    r = convert(
        root / "captures",
        root / "catalog",
        ConvertConfig(format="webdataset", clip_seconds=1.0, shard_size=65_536),
        executor=ExecutorSpec(workers=1),
    )
    return root / "catalog", r.version_id


@pytest.fixture(scope="session")
def forged(base_catalog, tmp_path_factory):
    """``forged(case)``: (catalog, version id) of a copy of the base catalog with shard 0 forged as
    ``SHARD_CASES[case]`` (or ``edit(key, members)`` of samples, for ``forged(name, members=edit)``),
    re-pinned; made once per case."""
    made: dict[str, tuple[Path, str]] = {}

    def make(case: str, members=None) -> tuple[Path, str]:
        if case not in made:
            cat = tmp_path_factory.mktemp(f"forged-{case}") / "catalog"
            shutil.copytree(base_catalog[0], cat)
            vid = reseal(cat, base_catalog[1], members, None if members else SHARD_CASES[case])
            made[case] = (cat, restat(cat, vid))
        return made[case]

    return make

"""Array members are read by their headers: a forged sample whose ``actions.npy`` is a valid big-endian
float64 or Fortran-order array (hashes re-pinned) is a damaged sample for the loader (counted as corrupt,
never delivered as float32 garbage) and for ``validate`` at its default level; nothing is converted."""

from __future__ import annotations

import io
import re
import shutil

import numpy as np
import pytest

from dsbuild.export import TOOLS
from dsbuild.formats.sample import npy_bytes, npy_problem
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import BAD_ARRAY, check_shards, verify
from dsbuild.loader import Loader
from tests.cli.clitools import run
from tests.security.conftest import restat
from tests.security.driver import drive
from tests.validators.support import reseal


def _fortran(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asfortranarray(a), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


REWRITE = {
    "big_endian_float64": lambda a: npy_bytes(a.astype(">f8")),
    "big_endian_float32": lambda a: npy_bytes(a.astype(">f4")),
    "fortran_order": _fortran,
}


def _victim(rewrite):
    """An edit of the first sample with more than one control: its actions array rewritten."""
    hit = {}

    def edit(key, members):
        a = np.load(io.BytesIO(dict(members)["actions.npy"]))
        if hit or a.shape[1] < 2 or a.shape[0] < 2:
            return members
        hit["key"] = key
        return [(ext, rewrite(a) if ext == "actions.npy" else p) for ext, p in members]

    return edit, hit


@pytest.fixture(scope="session")
def forged_arrays(forged):
    out = {}
    for name, rewrite in REWRITE.items():
        edit, hit = _victim(rewrite)
        out[name] = (*forged(f"array-{name}", members=edit), hit["key"])
    return out


@pytest.mark.parametrize("case", sorted(REWRITE))
def test_the_loader_counts_an_array_of_another_dtype_or_order_as_corrupt(case, forged_arrays):
    cat, _, key = forged_arrays[case]
    for checking in ("none", "sample"):
        loader = Loader(str(cat), decode="bytes", batch_size=2, seed=3, verify=checking)
        delivered = [k for b in loader for k in b["keys"]]
        assert key not in delivered
        assert loader.stats()["corrupt"] == 1 and loader.stats()["corrupt_keys"][0].startswith(key), loader.stats()
        assert "actions.npy is " in loader.stats()["corrupt_keys"][0]


# Every way out and what it does with a catalog whose sample holds such an array: refused naming shard,
# sample and member (3); verify reports it (1). One array check (formats.shards.array_problems) for all.
WAYS_OUT = {
    **{f"export-{tool}": (("{out}", "--to", tool), 3) for tool in TOOLS},
    "verify": ((), 1),
    "shards": ((), 3),
    "pull": (("{out}",), 3),
}


@pytest.fixture(scope="module")
def ways_out(forged_arrays, tmp_path_factory):
    """{(case, way out): (its result, where it wrote)}: every way out over every forged case, in one driver."""
    out = tmp_path_factory.mktemp("arrays-out")
    plan = [
        (case, name, [name.split("-")[0], str(cat), *(a.format(out=out / f"{case}-{name}") for a in args)])
        for case, (cat, _, _) in forged_arrays.items()
        for name, (args, _) in WAYS_OUT.items()
    ]
    return {
        (case, name): (got, out / f"{case}-{name}") for (case, name, _), got in zip(plan, drive([a for *_, a in plan]))
    }


def _shard_of(cat, vid, key) -> str:
    return next(r["shard"] for r in Catalog.open(cat).index(vid, ["key", "shard"]).to_pylist() if r["key"] == key)


@pytest.mark.parametrize("case", sorted(REWRITE))
def test_every_export_refuses_it_naming_shard_sample_and_member(case, forged_arrays, ways_out):
    """wids linked such a tar and mds, litdata and dali copied the array on (exit 0); hf failed mid-write."""
    cat, vid, key = forged_arrays[case]
    shard = _shard_of(cat, vid, key)
    for tool in TOOLS:
        got, wrote = ways_out[case, f"export-{tool}"]
        errors = [x for x in got["stderr"].splitlines() if x.startswith("error:")]
        assert got["exit"] == 3 and len(errors) == 1, (tool, got)
        assert f"{shard}: {key}: actions.npy is " in errors[0], (tool, errors)
        assert not wrote.exists() or not any(wrote.rglob("*.tar")), tool
    if case == "big_endian_float64":  # the case, through the executable
        p = run("export", cat, wrote.parent / "wids-cli", "--to", "wids", check=3)
        assert f"{shard}: {key}: actions.npy is >f8" in p.stderr and not (wrote.parent / "wids-cli").exists()


@pytest.mark.parametrize("case", sorted(REWRITE))
def test_verify_shards_and_pull_agree_with_the_loader_and_the_exports(case, forged_arrays, ways_out):
    """They passed such a catalog (exit 0; pull copied it on) while the loader and the exports refused it."""
    cat, vid, key = forged_arrays[case]
    shard = _shard_of(cat, vid, key)
    assert {name: ways_out[case, name][0]["exit"] for name in ("verify", "shards", "pull")} == {
        "verify": 1,
        "shards": 3,
        "pull": 3,
    }
    found = [p for p in verify(Catalog.open(cat), vid).problems if p["problem"] == BAD_ARRAY]
    assert [(p["shard"], p["sample"]) for p in found] == [(shard, key)] and "actions.npy is " in found[0]["detail"]
    for name in ("shards", "pull"):
        got = ways_out[case, name][0]
        errors = [x for x in got["stderr"].splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and f"{shard}: {key}: actions.npy is " in errors[0], (name, got)
    assert not any(ways_out[case, "pull"][1].rglob("*.tar")), "pull copied the shard on"


@pytest.mark.parametrize("case", sorted(REWRITE))
def test_validate_at_its_default_level_rejects_it(case, forged_arrays):
    cat, _, key = forged_arrays[case]
    p = run("validate", cat, check=1)
    assert key in p.stdout + p.stderr


@pytest.fixture(scope="module")
def forged_parquet(parquet_catalog, tmp_path_factory):
    """(catalog, version id, key): a copy of the Parquet catalog, re-pinned, whose first sample's arrays
    lost their last frame. A Parquet column's stored type fixes dtype and order, so a shape is what a
    forger can change; the row still frames (its frames, arrays and timestamps agree with each other)."""
    cat = tmp_path_factory.mktemp("forged-parquet") / "catalog"
    shutil.copytree(parquet_catalog[0], cat)
    hit = {}

    def edit(key, members):
        if hit:
            return members
        hit["key"] = key
        return [(ext, npy_bytes(np.load(io.BytesIO(p))[:-1]) if ext.endswith(".npy") else p) for ext, p in members]

    vid = restat(cat, reseal(cat, parquet_catalog[1], edit))
    return cat, vid, hit["key"]


def test_a_parquet_sample_whose_arrays_disagree_with_its_index_is_damaged(forged_parquet):
    """Read from the array columns alone (``ParquetReader.array_members``): verify names shard, sample and
    member, ``shards`` refuses it (exit 3) and the loader counts it corrupt."""
    cat, vid, key = forged_parquet
    shard = _shard_of(cat, vid, key)
    found = [p for p in verify(Catalog.open(cat), vid).problems if p["problem"] == BAD_ARRAY]
    assert [(p["shard"], p["sample"]) for p in found] == [(shard, key)]
    shapes = re.fullmatch(r"actions\.npy is <f4 \[(\d+), \d+\], expected <f4 \[(\d+), \d+\]", found[0]["detail"])
    assert shapes and int(shapes[1]) == int(shapes[2]) - 1, found
    p = run("shards", cat, check=3)
    assert f"{shard}: {key}: actions.npy is <f4 " in p.stderr
    loader = Loader(str(cat), decode="bytes", batch_size=2, seed=3)
    assert key not in [k for b in loader for k in b["keys"]]
    assert loader.stats()["corrupt"] == 1 and loader.stats()["corrupt_keys"][0].startswith(key)


def test_a_header_is_parsed_only_when_it_is_not_the_writers():
    a = np.arange(12, dtype=np.float32).reshape(6, 2)
    assert npy_problem(npy_bytes(a), "<f4", (6, 2)) is None
    assert npy_problem(npy_bytes(a), "<f4", (6, 3)) == "is <f4 [6, 2], expected <f4 [6, 3]"
    assert "fortran" in npy_problem(_fortran(a), "<f4", (6, 2))
    assert npy_problem(npy_bytes(a)[:-4], "<f4", (6, 2)).startswith("holds 44 bytes")
    claims = b"\x93NUMPY\x01\x00" + (60000).to_bytes(2, "little") + b" " * 200
    assert "over the limit" in npy_problem(claims, "<f4", (6, 2))
    assert npy_problem(b"PK\x03\x04" + b"\0" * 100, "<f4", (6, 2)).startswith("not a .npy")


def test_the_right_array_under_another_header_is_no_damage_anywhere(forged):
    """A .npy 2.0 header (another numpy's writer) over the same <f4 C-order array is not the writer's, so
    it is parsed (not refused): verify, the shard check and the loader all accept the sample."""

    def edit(key, members):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.load(io.BytesIO(dict(members)["actions.npy"])), version=(2, 0))
        return [(ext, buf.getvalue() if ext == "actions.npy" else p) for ext, p in members]

    cat, vid = forged("array-npy-2.0", members=edit)
    assert not [p for p in verify(Catalog.open(cat), vid).problems if p["problem"] == BAD_ARRAY]
    check_shards(Catalog.open(cat), vid)
    loader = Loader(str(cat), decode="bytes", batch_size=2, seed=3)
    assert sum(len(b["keys"]) for b in loader) == Catalog.open(cat).manifest(vid).stats.samples
    assert loader.stats()["corrupt"] == 0

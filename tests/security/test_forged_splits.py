"""Splits go through the version's index: ``shards --split`` and ``export --split`` map a split's keys to
shards the way the loader does, and refuse, naming the keys, a split file (re-pinned by its forger) that
names keys the version lacks or puts a key in two splits; a forged ``shard`` column changes nothing."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from dsbuild.core.hashing import sha256_bytes
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.splitsets import SplitManifest, open_split_set, publish_split_set
from dsbuild.loader import Loader
from dsbuild.split import SplitOptions, make_split
from dsbuild.split.files import table_bytes
from tests.cli.clitools import run, run_json
from tests.security.test_forged_shards import one_line


def reforge(cat, vid: str, edit) -> None:
    """Split set ``main`` with its tables ``edit(tables)``-ed in place, every file and hash re-pinned."""
    catalog = Catalog.open(cat)
    s = open_split_set(catalog, vid, "main")
    tables = {sp: s.table(sp) for sp in s.splits}
    edit(tables)
    doc = {k: v for k, v in s.manifest.to_json().items() if k != "hash"}
    files = {}
    for sp in s.splits:
        files[f"{sp}.parquet"] = data = table_bytes(tables[sp])
        doc["splits"][sp].update(sha256=sha256_bytes(data), bytes=len(data))
    sealed = SplitManifest.from_json({**doc, "hash": ""}, "forged").sealed()
    publish_split_set(catalog, vid, "main", files, sealed, force=True)


@pytest.fixture(scope="session")
def split_catalog(base_catalog, tmp_path_factory):
    cat = tmp_path_factory.mktemp("splits") / "catalog"
    shutil.copytree(base_catalog[0], cat)
    make_split(cat, base_catalog[1], "main", SplitOptions(ratios="train=0.5,val=0.5"))
    return cat, base_catalog[1]


@pytest.fixture
def split_copy(split_catalog, tmp_path):
    cat = shutil.copytree(split_catalog[0], tmp_path / "catalog")
    return cat, split_catalog[1]


def _set(t: pa.Table, name: str, values) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))


def test_an_edited_shard_column_changes_nothing(split_copy):
    cat, vid = split_copy
    before = run_json("shards", cat, "--split", "main/train")["shards"]
    reforge(
        cat,
        vid,
        lambda ts: ts.update(train=_set(ts["train"], "shard", ["shards/00/nothing.tar"] * ts["train"].num_rows)),
    )
    after = run_json("shards", cat, "--split", "main/train")["shards"]
    assert after == before and sum(s["in_split"] for s in after) == len(
        [k for b in Loader(str(cat), split="main/train", decode="bytes") for k in b["keys"]]
    )


def test_a_key_the_version_lacks_is_refused_by_shards_and_export(split_copy, tmp_path):
    cat, vid = split_copy
    ghosts = [f"ghost__{i:06d}" for i in range(5)]

    def add(ts):
        t = ts["train"]
        extra = t.slice(0, 1)
        for g in ghosts:
            ts["train"] = t = pa.concat_tables([t, _set(extra, "key", [g])])

    reforge(cat, vid, add)
    for args in (
        ("shards", cat, "--split", "main/train"),
        ("export", cat, tmp_path / "x", "--to", "wids", "--split-set", "main"),
    ):
        line = one_line(run(*args, check=3))
        assert "5 key(s) are not samples of the version" in line and "'ghost__000000'" in line and "..." in line
    assert not (tmp_path / "x").exists()


def test_a_key_in_two_splits_is_refused_naming_it(split_copy, tmp_path):
    cat, vid = split_copy
    moved = []

    def both(ts):
        row = ts["train"].slice(0, 1)
        moved.append(row["key"][0].as_py())
        ts["val"] = pa.concat_tables([ts["val"], _set(row, "split", ["val"]).cast(ts["val"].schema)])

    reforge(cat, vid, both)
    for args in (
        ("export", cat, tmp_path / "x", "--to", "wids", "--split-set", "main"),
        ("export", cat, tmp_path / "y", "--to", "energon", "--split", "main/val"),
        ("shards", cat, "--split", "main/train"),
    ):
        line = one_line(run(*args, check=3))
        assert "1 key(s) lie in two splits" in line and moved[0] in line

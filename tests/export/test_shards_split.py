"""`dsbuild shards --split NAME/SPLIT` hands a plain webdataset reader exactly the split's samples: the
catalog's shards when each holds that split alone, a refusal naming --materialize when one is shared,
and with --materialize DIR the split's own tars."""

from __future__ import annotations

import json

import pytest

from dsbuild.lineage.catalog import Catalog
from tests.cli.clitools import run, run_json


@pytest.fixture(scope="module")
def shared(export_catalog, expected) -> str:
    """A split of set main some of whose shards hold other splits' samples."""
    cat, vid = export_catalog
    index = Catalog.open(cat).index(vid, ["key", "shard"])
    shard_of = dict(zip(index["key"].to_pylist(), index["shard"].to_pylist()))
    splits_of: dict[str, set[str]] = {}
    for split, keys in expected.items():
        for k in keys:
            splits_of.setdefault(shard_of[k], set()).add(split)
    mixed = sorted({s for splits in splits_of.values() if len(splits) > 1 for s in splits})
    assert mixed, "the fixture's shards must hold samples of several splits"
    return mixed[0]


def test_a_split_sharing_a_shard_is_refused_with_the_way_to_read_it(export_catalog, shared):
    cat, _ = export_catalog
    split = shared
    p = run("shards", cat, "--split", f"main/{split}", check=2)
    assert p.stdout == ""
    line = p.stderr.splitlines()[0]
    assert line.startswith("error: --split main/") and "--materialize DIR" in line


def test_materialized_tars_read_by_webdataset_hold_exactly_the_split(export_catalog, expected, shared, tmp_path):
    wds = pytest.importorskip("webdataset")
    cat, _ = export_catalog
    split = shared
    keys = sorted(expected[split])
    dest = tmp_path / "tars"
    listed = run("shards", f"{cat}@v1", "--split", f"main/{split}", "--materialize", dest).stdout.split()
    assert listed and all(p.startswith(str(dest.resolve())) for p in listed)
    assert [s["__key__"] for s in wds.WebDataset(listed, shardshuffle=False)] == keys
    doc = run_json("shards", cat, "--split", f"main/{split}", "--materialize", dest)  # (the export, reused)
    assert [s["path"] for s in doc["shards"]] == listed
    assert sum(s["nsamples"] for s in doc["shardlist"]) == len(keys)
    assert json.loads((dest / f"{split}.json").read_text())["wids_version"] == 1


def test_materialize_without_a_split_is_a_usage_error(export_catalog, tmp_path):
    cat, _ = export_catalog
    p = run("shards", cat, "--materialize", tmp_path / "x", check=2)
    assert "--materialize needs --split" in p.stderr and not (tmp_path / "x").exists()

"""HF ``datasets`` pointed at a catalog folder: the dataset card dsbuild keeps at the root makes
``load_dataset(CATALOG)`` give the newest version's samples (Parquet shards), or refuse naming
``dsbuild export --to hf`` (WebDataset shards), never the split sets' index rows or two versions at once."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.card import CARD, MARK
from dsbuild.lineage.catalog import Catalog
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from tests.cli.clitools import run_json

from .peers import peer


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory):
    """HF offline, its home and caches in a private folder."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("hf-home")
        for name, value in (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_HOME", home)):
            mp.setenv(name, str(value))
        mp.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
        yield


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory) -> tuple[Path, str, str]:
    """(Parquet catalog, older version, newest version): two builds of two tiny sessions, with split set
    main over the older one (its files are Parquet too: what a card-less load picked up)."""
    from dsbuild.split import SplitOptions, make_split

    root = tmp_path_factory.mktemp("hf-catalog")
    specs = [dataclasses.replace(session_spec(3, i, 2.0), video=VideoSpec(64, 48, 30, 30)) for i in range(2)]
    generate(root / "caps", sessions=2, seconds=2.0, seed=3, specs=specs)
    cat = root / "catalog"
    vids = [
        convert(
            root / "caps",
            cat,
            ConvertConfig(format="parquet", clip_seconds=seconds, shard_size=1 << 16),
            executor=ExecutorSpec(workers=1),
        ).version_id
        for seconds in (2.0, 1.0)
    ]
    make_split(cat, vids[0], "main", SplitOptions(by="session_id", ratios="train=0.5,val=0.5"))
    return cat, vids[0], vids[1]


def test_load_dataset_on_a_parquet_catalog_gives_the_newest_versions_samples(two_versions, hf_env):
    datasets = peer("datasets")
    cat, older, newest = two_versions
    catalog = Catalog.open(cat)
    assert catalog.versions()[0].version_id == newest
    want = {r["key"]: r["sha256"] for r in catalog.index(newest, ["key", "sha256"]).to_pylist()}
    older_keys = set(catalog.index(older, ["key"])["key"].to_pylist())
    assert older_keys != set(want)  # (the case: the versions hold different samples)
    ds = datasets.load_dataset(str(cat), split="train")
    assert "video" in ds.column_names and "byte_offset" not in ds.column_names  # samples, not index rows
    rows = ds.select_columns(["key", "sha256", "meta"]).to_list()
    assert {r["key"]: r["sha256"] for r in rows} == want and len(rows) == len(want)  # each once, no other version
    assert all(json.loads(r["meta"])["key"] == r["key"] for r in rows)


def test_the_card_changes_no_version_and_verify_and_gc_accept_it(two_versions):
    cat, _, newest = two_versions
    manifest = (cat / "versions" / newest / "manifest.json").read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == newest  # the version id is what its manifest hashes to
    card = (cat / CARD).read_text()
    assert card.splitlines()[:2] == ["---", MARK]
    for shard in json.loads(manifest)["shards"]:
        assert f"    - {shard['path']}\n" in card
    assert run_json("verify", cat)["ok"] is True
    collected = run_json("gc", cat)
    assert collected["shards"] == [] and collected["interrupted_writes"] == [] and (cat / CARD).is_file()


def test_a_version_pulled_into_a_catalog_gets_its_card_too(two_versions, tmp_path):
    from dsbuild.lineage.transfer import transfer

    cat, older, _ = two_versions
    dest = Catalog.open(tmp_path / "copy", create=True)
    transfer(Catalog.open(cat), older, dest)
    card = (tmp_path / "copy" / CARD).read_text()
    assert card.startswith(f"---\n{MARK}\n") and f"`{older}`" in card
    assert all(f"    - {s.path}\n" in card for s in dest.manifest(older).shards)


def test_load_dataset_on_a_webdataset_catalog_fails_naming_the_export(export_catalog, hf_env):
    """HF's webdataset builder infers JSON columns from the first samples: a condition key first seen later
    was dropped, a missing one became null. The card makes the load fail with the way out instead."""
    datasets = peer("datasets")
    cat, _ = export_catalog
    with pytest.raises(ValueError, match="dsbuild export .* --to hf"):
        datasets.load_dataset(str(cat), split="train")


def test_a_users_own_readme_is_left_as_it_is_and_said_so(tmp_path, capfd):
    generate(tmp_path / "caps", sessions=1, seconds=1.0, seed=4)
    cat = tmp_path / "catalog"
    config = ConvertConfig(format="parquet", clip_seconds=1.0)
    convert(tmp_path / "caps", cat, config, executor=ExecutorSpec(workers=1))
    mine = b"# Our kart dataset\n\nNotes by the team.\n"
    (cat / CARD).write_bytes(mine)
    capfd.readouterr()
    convert(tmp_path / "caps", cat, dataclasses.replace(config, clip_seconds=0.5), executor=ExecutorSpec(workers=1))
    assert (cat / CARD).read_bytes() == mine
    err = capfd.readouterr().err
    assert f"{cat}/{CARD} is not a card dsbuild wrote: left as it is" in err
    os.remove(cat / CARD)
    Catalog.open(cat).write_card()  # what the next commit runs
    assert (cat / CARD).read_text().startswith(f"---\n{MARK}\n") and "not a card" not in capfd.readouterr().err

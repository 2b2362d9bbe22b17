"""HF datasets loads the export with its own entry point; the card declares every feature, so a
condition key the first shard lacks survives and videos stay bytes."""

from __future__ import annotations

import json

import pytest

from .conftest import SPLITS
from .peers import check_samples, peer


def test_hf_load_dataset_reads_every_split_with_every_condition_key(exported, expected, hf_offline):
    datasets = peer("datasets")
    root = exported("hf")
    for split in SPLITS:
        ds = datasets.load_dataset(str(root), split=split)
        assert ds.features["mp4"] == datasets.Value("binary")
        rows = list(ds)
        got = {r["key"]: (json.loads(r["json"]), r["mp4"]) for r in rows}
        assert len(got) == len(rows)
        check_samples(got, expected[split])
        for r in rows:  # the flat columns agree with the metadata, every condition key kept
            assert {c["key"]: c["value"] for c in r["conditions"]} == expected[split][r["key"]]["conditions"]
            assert r["title"] == expected[split][r["key"]]["title"]
            assert len(r["actions"]) == r["frames"] and all(len(a) == len(r["controls"]) for a in r["actions"])


def test_hf_streaming_gives_the_same_rows(exported, expected, hf_offline):
    datasets = peer("datasets")
    rows = list(datasets.load_dataset(str(exported("hf")), split="test", streaming=True))
    assert [r["key"] for r in rows] == sorted(expected["test"])
    assert {c["key"] for c in rows[0]["conditions"]} == {"track", "weather", "difficulty", "mode"}


def test_an_empty_split_is_left_out_of_the_card_so_the_others_load(export_catalog, expected, hf_offline, tmp_path):
    """A split set with an empty split (val got no group) used to give a card naming files that do not
    exist: `datasets` then refused to load any split, while the export exited 0."""
    from dsbuild.export import export
    from dsbuild.split import SplitOptions, make_split

    datasets = peer("datasets")
    cat, vid = export_catalog
    make_split(
        cat,
        vid,
        "noval",
        SplitOptions(
            by="player", ratios="train=0.5,val=0.25,test=0.25", pins=[("train", ["p-0", "p-1"]), ("test", ["p-2"])]
        ),
    )
    out = tmp_path / "out"
    export(f"{cat}@{vid}", out, to="hf", split="noval")
    assert "left out" in (out / "README.md").read_text()
    loaded = {s: len(datasets.load_dataset(str(out), split=s)) for s in ("train", "test")}
    assert loaded["train"] > 0 and loaded["test"] > 0


def test_an_interrupted_export_leaves_nothing_datasets_loads(export_catalog, expected, hf_offline, tmp_path):
    """Interrupted after some of train's Parquet files were in place, an export used to leave a folder that
    `datasets` loaded as a smaller train split without an error (no card yet: it globs the files there)."""
    from dsbuild.export import export

    datasets = peer("datasets")
    cat, _ = export_catalog
    out, small = tmp_path / "out", 1 << 16  # the smallest target: train takes several files

    def stop(done: int, total: int) -> None:
        if done > len(expected["test"]):  # test (splits go in name order) and train's first file are written
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(f"{cat}@v1", out, to="hf", split="main", target_bytes=small, progress=stop)
    with pytest.raises(FileNotFoundError):
        datasets.load_dataset(str(out), split="train")
    assert not out.exists()
    r = export(f"{cat}@v1", out, to="hf", split="main", target_bytes=small)
    assert r.files_kept > 0 and len(list((out / "data").glob("train-*.parquet"))) > 1  # it stopped inside train
    assert len(datasets.load_dataset(str(out), split="train")) == len(expected["train"])


def test_a_sample_whose_members_the_version_vouches_for_but_do_not_parse_is_exit_3(export_catalog, tmp_path):
    """A forged catalog's sample whose .npy header declares 2^62 x 4 floats (its hashes recomputed): the
    hf export named it with exit 2, a usage error, for data the catalog vouches for."""
    import shutil

    from tests.helpers import cli
    from tests.validators.support import reseal

    cat = tmp_path / "cat"
    shutil.copytree(export_catalog[0], cat)
    victim = {}

    def forge(key, members):
        if victim:
            return members
        victim["key"] = key
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"
        header += " " * (-(10 + len(header) + 1) % 64) + "\n"
        npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
        return [(ext, npy + p[128:] if ext == "actions.npy" else p) for ext, p in members]

    reseal(cat, export_catalog[1], forge)
    p = cli("export", cat, tmp_path / "out", "--to", "hf")
    assert p.returncode == 3 and f"{victim['key']}: actions.npy is <f4 [4611686018427387904, 4]" in p.stderr, p.stderr

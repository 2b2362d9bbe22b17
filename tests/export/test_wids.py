"""wids reads each split's shard list, in place or through its cache."""

from __future__ import annotations

import json

from .conftest import SPLITS
from .peers import check_samples, peer


def test_wids_reads_every_split_of_the_split_set(exported, expected, tmp_path):
    wids = peer("wids")
    root = exported("wids")
    for split in SPLITS:
        ds = wids.ShardListDataset(str(root / f"{split}.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
        got = {}
        for i in range(len(ds)):
            s = ds[i]
            got[s["__key__"]] = (json.loads(s[".json"].read()), s[".mp4"].read())
        assert len(got) == len(ds)
        check_samples(got, expected[split])
        assert list(got) == sorted(got), split  # ds[i] is the split's i-th sample, as in the other exports


def test_wids_shard_lists_never_name_a_shard_holding_another_splits_samples(exported, export_catalog):
    """wids reads whole tars: a catalog shard shared by two splits is written anew, not linked."""
    root = exported("wids")
    for split in SPLITS:
        doc = json.loads((root / f"{split}.json").read_text())
        assert doc["wids_version"] == 1
        for entry in doc["shardlist"]:
            assert entry["url"].startswith(f"shards/{split}/")
    assert any(not p.is_symlink() for p in (root / "shards").rglob("*.tar"))


def test_a_split_mixing_linked_and_written_tars_reads_in_key_order(tmp_path):
    """Linked catalog shards were listed before the tars written for the split's other samples: wids's
    ds[i] was not the split's i-th sample, as it is in every other export."""
    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.core.executor import ExecutorSpec
    from dsbuild.export import export
    from dsbuild.samples.synthetic import generate
    from dsbuild.split import SplitOptions, load_split, make_split

    wids = peer("wids")
    generate(tmp_path / "caps", sessions=6, seconds=2.0, seed=7)
    r = convert(
        tmp_path / "caps",
        tmp_path / "cat",
        ConvertConfig(clip_seconds=1.0, shard_size=400_000),
        executor=ExecutorSpec(workers=1),
    )
    make_split(
        tmp_path / "cat", r.version_id, "main", SplitOptions(by="session_id", ratios="train=0.5,val=0.25,test=0.25")
    )
    export(f"{tmp_path / 'cat'}@{r.version_id}", tmp_path / "out", to="wids", split="main")
    linked = written = 0
    for split in ("train", "val", "test"):
        want = load_split(tmp_path / "cat", r.version_id, f"main/{split}").column("key").to_pylist()
        if not want:
            continue
        ds = wids.ShardListDataset(
            str(tmp_path / "out" / f"{split}.json"), cache_dir=str(tmp_path / "cache"), transformations=[]
        )
        assert [ds[i]["__key__"] for i in range(len(ds))] == sorted(want), split
        tars = [
            tmp_path / "out" / e["url"]
            for e in json.loads((tmp_path / "out" / f"{split}.json").read_text())["shardlist"]
        ]
        linked += sum(t.is_symlink() for t in tars)
        written += sum(not t.is_symlink() for t in tars)
    assert linked and written  # (the case: both kinds in the splits)

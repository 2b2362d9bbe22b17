"""wids reads each split's shard list, in place or through its cache."""

from __future__ import annotations

import json

from .conftest import SPLITS
from .peers import check_samples, peer


def test_wids_reads_every_split_of_the_split_set(exported, expected, tmp_path):
    wids = peer("wids")
    root = exported("wids")
    for split in SPLITS:
        ds = wids.ShardListDataset(str(root / f"{split}.json"), cache_dir=str(tmp_path / "cache"),
                                   transformations=[])
        got = {}
        for i in range(len(ds)):
            s = ds[i]
            got[s["__key__"]] = (json.loads(s[".json"].read()), s[".mp4"].read())
        assert len(got) == len(ds)
        check_samples(got, expected[split])


def test_wids_shard_lists_never_name_a_shard_holding_another_splits_samples(exported, export_catalog):
    """wids reads whole tars: a catalog shard shared by two splits is written anew, not linked."""
    root = exported("wids")
    for split in SPLITS:
        doc = json.loads((root / f"{split}.json").read_text())
        assert doc["wids_version"] == 1
        for entry in doc["shardlist"]:
            assert entry["url"].startswith(f"shards/{split}/")
    assert any(not p.is_symlink() for p in (root / "shards").rglob("*.tar"))

"""LitData's StreamingDataset reads each split's chunks in place."""

from __future__ import annotations

from .conftest import SPLITS
from .peers import check_samples, peer


def test_litdata_streaming_dataset_reads_every_split(exported, expected):
    litdata = peer("litdata")
    root = exported("litdata")
    for split in SPLITS:
        ds = litdata.StreamingDataset(input_dir=str(root / split))
        rows = [ds[i] for i in range(len(ds))]
        got = {r["__key__"]: (r["json"], bytes(r["mp4"])) for r in rows}
        assert len(got) == len(rows)
        check_samples(got, expected[split])
    assert not any(p.name.startswith("chunk") for p in root.iterdir())  # nothing copied beside the splits


def test_a_split_published_again_at_the_same_url_is_not_read_from_litdatas_stale_cache(exported, expected, tmp_path):
    """LitData caches a remote dataset's chunks under its index's ``updated_at``; our index had none, so
    every publish at one URL shared a cache and a second split published there was read as the first."""
    import shutil

    litdata = peer("litdata")
    root, published, cache = exported("litdata"), tmp_path / "published", tmp_path / "cache"
    for split in SPLITS:
        shutil.rmtree(published, ignore_errors=True)
        shutil.copytree(root / split, published)  # "export locally, then copy the folder"
        ds = litdata.StreamingDataset(input_dir=f"local:{published}", cache_dir=str(cache))
        assert {ds[i]["__key__"] for i in range(len(ds))} == set(expected[split]), split

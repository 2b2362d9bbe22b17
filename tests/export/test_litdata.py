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

"""Megatron-Energon reads the export with its own entry points, every split, every sample once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

from dsbuild.export import export

from .conftest import SPLITS, TARGET
from .peers import check_samples, peer


def _read(root: Path, part: str) -> dict[str, tuple[dict, bytes]]:
    energon = peer("megatron.energon")

    @energon.stateless
    def cook(raw: dict) -> dict:
        return {"key": raw["__key__"], "json": raw["json"], "mp4": raw["mp4"]}

    class Encoder(energon.DefaultTaskEncoder):
        decoder = None  # raw bytes for every part
        cookers: ClassVar[list] = [energon.Cooker(cook)]

        def batch(self, samples):
            return samples

    wc = energon.WorkerConfig.default_worker_config(0)
    if part == "train":
        ds = energon.get_train_dataset(
            root,
            split_part=part,
            batch_size=1,
            worker_config=wc,
            task_encoder=Encoder(),
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
    else:
        ds = energon.get_val_dataset(root, split_part=part, batch_size=1, worker_config=wc, task_encoder=Encoder())
    got = [s for batch in energon.get_loader(ds) for s in batch]
    out = {s["key"]: (json.loads(s["json"]), s["mp4"]) for s in got}
    assert len(out) == len(got), "a sample was delivered twice"
    return out


def test_energon_reads_every_split_of_the_split_set(exported, expected):
    root = exported("energon")
    for part in SPLITS:
        check_samples(_read(root, part), expected[part])


def test_energon_export_shares_every_shard_byte_with_the_catalog(exported, export_catalog):
    cat, _vid = export_catalog
    tars = sorted((exported("energon") / "shards").rglob("*.tar"))
    assert tars and all(t.is_symlink() and not os.path.isabs(os.readlink(t)) for t in tars)
    assert {t.resolve().parent.parent for t in tars} == {(cat / "shards").resolve()}
    assert {t.name for t in tars} == {s.name for s in (cat / "shards").rglob("*.tar")}


def test_energon_reads_a_parquet_version_through_written_tars(export_parquet_catalog, expected, tmp_path):
    cat, _ = export_parquet_catalog
    export(f"{cat}@v1", tmp_path / "e", to="energon", split="main/val", target_bytes=TARGET)
    assert not any(p.is_symlink() for p in (tmp_path / "e").rglob("*"))
    check_samples(_read(tmp_path / "e", "val"), expected["val"])

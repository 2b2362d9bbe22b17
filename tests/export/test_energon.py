"""Megatron-Energon reads the export with its own entry points: every split, every sample once, through the
typed config (no cooker) and the crude one; ``len()`` and the partition over ranks are the split's; the
``.nv-meta`` files are what ``energon prepare`` writes for the same tars; ``energon info`` and ``lint`` pass."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import ClassVar

import pytest

from dsbuild.export import export
from dsbuild.export.energon import USER_FILES
from tests.cli.clitools import run

from .conftest import SPLITS, TARGET
from .peers import check_samples, peer


def _dataset(energon, root: Path, part: str, wc, **kw):
    """Energon's dataset of one split part (the training entry point for train), in file order."""
    if part == "train":
        return energon.get_train_dataset(
            root,
            split_part=part,
            batch_size=1,
            worker_config=wc,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
            **kw,
        )
    return energon.get_val_dataset(root, split_part=part, batch_size=1, worker_config=wc, **kw)


def _samples(energon, ds) -> list:
    # (the savable loader without its gc.collect() every few batches: in a test process holding the
    # suite's objects each costs a second)
    return [s for batch in energon.get_savable_loader(ds, gc_collect_every_n_steps=0) for s in batch]


def _unbatched(energon, encoder=None):
    class Unbatched(encoder or energon.DefaultTaskEncoder):
        def batch(self, samples):
            return samples

    return Unbatched()


def _one_rank():
    energon = peer("megatron.energon")
    return energon.WorkerConfig(rank=0, world_size=1, num_workers=0)


def _read_crude(root: Path, part: str) -> dict[str, tuple[dict, bytes]]:
    energon = peer("megatron.energon")

    @energon.stateless
    def cook(raw: dict) -> dict:
        return {"key": raw["__key__"], "json": raw["json"], "mp4": raw["mp4"]}

    class Encoder(energon.DefaultTaskEncoder):
        decoder = None  # raw bytes for every part
        cookers: ClassVar[list] = [energon.Cooker(cook)]

    ds = _dataset(
        energon, root, part, _one_rank(), task_encoder=_unbatched(energon, Encoder), dataset_config="crude.yaml"
    )
    got = _samples(energon, ds)
    out = {s["key"]: (json.loads(s["json"]), s["mp4"]) for s in got}
    assert len(out) == len(got), "a sample was delivered twice"
    return out


def test_energon_reads_every_split_through_the_crude_config(exported, expected):
    root = exported("energon")
    for part in SPLITS:
        check_samples(_read_crude(root, part), expected[part])


def test_the_typed_config_gives_clip_samples_without_a_cooker(exported, expected):
    energon = peer("megatron.energon")
    from megatron.energon.av import AVDecoder

    from dsbuild.export.energon_sample import ClipSample

    got = _samples(
        energon, _dataset(energon, exported("energon"), "val", _one_rank(), task_encoder=_unbatched(energon))
    )
    assert sorted(s.__key__ for s in got) == sorted(expected["val"])
    for s in got:
        assert isinstance(s, ClipSample) and isinstance(s.video, AVDecoder)
        frames = s.meta["clip"]["frames"]
        assert s.controls == s.meta["controls"] and s.text == s.meta["text"]
        assert s.actions.dtype == "float32" and s.actions.shape == (frames, len(s.controls))
        assert s.telemetry.shape == (frames, len(s.telemetry_channels)) and s.timestamps.shape == (frames,)
        assert s.meta["session"]["title"] == expected["val"][s.__key__]["title"]
        assert isinstance(s.events, bytes) and s.events[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame


@pytest.mark.parametrize("world", [1, 2, 3])
def test_len_and_each_ranks_share_are_energons_partition_of_the_split(world, exported, expected):
    energon = peer("megatron.energon")
    from megatron.energon.flavors.webdataset.sharder import Sharder

    root = exported("energon")
    for part in SPLITS:
        n = len(expected[part])
        seen: list[str] = []
        counts = []
        for rank in range(world):
            wc = energon.WorkerConfig(rank=rank, world_size=world, num_workers=0)
            start, end = Sharder.split_samples_to_workers(0, n, wc)  # what Energon gives a rank of n samples
            ds = _dataset(energon, root, part, wc, task_encoder=_unbatched(energon))
            keys = [s.__key__ for s in _samples(energon, ds)]
            assert len(ds) == end - start
            assert len(keys) == end - start, (part, world, rank)
            seen += keys
            counts.append(len(keys))
        assert sorted(seen) == sorted(expected[part])  # each sample once, on one rank
        assert max(counts) - min(counts) <= 1, counts


def test_each_splits_tars_hold_its_samples_alone(exported, expected, export_catalog):
    cat, _vid = export_catalog
    root = exported("energon")
    linked = written = 0
    for part in SPLITS:
        keys = []
        for tar in sorted((root / "shards" / part).glob("*.tar")):
            with tarfile.open(tar) as tf:
                keys += sorted({m.name.split(".", 1)[0] for m in tf})
            if tar.is_symlink():  # a catalog shard of this split's samples only
                assert not os.path.isabs(os.readlink(tar)) and tar.resolve().parent.parent == (cat / "shards").resolve()
                linked += 1
            else:
                written += 1
        assert sorted(keys) == sorted(expected[part])
    assert written  # (the fixture's shards hold samples of several splits)


def test_nv_meta_is_what_energon_prepare_writes_for_the_same_tars(exported, tmp_path):
    peer("megatron.energon")
    import yaml
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    root, copy = exported("energon"), tmp_path / "prepared"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".nv-meta", "*.idx", ".dsbuild-*"))  # links resolved
    meta = root / ".nv-meta"
    tars = list(json.loads((meta / ".info.json").read_bytes())["shard_counts"])
    WebdatasetPreparator.prepare_dataset(
        copy, tars, split_parts_patterns=[(s, f"shards/{s}/") for s in SPLITS], workers=1
    )
    ours, theirs = meta, copy / ".nv-meta"
    assert (ours / ".info.json").read_bytes() == (theirs / ".info.json").read_bytes()
    for tar in tars:
        assert (root / f"{tar}.idx").read_bytes() == (copy / f"{tar}.idx").read_bytes()
    split = {s: sorted(tars) for s, tars in yaml.safe_load((ours / "split.yaml").read_bytes())["split_parts"].items()}
    assert split == yaml.safe_load((theirs / "split.yaml").read_bytes())["split_parts"]  # (theirs: sorted by name)
    queries = (
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name",
        "SELECT * FROM samples ORDER BY tar_file_id, sample_index",
        "SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset",
    )
    for q in queries:
        rows = [sqlite3.connect(m / "index.sqlite").execute(q).fetchall() for m in (ours, theirs)]
        assert rows[0] == rows[1] and rows[0], q
    assert len((ours / "index.uuid").read_text()) == len((theirs / "index.uuid").read_text()) == 36


def test_energon_info_and_lint_accept_the_export(exported):
    peer("megatron.energon")
    from click.testing import CliRunner
    from megatron.energon.cli.main import main  # what the `energon` executable runs

    root = str(exported("energon"))
    # the executable, once: a fresh process imports the sample type dataset.yaml names
    info = subprocess.run([Path(sys.executable).parent / "energon", "info", root], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr[-2000:]
    assert "dsbuild.export.energon_sample.ClipSample" in info.stdout and "`val`: " in info.stdout
    lint = CliRunner().invoke(main, ["lint", root])  # (in this process: its loader reads every split)
    assert lint.exit_code == 0, lint.output


def test_a_users_edited_dataset_yaml_is_kept_on_re_export(export_catalog, tmp_path):
    cat, _ = export_catalog
    dest = tmp_path / "e"
    export(f"{cat}@v1", dest, to="energon", split="main/val")  # (the size the command line uses)
    config = dest / ".nv-meta" / "dataset.yaml"
    assert config.read_bytes() == USER_FILES[".nv-meta/dataset.yaml"]
    edited = config.read_bytes() + b"shuffle_over_epochs_multiplier: 2\n"
    config.write_bytes(edited)
    again = export(f"{cat}@v1", dest, to="energon", split="main/val")  # complete: nothing to do, and it says so
    assert again.existed and again.warnings == (
        f"{config}: edited since the export; kept as it is (remove it for dsbuild's)",
    )
    (dest / ".nv-meta" / ".info.json").unlink()  # damage elsewhere: the export is reopened and repaired
    p = run("export", f"{cat}@v1", dest, "--to", "energon", "--split", "main/val")
    assert "dataset.yaml: edited since the export; kept as it is" in p.stderr, p.stderr
    assert config.read_bytes() == edited and (dest / ".nv-meta" / ".info.json").is_file()


def test_energon_reads_a_parquet_version_through_written_tars(export_parquet_catalog, expected, tmp_path):
    cat, _ = export_parquet_catalog
    export(f"{cat}@v1", tmp_path / "e", to="energon", split="main/val", target_bytes=TARGET)
    assert not any(p.is_symlink() for p in (tmp_path / "e").rglob("*"))
    check_samples(_read_crude(tmp_path / "e", "val"), expected["val"])

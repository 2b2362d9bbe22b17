"""DALI's ``fn.readers.webdataset`` reads each split of a ``--to dali`` export exactly, starting from the
export's index files (byte for byte what DALI's own ``wds2idx`` writes) instead of scanning the tars.

The DALI tests need ``nvidia-dali-cuda120`` (a large wheel, the ``dali`` extra, not in ``make test``'s
environment): they skip without it. The layout checks need no DALI.
"""

from __future__ import annotations

import json
import tarfile

import pytest

from dsbuild.export import export
from dsbuild.export.source import open_source
from dsbuild.formats.sample import MEMBERS
from tests.cli.clitools import run
from tests.security.conftest import SHARD_CASES
from tests.validators.support import reseal

from .conftest import SPLITS, TARGET

SKIP = "nvidia-dali-cuda120 is not installed: pip install -e '.[dali]' (a large wheel, kept out of make test)"


def splits(root) -> dict[str, dict]:
    return {split: json.loads((root / f"{split}.json").read_text()) for split in SPLITS}


@pytest.fixture(scope="module")
def catalog_members(export_catalog) -> dict[str, list[tuple[str, tuple[bytes, ...]]]]:
    """split -> [(key, member payloads in MEMBERS order)] in key order, read by dsbuild (proven by hash)."""
    cat, _ = export_catalog
    source = open_source(f"{cat}@v1", "main")
    out = {}
    for split in source.splits:
        got = [(e.key, dict(members)) for e, members in source.members(split.entries())]
        out[split.name] = [(key, tuple(bytes(m[ext]) for ext in MEMBERS)) for key, m in got]
    return out


@pytest.fixture(scope="module")
def whole(export_catalog, tmp_path_factory):
    """The version exported without a split set: one split ``train`` whose tars are all catalog links."""
    cat, _ = export_catalog
    dest = tmp_path_factory.mktemp("dali-whole") / "out"
    export(f"{cat}@v1", dest, to="dali", target_bytes=TARGET)
    return dest


def indexed_keys(root, doc: dict) -> list[str]:
    """The keys of the split's tars in order, read with ``tarfile`` (no DALI needed), each tar's index
    checked against the data offset, size and name of every member as tar sees them."""
    assert doc["ext"] == list(MEMBERS) and len(doc["paths"]) == len(doc["index_paths"])
    keys: list[str] = []
    for tar_rel, idx_rel in zip(doc["paths"], doc["index_paths"]):
        assert tar_rel.startswith(f"shards/{doc['split']}/") and idx_rel == tar_rel.removesuffix(".tar") + ".idx"
        with tarfile.open(root / tar_rel) as tf:
            members = [m for m in tf if m.isreg()]
        samples: dict[str, list[str]] = {}
        for m in members:
            key, _, ext = m.name.partition(".")
            samples.setdefault(key, []).append(f"{ext} {m.offset_data} {m.size} {m.name}")
        want = f"v1.2 {len(samples)}\n" + "".join(" ".join(parts) + "\n" for parts in samples.values())
        assert (root / idx_rel).read_text() == want, idx_rel
        keys += samples
    return keys


def test_each_split_lists_tars_of_only_its_samples_in_key_order_with_their_index(exported, catalog_members):
    root = exported("dali")
    for split, doc in splits(root).items():
        assert doc["samples"] == len(catalog_members[split])
        assert indexed_keys(root, doc) == [k for k, _ in catalog_members[split]], split


def test_without_a_split_set_every_catalog_shard_is_linked_and_indexed(whole, catalog_members):
    doc = json.loads((whole / "train.json").read_text())
    assert all((whole / p).is_symlink() for p in doc["paths"])
    assert indexed_keys(whole, doc) == sorted(k for split in SPLITS for k, _ in catalog_members[split])


def test_the_index_files_are_what_dalis_wds2idx_writes(exported, whole, tmp_path):
    wds2idx = pytest.importorskip("wds2idx", reason=SKIP)
    root = exported("dali")
    tars = [root / t for doc in splits(root).values() for t in doc["paths"]]
    tars += [whole / t for t in json.loads((whole / "train.json").read_text())["paths"]]
    assert tars
    for tar in tars:
        with wds2idx.IndexCreator(str(tar), str(tmp_path / "ref.idx"), verbose=False) as creator:
            creator.create_index()
        assert tar.with_suffix(".idx").read_bytes() == (tmp_path / "ref.idx").read_bytes(), tar


def test_dalis_reader_on_cpu_returns_every_member_of_every_sample_of_each_split(exported, catalog_members):
    """``fn.readers.webdataset`` with the JSON's arguments, on a CPU-only pipeline (``device_id=None``):
    sample i is the split's i-th key, and each output is that member's bytes exactly."""
    pytest.importorskip("nvidia.dali", reason=SKIP)
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    root = exported("dali")
    for split, doc in splits(root).items():
        want = catalog_members[split]
        if not want:
            continue

        @pipeline_def(batch_size=len(want), num_threads=1, device_id=None, prefetch_queue_depth=1)
        def pipe(doc=doc):
            return tuple(
                fn.readers.webdataset(
                    paths=[str(root / p) for p in doc["paths"]],
                    index_paths=[str(root / p) for p in doc["index_paths"]],
                    ext=doc["ext"],
                    missing_component_behavior="error",
                    name="reader",
                )
            )

        p = pipe()
        p.build()
        assert p.epoch_size("reader") == len(want)
        outs = p.run()  # one batch: the whole split
        got = [tuple(bytes(np.array(out[i])) for out in outs) for i in range(len(want))]
        assert [json.loads(g[0])["key"] for g in got] == [k for k, _ in want], split
        assert got == [m for _, m in want], split


def test_the_command_exports_a_split_set_for_dali(export_catalog, tmp_path):
    cat, vid = export_catalog
    report = json.loads(
        run("export", f"{cat}@v1", tmp_path / "out", "--to", "dali", "--split-set", "main", "--json").stdout
    )
    assert report["tool"] == "dali" and report["version_id"] == vid
    for split, n in report["splits"].items():
        doc = json.loads((tmp_path / "out" / f"{split}.json").read_text())
        assert doc["samples"] == n and all((tmp_path / "out" / p).is_file() for p in doc["index_paths"])


def test_a_forged_shard_is_refused_before_dali_gets_it(export_catalog, tmp_path):
    """A member header turned into a symlink to /etc/passwd (hashes re-pinned): exit 3 naming the shard,
    and no tar handed out."""
    import shutil

    cat, vid = export_catalog
    shutil.copytree(cat, tmp_path / "cat")
    forged = reseal(tmp_path / "cat", vid, None, SHARD_CASES["symlink"])
    p = run("export", f"{tmp_path / 'cat'}@{forged}", tmp_path / "out", "--to", "dali", check=3)
    assert "shards/" in p.stderr and "not a regular file" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.tar"))

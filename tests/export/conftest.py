"""Fixtures for the export tests: one small catalog whose first shard's samples lack a condition key that
later samples have, a split set over it, and one export per tool (session-scoped: each is made once).

Every peer check goes through ``peers.check_samples``: the right keys per split, metadata kept (title and every
condition key), and every video decodes with PyAV to the frames its metadata promises.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.export import export
from dsbuild.lineage.catalog import Catalog
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from dsbuild.split import SplitOptions, load_split, make_split

SPLITS = ("test", "train", "val")
# The first session (its clips sort first, so they fill the first shard) has no "weather"; the last
# has a "mode" no other has: a reader that infers columns from the first shard loses both.
CONDITIONS = (
    {"track": "harbor", "difficulty": "easy"},
    {"track": "city", "weather": "rain", "difficulty": "hard"},
    {"track": "canyon", "weather": "clear", "difficulty": "easy"},
    {"track": "city", "weather": "rain", "difficulty": "hard", "mode": "night"},
)
PLAYERS = ("p-0", "p-1", "p-0", "p-2")
TARGET = 1 << 18  # small shards of a few samples each, so shards hold samples of several splits


@pytest.fixture(scope="session")
def export_captures(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export-captures")
    specs = [
        dataclasses.replace(
            session_spec(5, i, 2.0), video=VideoSpec(160, 120, 30, 30), player=PLAYERS[i], conditions=CONDITIONS[i]
        )
        for i in range(4)
    ]
    generate(root, sessions=4, seconds=2.0, seed=5, specs=specs)
    return root


def _catalog(captures: Path, out: Path, fmt: str) -> tuple[Path, str]:
    r = convert(
        captures, out, ConvertConfig(format=fmt, clip_seconds=1.0, shard_size=TARGET), executor=ExecutorSpec(workers=1)
    )
    # train gets p-0's two sessions, val p-1, test p-2: shards hold samples of several splits
    make_split(
        out,
        r.version_id,
        "main",
        SplitOptions(by="player", ratios="train=0.5,val=0.25,test=0.25", pins=[("train", ["p-0"]), ("val", ["p-1"])]),
    )
    Catalog.open(out).set_tag("v1", r.version_id)
    return out, r.version_id


@pytest.fixture(scope="session")
def export_catalog(export_captures, tmp_path_factory) -> tuple[Path, str]:
    """(catalog, version id) of WebDataset shards, split set ``main`` and tag ``v1``."""
    return _catalog(export_captures, tmp_path_factory.mktemp("export-wds") / "catalog", "webdataset")


@pytest.fixture(scope="session")
def export_parquet_catalog(export_captures, tmp_path_factory) -> tuple[Path, str]:
    return _catalog(export_captures, tmp_path_factory.mktemp("export-pq") / "catalog", "parquet")


@pytest.fixture(scope="session")
def expected(export_catalog) -> dict[str, dict[str, dict]]:
    """split -> key -> {"title", "conditions"}: what every export must deliver, from the catalog."""
    cat, vid = export_catalog
    index = {r["key"]: r for r in Catalog.open(cat).index(vid, ["key", "title", "conditions"]).to_pylist()}
    out = {}
    for split in SPLITS:
        keys = load_split(cat, vid, f"main/{split}").column("key").to_pylist()
        out[split] = {k: {"title": index[k]["title"], "conditions": dict(index[k]["conditions"])} for k in keys}
    return out


@pytest.fixture(scope="session")
def exported(export_catalog, tmp_path_factory):
    """tool -> export folder of version v1 with split set main (made once per session)."""
    cat, _ = export_catalog
    made = {}

    def get(tool: str) -> Path:
        if tool not in made:
            made[tool] = tmp_path_factory.mktemp(f"export-{tool}") / "out"
            export(f"{cat}@v1", made[tool], to=tool, split="main", target_bytes=TARGET)
        return made[tool]

    return get


@pytest.fixture(scope="session")
def hf_offline(tmp_path_factory):
    """HF datasets without a network, its Arrow cache in a private folder."""
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(
        HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path_factory.mktemp("hf-cache"))
    )
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

"""Small readers used by tests to look at what convert wrote, through the real libraries."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq


def manifest(catalog: Path, version_id: str) -> dict:
    return json.loads((catalog / "versions" / version_id / "manifest.json").read_text())


def index_rows(catalog: Path, version_id: str) -> list[dict]:
    return pq.read_table(catalog / "versions" / version_id / "index.parquet").to_pylist()


def shard_files(catalog: Path, version_id: str) -> list[Path]:
    return [catalog / s["path"] for s in manifest(catalog, version_id)["shards"]]


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under a catalog except commit records and scratch space, by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".tmp" not in p.parts and p.name != "commit.json"}

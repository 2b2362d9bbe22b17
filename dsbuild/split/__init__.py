"""Reproducible train/val/test splits of a version, by a keyed hash of a group field.

A split set is stored beside the version it describes::

    <catalog>/splits/<version_id>/<NAME>/manifest.json     "dsbuild.split/1": parameters, counts, hash
    <catalog>/splits/<version_id>/<NAME>/<split>.parquet   key, sha256, shard, offset, length, row_group,
                                                          row, session_id, group_value, split

Python::

    from dsbuild.split import SplitOptions, make_split, load_split, list_split_sets, diff_split_sets
    r = make_split("catalog", None, "main", SplitOptions(by="player", ratios="train=0.8,val=0.1,test=0.1"))
    train = load_split("catalog", r.version_id, "main/train")   # pyarrow.Table: keys + shard locators

duckdb, directly on the files (no dsbuild needed)::

    -- samples and groups per split, and proof that no group is in two splits
    SELECT split, count(*) AS samples, count(DISTINCT group_value) AS groups
    FROM 'catalog/splits/<version>/main/*.parquet' GROUP BY split ORDER BY split;
    SELECT group_value, list(DISTINCT split) FROM 'catalog/splits/<version>/main/*.parquet'
    GROUP BY group_value HAVING count(DISTINCT split) > 1;          -- always empty
    -- the training samples with their lineage, joined to the version's index
    SELECT s.key, s.shard, s."offset", s.length, i.title, i.t_start, i.t_end
    FROM 'catalog/splits/<version>/main/train.parquet' s
    JOIN 'catalog/versions/<version>/index.parquet' i USING (key) ORDER BY s.key;

The assignment rule and its stability guarantees are documented in ``dsbuild.split.assign``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from dsbuild.core.errors import UsageError
from dsbuild.lineage.catalog import Catalog, open_catalog
from dsbuild.lineage.splitsets import SPLIT_FORMAT, SplitSet, open_split_set
from dsbuild.lineage.splitsets import list_split_sets as _list
from dsbuild.split.assign import RULE, Assignment, assign_groups, expected_std, unit
from dsbuild.split.check import CheckResult, check_split
from dsbuild.split.diff import diff_split_sets
from dsbuild.split.files import split_schema
from dsbuild.split.make import SplitResult, make_split
from dsbuild.split.params import SplitOptions, SplitParams, parse_ratios

__all__ = [
    "RULE",
    "SPLIT_FORMAT",
    "Assignment",
    "CheckResult",
    "SplitOptions",
    "SplitParams",
    "SplitResult",
    "SplitSet",
    "assign_groups",
    "check_split",
    "diff_split_sets",
    "expected_std",
    "list_split_sets",
    "load_split",
    "make_split",
    "open_split",
    "parse_ratios",
    "split_schema",
    "unit",
]


def _root(catalog: str | Path | Catalog) -> Catalog:
    return catalog if isinstance(catalog, Catalog) else open_catalog(catalog)


def open_split(catalog: str | Path | Catalog, version_id: str | None, name: str) -> SplitSet:
    """The split set ``name`` of a version (id, unique prefix, or None for the newest)."""
    cat = _root(catalog)
    return open_split_set(cat, cat.resolve(version_id), name)


def load_split(catalog: str | Path | Catalog, version_id: str | None, spec: str) -> pa.Table:
    """``spec`` = "NAME/SPLIT" -> that split's rows (keys + shard locators), sorted by key, verified."""
    name, slash, split = str(spec).partition("/")
    if not slash or not name or not split:
        raise UsageError(f"split {spec!r}: use NAME/SPLIT, e.g. main/train")
    return open_split(catalog, version_id, name).table(split)


def list_split_sets(catalog: str | Path | Catalog, version_id: str | None) -> list[SplitSet]:
    """The split sets of a version, sorted by name (``.summary()`` gives a JSON-ready overview)."""
    cat = _root(catalog)
    return _list(cat, cat.resolve(version_id))

"""The array check reads a Parquet shard's array columns alone: ``ParquetReader.array_members`` gives the
array members ``members`` gives, from one bounded read of the row groups asked for, never the clips; a
sample whose row is wrong fails alone, and ``npy_bytes`` stays the bytes numpy's writer makes."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsbuild.formats.parquet as pqfmt
from dsbuild.core.errors import FormatError
from dsbuild.formats.base import Entry, ShardReader
from dsbuild.formats.sample import npy_bytes
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import rows_from_table


@pytest.fixture(scope="module")
def shard(parquet_catalog, tmp_path_factory) -> tuple[Path, list[Entry]]:
    """(shard file, its entries): every sample of the Parquet catalog in one shard of row groups of 3."""
    src, vid = parquet_catalog
    fmt, segments = pqfmt.ParquetFormat(row_group_samples=3), []
    for r in sorted(rows_from_table(Catalog.open(src).index(vid)), key=lambda r: r.key):
        with fmt.reader(src / r.shard) as reader:
            segments.append(fmt.encode(r.key, r.sha256, reader.members(r.entry())))
    path = tmp_path_factory.mktemp("pq-arrays") / "shard.parquet"
    with open(path, "wb") as f:
        entries = fmt.write(segments, f)
    assert pq.ParquetFile(path).num_row_groups > 2
    return path, entries


def _plain(found) -> list:
    return [(e.key, err if isinstance(err, FormatError) else [(x, bytes(p)) for x, p in err]) for e, err in found]


def _reads(monkeypatch) -> list[tuple[list[int], list[str]]]:
    """Records each read of row groups: (groups, columns)."""
    reads, real = [], pq.ParquetFile.read_row_groups

    def spy(self, groups, columns=None, **kw):
        reads.append((list(groups), list(columns or [])))
        return real(self, groups, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    return reads


def test_array_members_are_the_members_arrays_from_one_read_of_the_array_columns(shard, monkeypatch):
    path, entries = shard
    groups = pq.ParquetFile(path).num_row_groups
    reads = _reads(monkeypatch)
    with pqfmt.ParquetReader(path) as reader:
        expected = _plain(ShardReader.array_members(reader, entries))  # through members: every column
    assert len(reads) == groups and "video" in reads[-1][1]
    assert all(isinstance(arrays, list) for _, arrays in expected)
    reads.clear()
    with pqfmt.ParquetReader(path) as reader:
        assert _plain(reader.array_members(entries)) == expected
    assert reads == [(list(range(groups)), list(pqfmt.ARRAY_COLUMNS))]  # one read, no clip, no metadata
    reads.clear()
    with pqfmt.ParquetReader(path) as reader:  # a subset: only its groups (here the last two), in one read
        assert _plain(reader.array_members(entries[-4:])) == expected[-4:]
    assert reads == [([groups - 2, groups - 1], list(pqfmt.ARRAY_COLUMNS))]


def test_a_wrong_row_fails_only_its_own_sample(shard):
    path, entries = shard
    first, second, third = entries[:3]
    forged = [replace(first, row_group=999), replace(second, row=99), replace(third, key="forged__000000")]
    with pqfmt.ParquetReader(path) as reader:
        found = _plain(reader.array_members([*forged, *entries[3:]]))
    assert [str(err) for _, err in found[:3]] == [
        f"{first.key}: row group 999 does not exist",
        f"{second.key}: row {second.row_group}/99 does not exist",
        f"forged__000000: row {third.row_group}/{third.row} holds {third.key!r}",
    ]
    with pqfmt.ParquetReader(path) as reader:
        assert found[3:] == _plain(reader.array_members(entries[3:]))
    assert all(isinstance(arrays, list) for _, arrays in found[3:])


def test_a_run_of_row_groups_over_the_bound_is_read_a_group_at_a_time(shard, monkeypatch):
    """Every read keeps the bound ``members``' reads have: when the row groups asked for declare more
    together than it allows, each is read alone (and each is still checked alone)."""
    path, entries = shard
    md = pq.ParquetFile(path).metadata
    declared = [
        sum(
            md.row_group(g).column(j).total_uncompressed_size
            for j in range(md.num_columns)
            if md.row_group(g).column(j).path_in_schema.split(".")[0] in pqfmt.ARRAY_COLUMNS
        )
        for g in range(md.num_row_groups)
    ]
    assert len(declared) > 1
    with pqfmt.ParquetReader(path) as reader:
        expected = _plain(reader.array_members(entries))
    monkeypatch.setattr(pqfmt, "MAX_EXPANSION", 0)
    monkeypatch.setattr(pqfmt, "EXPANSION_FLOOR", max(declared))  # any one group fits, no two together
    reads = _reads(monkeypatch)
    with pqfmt.ParquetReader(path) as reader:
        assert _plain(reader.array_members(entries)) == expected
    assert [g for g, _ in reads] == [[g] for g in range(len(declared))]
    monkeypatch.setattr(pqfmt, "EXPANSION_FLOOR", min(declared) - 1)  # no group fits: each sample refused
    with pqfmt.ParquetReader(path) as reader:
        found = _plain(reader.array_members(entries))
    assert all("once decompressed, over the limit" in str(err) for _, err in found)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["<f4", "<f8", ">f8", ">f4", "<f2", "<i8", ">i4", "u1", "?", "<c8"]),
    st.lists(st.integers(0, 4), max_size=3),
    st.sampled_from(["C", "F", "strided"]),
)
def test_npy_bytes_are_what_numpys_writer_makes(descr, shape, order):
    a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(descr)
    a = np.asfortranarray(a) if order == "F" else a[::-1] if order == "strided" and a.ndim else a
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(a), version=(1, 0), allow_pickle=False)
    assert npy_bytes(a) == buf.getvalue()

"""Arrow columns built from their buffers equal pyarrow's own conversion, and need no pandas."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.core.arrow import array, datetimes, to_numpy

text = st.text(max_size=8)
times = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
)
COLUMNS = {
    pa.int32(): st.integers(-(2**31), 2**31 - 1),
    pa.int64(): st.integers(-(2**63), 2**63 - 1),
    pa.float32(): st.floats(width=32),
    pa.float64(): st.floats(),
    pa.bool_(): st.booleans(),
    pa.string(): text,
    pa.binary(): st.binary(max_size=8),
    pa.timestamp("us", tz="UTC"): times,
    pa.list_(pa.int64()): st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    pa.list_(pa.string()): st.lists(text, max_size=4),
    pa.list_(pa.float32()): st.lists(st.floats(width=32), max_size=4),
    pa.map_(pa.string(), pa.string()): st.lists(st.tuples(text, text), max_size=3),
}


@pytest.mark.parametrize("type", list(COLUMNS), ids=str)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_columns_equal_pyarrow_array(type, data):
    values = data.draw(st.lists(st.none() | COLUMNS[type], max_size=12))
    ours, theirs = array(values, type), pa.array(values, type=type)
    assert ours.type == theirs.type and ours.null_count == theirs.null_count
    assert repr(ours.to_pylist()) == repr(theirs.to_pylist())  # equals() holds NaN unequal to itself
    # byte for byte (-0.0, NaN payloads, what null slots hold): the same Parquet file, the same version id
    assert [b and b.to_pybytes() for b in ours.buffers()] == [b and b.to_pybytes() for b in theirs.buffers()]
    ours.validate(full=True)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.none() | st.lists(st.floats(width=32), max_size=5), max_size=8),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_numpy_rows_make_the_same_list_column(rows, dtype):
    type = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
    values = [None if r is None else np.array(r, dtype) for r in rows]
    ours, theirs = array(values, type), pa.array(values, type=type)
    assert [b and b.to_pybytes() for b in ours.buffers()] == [b and b.to_pybytes() for b in theirs.buffers()]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), type=st.sampled_from([pa.int64(), pa.int32(), pa.float64(), pa.bool_()]))
def test_numpy_vectors_make_the_same_column(data, type):
    dtype = {pa.int64(): np.int64, pa.int32(): np.int64, pa.float64(): np.float64, pa.bool_(): bool}[
        type
    ]  # int32 from int64: converted, not reinterpreted
    values = np.array(data.draw(st.lists(COLUMNS[pa.int32() if type == pa.int32() else type], max_size=10)), dtype)
    ours, theirs = array(values, type), pa.array(values, type=type)
    assert [b and b.to_pybytes() for b in ours.buffers()] == [b and b.to_pybytes() for b in theirs.buffers()]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), type=st.sampled_from([pa.int32(), pa.int64(), pa.float64(), pa.bool_()]))
def test_to_numpy_equals_pyarrow_on_slices_chunks_and_nulls(data, type):
    chunks = data.draw(st.lists(st.lists(st.none() | COLUMNS[type], max_size=9), min_size=1, max_size=3))
    column = pa.chunked_array([pa.array(c, type=type) for c in chunks], type=type)
    lo = data.draw(st.integers(0, len(column)))
    column = column.slice(lo, data.draw(st.integers(0, len(column) - lo)))  # offsets into the buffers
    fill = {pa.bool_(): False, pa.float64(): 0.5}.get(type, -1)
    want = column.fill_null(fill).to_numpy()
    got = to_numpy(column, null=fill)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=type != pa.bool_())
    if column.null_count:
        with pytest.raises(ValueError, match="nulls"):
            to_numpy(column)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_datetimes_equal_pyarrow_on_slices_chunks_and_nulls(data):
    """Read from the buffers (a cast would import pyarrow.compute), the same UTC times as pyarrow's."""
    type = pa.timestamp("us", tz="UTC")
    chunks = data.draw(st.lists(st.lists(st.none() | times, max_size=9), min_size=1, max_size=3))
    column = pa.chunked_array([pa.array(c, type=type) for c in chunks], type=type)
    lo = data.draw(st.integers(0, len(column)))
    column = column.slice(lo, data.draw(st.integers(0, len(column) - lo)))
    assert datetimes(column) == column.to_pylist()
    with pytest.raises(TypeError, match="timestamp"):
        datetimes(pa.array([1], pa.int64()))


def test_numpy_rows_naive_times_and_dicts_are_accepted():
    rows = [np.array([1.5, 2.5], np.float32), None, np.zeros(0, np.float32)]
    assert array(rows, pa.list_(pa.float32())).to_pylist() == [[1.5, 2.5], None, []]
    naive = datetime(2026, 11, 30, 12, 0, 0, 1)
    assert array([naive], pa.timestamp("us", tz="UTC")).equals(
        pa.array([naive.replace(tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    )
    assert array([{"map": "a"}], pa.map_(pa.string(), pa.string())).to_pylist() == [[("map", "a")]]
    with pytest.raises(TypeError, match="no builder"):
        array([1], pa.decimal128(5, 2))


@pytest.mark.parametrize(
    "values, type",
    [
        ([3], pa.string()),
        (["x"], pa.binary()),
        ([1], pa.bool_()),
        ([1.5], pa.int32()),
        ([True], pa.int64()),
        (np.array([1.5, 2.0]), pa.int64()),
        (["1"], pa.float64()),
        ([[("k", 1)]], pa.map_(pa.string(), pa.string())),
        ([np.ones((2, 2), np.float32)], pa.list_(pa.float32())),
        (["2026-11-30"], pa.timestamp("us", tz="UTC")),
    ],
)
def test_values_of_the_wrong_kind_are_refused_not_coerced(values, type):
    """A silent coercion would write wrong data into a content-addressed file (pyarrow itself refuses most
    of these, but truncates 1.5 into an int column and encodes a str into a binary one)."""
    with pytest.raises(TypeError, match="cannot hold|1-D rows"):
        array(values, type)


def test_a_string_or_binary_column_past_32_bit_offsets_comes_back_in_chunks(monkeypatch):
    """As pyarrow's own conversion does (a Parquet shard of clips over 2 GiB); the limit is lowered here."""
    import dsbuild.core.arrow as arrow

    monkeypatch.setattr(arrow, "_OFFSET_LIMIT", 10)
    values = [b"abcd", None, b"efghij", b"k", b"lmnopqrst", b""]
    got = array(values, pa.binary())
    assert isinstance(got, pa.ChunkedArray) and got.num_chunks > 1
    assert all(sum(len(v or b"") for v in c.to_pylist()) <= 10 for c in got.chunks)
    assert got.to_pylist() == values and got.null_count == 1
    with pytest.raises(ValueError, match="32-bit offsets"):
        array([b"x" * 11], pa.binary())


ROUND_TRIP = """
from datetime import datetime, timezone
from dsbuild.lineage.index import IndexRow, index_bytes, rows_from_table, table_from_bytes
base = dict(sha256="0" * 64, shard="shards/a.tar", session_id="s", title="t", player="p", clip_index=0,
            t_start=0.0, t_end=1.0, frames=30, width=64, height=48, codec="h264", has_audio=False,
            n_controls=2, n_channels=1, video_bytes=10, bytes=20, action_events=3, text_events=0,
            source_video_sha256="1" * 64)
rows = [IndexRow(key="a__000000", conditions=(("map", "dust"),), platform="pc", build="1.2",
                 started_at=datetime(2026, 11, 30, 12, tzinfo=timezone.utc), fps=30.0, byte_offset=0,
                 byte_length=512, member_bytes=(1, 2, 3), **base),
        IndexRow(key="b__000000", **base)]
assert rows_from_table(table_from_bytes(index_bytes(rows), "index")) == rows
"""
USER_PATH = """
import sys
from dsbuild.cli import app

def run(*args):
    assert app.run(list(args)) == 0, args  # the command's body as the executable runs it, in this process

captures, out = sys.argv[1:3]
run("convert", captures, out, "--format", "parquet", "--workers", "1", "--quiet")
run("split", out, "--by", "player", "--name", "main", "--quiet")
run("query", out, "select (select count(*) from shards), (select count(*) from sources), (select count(*) from versions)")
from dsbuild.lineage.catalog import open_ref
catalog, version = open_ref(out)
run("lineage", out, catalog.index(version, ["key"]).column("key")[0].as_py())
from dsbuild.loader import Loader, LoaderOptions
for split in (None, "main/train", "main/train"):  # the last restores what the one before derived
    loader = Loader(out, split, options=LoaderOptions(batch_size=2, decode="bytes"))
    next(iter(loader))
assert loader.sources[0].from_cache
exec(sys.argv[3])
print("pandas" in sys.modules)
"""


def test_convert_split_and_the_loader_start_without_importing_pandas(captures, tmp_path):
    """pyarrow imports pandas for ``pyarrow.array`` and ``to_numpy`` when it is installed (0.16 s a
    command); it is here (an extra needs it), so this fails if one of these paths goes through them."""
    if subprocess.run([sys.executable, "-c", "import pandas"]).returncode != 0:
        pytest.skip("pandas is not installed (it comes with an extra): nothing could import it")
    args = [sys.executable, "-c", USER_PATH, str(captures), str(tmp_path / "cat"), ROUND_TRIP]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False", out.stdout + out.stderr[-3000:]

"""Arrow columns built from their buffers equal pyarrow's own conversion, and need no pandas."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.core.arrow import array

text = st.text(max_size=8)
times = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                     timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=-7, minutes=-30))]))
COLUMNS = {
    pa.int32(): st.integers(-(2 ** 31), 2 ** 31 - 1),
    pa.int64(): st.integers(-(2 ** 63), 2 ** 63 - 1),
    pa.float32(): st.floats(width=32),
    pa.float64(): st.floats(),
    pa.bool_(): st.booleans(),
    pa.string(): text,
    pa.binary(): st.binary(max_size=8),
    pa.timestamp("us", tz="UTC"): times,
    pa.list_(pa.int64()): st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=4),
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
@given(rows=st.lists(st.none() | st.lists(st.floats(width=32), max_size=5), max_size=8),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_numpy_rows_make_the_same_list_column(rows, dtype):
    type = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
    values = [None if r is None else np.array(r, dtype) for r in rows]
    ours, theirs = array(values, type), pa.array(values, type=type)
    assert [b and b.to_pybytes() for b in ours.buffers()] == [b and b.to_pybytes() for b in theirs.buffers()]


def test_numpy_rows_naive_times_and_dicts_are_accepted():
    rows = [np.array([1.5, 2.5], np.float32), None, np.zeros(0, np.float32)]
    assert array(rows, pa.list_(pa.float32())).to_pylist() == [[1.5, 2.5], None, []]
    naive = datetime(2026, 11, 30, 12, 0, 0, 1)
    assert array([naive], pa.timestamp("us", tz="UTC")).equals(
        pa.array([naive.replace(tzinfo=timezone.utc)], pa.timestamp("us", tz="UTC")))
    assert array([{"map": "a"}], pa.map_(pa.string(), pa.string())).to_pylist() == [[("map", "a")]]
    with pytest.raises(TypeError, match="no builder"):
        array([1], pa.decimal128(5, 2))


ROWS = """
import sys
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
data = index_bytes(rows)
print("pandas" in sys.modules, rows_from_table(table_from_bytes(data, "index")) == rows)
"""


def test_an_index_is_written_without_importing_pandas():
    """pyarrow.array imports pandas when it is installed (0.16 s of every convert); it is here (an extra
    needs it), so this fails if the index is built through pyarrow.array again."""
    assert subprocess.run([sys.executable, "-c", "import pandas"]).returncode == 0, "pandas is not installed"
    out = subprocess.run([sys.executable, "-c", ROWS], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]

"""The shard-wide header proof is the per-header one, made at once: ``headers_as_written`` says of each row
exactly what comparing it with ``_header(name, size)`` says, for any name, size and damage."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.formats.webdataset import BLOCK, _header, headers_as_written

names = st.binary(min_size=1, max_size=110).filter(lambda b: b"\0" not in b)
sizes = st.integers(0, 8**11 + 3)


def written(name: bytes, size: int) -> bytes | None:
    try:
        return _header(name.decode("latin-1"), size) if name.decode("latin-1").encode() == name else None
    except Exception:  # (a name or size a USTAR header cannot hold)
        return None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, sizes, st.integers(0, BLOCK - 1), st.integers(0, 255), st.booleans()), max_size=12))
def test_each_row_is_proven_exactly_when_it_equals_the_writers_header(headers):
    rows, want = [], []
    for name, size, at, value, damaged in headers:
        exact = written(name, size)
        row = bytearray(exact if exact is not None else bytes(BLOCK))
        if damaged:
            row[at] = value
        rows.append(bytes(row))
        want.append(exact is not None and bytes(row) == exact)
    got = headers_as_written(
        np.frombuffer(b"".join(rows), np.uint8).reshape(-1, BLOCK),
        [n for n, *_ in headers],
        np.array([s for _, s, *_ in headers], np.int64),
    )
    assert got.tolist() == want


def test_a_header_of_another_name_or_size_is_not_proven():
    row = np.frombuffer(_header("k-1.mp4", 1000), np.uint8).reshape(1, BLOCK)
    assert headers_as_written(row, [b"k-1.mp4"], np.array([1000])).tolist() == [True]
    assert headers_as_written(row, [b"k-1.json"], np.array([1000])).tolist() == [False]
    assert headers_as_written(row, [b"k-1.mp4"], np.array([1001])).tolist() == [False]

"""Arrow arrays from Python values and numpy vectors from Arrow columns, through their buffers.

``pyarrow.array`` and ``to_numpy`` ask whether pandas is installed, and import it if so (0.16 s, for a
column of ints): ``convert`` paid that for its index, each of its workers for its first Parquet shard,
``split`` and the loader's start for index columns. These lay out the same buffers Arrow's own
conversions make (tests hold them equal on every type used here), without the detour.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)
_OFFSET_LIMIT = (1 << 31) - 1  # 32-bit offsets: a string, binary, list or map column holds less than this


def array(values, type):
    """``pyarrow.array(values, type)`` for the types dsbuild writes: (u)ints, floats, bool, string,
    binary, timestamp[us] (from datetimes; naive ones are taken as UTC), list<any of these> (from
    sequences or numpy arrays) and map<string, string> (from (key, value) pairs or dicts). None is null.
    ``values`` may be a numpy vector (no nulls then)."""
    import pyarrow as pa

    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype != object:
        return _from_numpy(values, type)
    values = values if isinstance(values, list) else list(values)
    valid = [v is not None for v in values]
    n, nulls = len(values), valid.count(False)
    if pa.types.is_list(type) or pa.types.is_map(type):
        return _nested(values, type, valid, nulls)
    validity = _bitmap(valid) if nulls else None
    if pa.types.is_string(type) or pa.types.is_binary(type):
        data = [b"" if v is None else v.encode() if isinstance(v, str) else bytes(v) for v in values]
        buffers = [validity, pa.py_buffer(_offsets([len(b) for b in data])), pa.py_buffer(b"".join(data))]
        return pa.Array.from_buffers(type, n, buffers, null_count=nulls)
    if pa.types.is_boolean(type):
        return pa.Array.from_buffers(type, n, [validity, _bitmap([bool(v) for v in values])], null_count=nulls)
    if pa.types.is_timestamp(type):
        if type.unit != "us":
            raise TypeError(f"timestamps in microseconds only, not {type}")
        values, dtype = [None if v is None else _micros(v) for v in values], np.int64
    elif pa.types.is_integer(type) or pa.types.is_floating(type):
        dtype = type.to_pandas_dtype()  # the numpy dtype (a name lookup: pandas is not imported)
    else:
        raise TypeError(f"no builder for {type}")
    data = np.array([0 if v is None else v for v in values], dtype=dtype)
    return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(data)], null_count=nulls)


def _from_numpy(values: np.ndarray, type):
    """A column without nulls from a numpy vector: its buffer as it is when the dtype is the column's."""
    import pyarrow as pa

    if pa.types.is_boolean(type) and values.dtype == bool:
        return pa.Array.from_buffers(type, len(values), [None, _bitmap(values)])
    numeric = pa.types.is_integer(type) or pa.types.is_floating(type)
    if numeric and values.dtype == np.dtype(type.to_pandas_dtype()):
        return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])
    return array(values.tolist(), type)


def _nested(values: list, type, valid: list[bool], nulls: int):
    """A list or map column: int32 offsets (null where the value is) over one flat child column."""
    import pyarrow as pa

    n = len(values)
    if pa.types.is_map(type):
        entries = [[] if v is None else list(v.items() if isinstance(v, dict) else v) for v in values]
    else:
        entries = [np.zeros(0) if v is None else v for v in values]
    offsets = pa.Array.from_buffers(pa.int32(), n + 1, [_bitmap(valid + [True]) if nulls else None,
                                                         pa.py_buffer(_offsets([len(e) for e in entries]))],
                                    null_count=nulls)
    if pa.types.is_map(type):
        keys = array([k for e in entries for k, _ in e], type.key_type)
        items = array([x for e in entries for _, x in e], type.item_type)
        return pa.MapArray.from_arrays(offsets, keys, items, type=type)
    return pa.ListArray.from_arrays(offsets, _flat(entries, type.value_type), type=type)


def _flat(entries: list, type):
    """The child column of a list column: numbers from numpy rows are concatenated, not listed."""
    import pyarrow as pa

    if pa.types.is_integer(type) or pa.types.is_floating(type):
        dtype = np.dtype(type.to_pandas_dtype())
        rows = [e for e in entries if len(e)]
        if all(isinstance(e, np.ndarray) and e.dtype == dtype for e in rows):
            data = np.concatenate([e.reshape(-1) for e in rows]) if rows else np.zeros(0, dtype)
            return pa.Array.from_buffers(type, len(data), [None, pa.py_buffer(data)])
    return array([x for e in entries for x in (e.tolist() if isinstance(e, np.ndarray) else e)], type)


def _bitmap(bits):
    import pyarrow as pa

    return pa.py_buffer(np.packbits(np.asarray(bits, bool), bitorder="little"))


def _offsets(lengths: list[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _OFFSET_LIMIT:
        raise ValueError(f"a column of {offsets[-1]} bytes or items is more than 32-bit offsets hold")
    return offsets.astype(np.int32)


def _micros(t: datetime) -> int:
    """Microseconds since the epoch, exactly (a naive time is UTC)."""
    return ((t if t.tzinfo else t.replace(tzinfo=timezone.utc)) - EPOCH) // _MICRO


def to_numpy(column, null=None) -> np.ndarray:
    """A numeric or bool column (Array or ChunkedArray) as a numpy vector (a copy); nulls become ``null``
    (without one, a column with nulls is a ValueError)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n, off = len(column), column.offset
    validity, data = column.buffers()[:2]
    if column.null_count and null is None:
        raise ValueError(f"a {column.type} column with {column.null_count} nulls and no value for them")
    if pa.types.is_boolean(column.type):
        out = _bits(data, off, n)
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        dtype = np.dtype(column.type.to_pandas_dtype())
        out = np.frombuffer(data, dtype, count=n, offset=off * dtype.itemsize).copy() if n else np.zeros(0, dtype)
    else:
        raise TypeError(f"no numpy vector for {column.type}")
    if column.null_count:
        out[~_bits(validity, off, n)] = null
    return out


def _bits(buffer, offset: int, n: int) -> np.ndarray:
    """n bits of an Arrow bitmap from ``offset``, as bools."""
    if n == 0:
        return np.zeros(0, bool)
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[offset:offset + n].astype(bool)

"""Arrow arrays from Python values, and numpy vectors and datetimes from Arrow columns, through their buffers.

``pyarrow.array`` and ``to_numpy`` ask whether pandas is installed, and import it if so (0.16 s, for a
column of ints): ``convert`` paid that for its index, each of its workers for its first Parquet shard,
``split`` and the loader's start for index columns. These lay out the same buffers Arrow's own
conversions make (tests hold them equal on every type used here), without the detour.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_OFFSET_LIMIT = (1 << 31) - 1  # 32-bit offsets: a string, binary, list or map column holds less than this


def array(values, type):
    """``pyarrow.array(values, type)`` for the types dsbuild writes: (u)ints, floats, bool, string,
    binary, timestamp[us] (from datetimes; naive ones are taken as UTC), list<any of these> (from
    sequences or 1-D numpy arrays) and map<string, string> (from (key, value) pairs or dicts). None is
    null; ``values`` may be a numpy vector (no nulls then). A value of the wrong kind is a TypeError (no
    silent coercion: a float for an int column, an int for a string); a string or binary column past
    32-bit offsets comes back as a ChunkedArray, as pyarrow's does."""
    import pyarrow as pa

    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype != object:
        return _from_numpy(values, type)
    values = values if isinstance(values, list) else list(values)
    valid = [v is not None for v in values]
    n, nulls = len(values), valid.count(False)
    if pa.types.is_list(type) or pa.types.is_map(type):
        return _nested(values, type, valid, nulls)
    kind = _kind(type)
    _check(values, kind, type)
    validity = _bitmap(valid) if nulls else None
    if kind is str or kind is bytes:
        data = [b"" if v is None else v.encode() if kind is str else bytes(v) for v in values]
        lengths = [len(b) for b in data]
        if sum(lengths) > _OFFSET_LIMIT:
            return _chunked(values, lengths, type)
        buffers = [validity, pa.py_buffer(_offsets(lengths)), pa.py_buffer(b"".join(data))]
        return pa.Array.from_buffers(type, n, buffers, null_count=nulls)
    if kind is bool:
        return pa.Array.from_buffers(type, n, [validity, _bitmap([bool(v) for v in values])], null_count=nulls)
    if kind is datetime:
        if type.unit != "us":
            raise TypeError(f"timestamps in microseconds only, not {type}")
        values, dtype = [None if v is None else _micros(v) for v in values], np.int64
    else:
        dtype = type.to_pandas_dtype()  # the numpy dtype (a name lookup: pandas is not imported)
    data = np.array([0 if v is None else v for v in values], dtype=dtype)
    return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(data)], null_count=nulls)


# What a column of each kind accepts (stricter than pyarrow, which truncates 1.5 into an int column and
# encodes a str into a binary one).
_ACCEPTS = {
    str: (str,),
    bytes: (bytes, bytearray, memoryview),
    bool: (bool, np.bool_),
    int: (int, np.integer),
    float: (int, float, np.integer, np.floating),
    datetime: (datetime,),
}


def _kind(type):
    import pyarrow as pa

    for test, kind in (
        (pa.types.is_string, str),
        (pa.types.is_binary, bytes),
        (pa.types.is_boolean, bool),
        (pa.types.is_timestamp, datetime),
        (pa.types.is_integer, int),
        (pa.types.is_floating, float),
    ):
        if test(type):
            return kind
    raise TypeError(f"no builder for {type}")


def _check(values: list, kind, type) -> None:
    accepts = _ACCEPTS[kind]
    bad = next(
        (v for v in values if v is not None and (not isinstance(v, accepts) or (kind is int and isinstance(v, bool)))),
        None,
    )
    if bad is not None:
        raise TypeError(f"a {type} column cannot hold {bad!r:.60} ({bad.__class__.__name__})")


def _chunked(values: list, lengths: list[int], type):
    """A string or binary column past 32-bit offsets, in chunks under them."""
    import pyarrow as pa

    if max(lengths) > _OFFSET_LIMIT:
        raise ValueError(f"a {type} value of {max(lengths)} bytes is more than 32-bit offsets hold")
    chunks, start, size = [], 0, 0
    for i, n in enumerate(lengths):
        if size + n > _OFFSET_LIMIT:
            chunks.append(array(values[start:i], type))
            start, size = i, 0
        size += n
    chunks.append(array(values[start:], type))
    return pa.chunked_array(chunks, type=type)


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
    entries: list  # of lists of (key, item) pairs for a map, else of sequences or numpy rows
    if pa.types.is_map(type):
        entries = [[] if v is None else list(v.items() if isinstance(v, dict) else v) for v in values]
    else:
        entries = [np.zeros(0) if v is None else v for v in values]
    offsets = pa.Array.from_buffers(
        pa.int32(),
        n + 1,
        [_bitmap(valid + [True]) if nulls else None, pa.py_buffer(_offsets([len(e) for e in entries]))],
        null_count=nulls,
    )
    if pa.types.is_map(type):
        keys = array([k for e in entries for k, _ in e], type.key_type)
        items = array([x for e in entries for _, x in e], type.item_type)
        return pa.MapArray.from_arrays(offsets, keys, items, type=type)
    return pa.ListArray.from_arrays(offsets, _flat(entries, type.value_type), type=type)


def _flat(entries: list, type):
    """The child column of a list column: numbers from numpy rows are concatenated, not listed."""
    import pyarrow as pa

    if any(isinstance(e, np.ndarray) and e.ndim != 1 for e in entries):
        raise TypeError(f"a {type} list takes 1-D rows; flatten them first")
    if pa.types.is_integer(type) or pa.types.is_floating(type):
        dtype = np.dtype(type.to_pandas_dtype())
        rows = [e for e in entries if len(e)]
        if all(isinstance(e, np.ndarray) and e.dtype == dtype for e in rows):
            data = np.concatenate(rows) if rows else np.zeros(0, dtype)
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
    return ((t if t.tzinfo else t.replace(tzinfo=UTC)) - EPOCH) // _MICRO


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


def datetimes(column) -> list[datetime | None]:
    """A timestamp[us] column as UTC datetimes (None for nulls): the inverse of ``array``'s conversion,
    read from its buffers (a cast would import pyarrow.compute: 0.03 s of a command's start-up)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_timestamp(column.type) or column.type.unit != "us":
        raise TypeError(f"expected a timestamp[us] column, got {column.type}")
    n, off = len(column), column.offset
    validity, data = column.buffers()[:2]
    micros = np.frombuffer(data, np.int64, count=n, offset=off * 8).tolist() if n else []
    present = _bits(validity, off, n).tolist() if column.null_count else [True] * n
    return [EPOCH + timedelta(microseconds=us) if ok else None for us, ok in zip(micros, present)]


def _bits(buffer, offset: int, n: int) -> np.ndarray:
    """n bits of an Arrow bitmap from ``offset``, as bools."""
    if n == 0:
        return np.zeros(0, bool)
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[offset : offset + n].astype(bool)


def check_expansion(pf, columns, row_groups, limit: int, what: str) -> None:
    """Refuse (FormatError) a Parquet file whose column chunks ``columns`` (None: all) of ``row_groups``
    declare more than ``limit`` bytes once decompressed: a few KB of zeros can claim gigabytes, and
    reading allocates what the pages declare before anything is checked."""
    from dsbuild.core.errors import FormatError

    md, total = pf.metadata, 0
    for g in row_groups:
        rg = md.row_group(g)
        for j in range(rg.num_columns):
            chunk = rg.column(j)
            if columns is None or chunk.path_in_schema.split(".")[0] in columns:
                total += chunk.total_uncompressed_size
    if total > limit:
        raise FormatError(f"{what}: declares {total} bytes once decompressed, over the limit of {limit} for its size")

"""Parquet shards: one row per sample, arrays as typed list columns, video stored uncompressed.

zstd is applied per column where it pays (metadata, events, arrays; arrays also use BYTE_STREAM_SPLIT,
2.2x on float telemetry) and not on video (already compressed). Row groups hold a few samples so that
the index can point a reader at one small group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsbuild.formats.sample import Sample
from dsbuild.formats.shards import IndexEntry, ShardWriter

SCHEMA = pa.schema([
    ("key", pa.string()),
    ("sha256", pa.string()),
    ("meta", pa.string()),
    ("video", pa.binary()),
    ("video_ext", pa.string()),
    ("frames", pa.int32()),
    ("actions", pa.list_(pa.float32())),  # row-major [frames, n_controls]
    ("n_controls", pa.int32()),
    ("telemetry", pa.list_(pa.float32())),  # row-major [frames, n_channels]
    ("n_channels", pa.int32()),
    ("timestamps", pa.list_(pa.float64())),
    ("events", pa.binary()),  # zstd JSONL of raw action events, as in the tar member
])
_COMPRESSION = {f.name: ("NONE" if f.name in ("video", "events") else "ZSTD") for f in SCHEMA}
_SPLIT = ["actions.list.element", "telemetry.list.element", "timestamps.list.element"]


class ParquetShardWriter(ShardWriter):
    ext = "parquet"

    def __init__(self, *args, row_group_samples: int = 8, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_group_samples = row_group_samples
        self._rows: list[dict] = []

    def _begin(self) -> None:
        self._rows = []

    def _append(self, sample: Sample, members: list[tuple[str, bytes]], sha256: str) -> IndexEntry:
        n = len(self._rows)
        meta = members[0][1].decode()
        self._rows.append({
            "key": sample.key, "sha256": sha256, "meta": meta, "video": sample.video,
            "video_ext": sample.video_ext, "frames": len(sample.timestamps),
            "actions": sample.actions.reshape(-1), "n_controls": sample.actions.shape[1],
            "telemetry": sample.telemetry.reshape(-1), "n_channels": sample.telemetry.shape[1],
            "timestamps": sample.timestamps, "events": sample.events,
        })
        return IndexEntry(sample.key, sha256, row_group=n // self.row_group_samples,
                          row=n % self.row_group_samples)

    def _finish(self) -> None:
        columns = {f.name: [r[f.name] for r in self._rows] for f in SCHEMA}
        table = pa.table({name: pa.array(values, type=SCHEMA.field(name).type)
                          for name, values in columns.items()}, schema=SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=self.row_group_samples, compression=_COMPRESSION,
                       use_byte_stream_split=_SPLIT, write_statistics=["key"], store_schema=False)
        self.out.write(sink.getvalue().to_pybytes())
        self._rows = []


def row_arrays(row: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(actions, telemetry, timestamps) of a Parquet row as shaped arrays."""
    f = int(row["frames"])
    actions = np.asarray(row["actions"], np.float32).reshape(f, int(row["n_controls"]))
    telemetry = np.asarray(row["telemetry"], np.float32).reshape(f, int(row["n_channels"]))
    return actions, telemetry, np.asarray(row["timestamps"], np.float64)

"""Reading the samples of one shard for validation, from either shard format, trusting nothing.

Each index row gives a ``SampleData``: the parsed members, or ``None`` where a member is missing or
broken, plus the structural problems met while reading (tagged with the check they belong to). Nothing
raises for bad data: a damaged sample is a finding, not an error. No member is ever unpickled.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import loads_bounded
from dsbuild.formats.sample import ARRAY_MEMBERS, EVENTS_MEMBER, VIDEO_EXTS, members_sha256, npy_load

MAX_META_BYTES = 64 << 20  # a sample's metadata holds its text events; 64 MiB is far beyond any clip
PICKLE_EXTS = (".pyd", ".pickle", ".pkl", ".pt", ".pth", ".joblib", ".npz")
PARQUET_COLUMNS = ("key", "sha256", "meta", "video", "video_ext", "frames", "actions", "n_controls",
                   "telemetry", "n_channels", "timestamps", "events")


@dataclass
class SampleData:
    key: str
    meta_bytes: bytes | None = None
    meta: dict | None = None
    video: bytes | None = None
    video_ext: str | None = None
    actions: np.ndarray | None = None
    telemetry: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    events: bytes | None = None
    payload_bytes: int = 0  # sum of member payload sizes (the index's "bytes")
    sha256: str | None = None  # the sample hash as stored in its Parquet row, or (``with_hash``) of the tar bytes
    problems: list[tuple[str, str]] = field(default_factory=list)  # (check name, what is wrong)

    @property
    def readable(self) -> bool:
        """Every member is there and parsed: content checks can run."""
        return all(x is not None for x in (self.meta, self.video, self.actions, self.telemetry, self.timestamps,
                                          self.events))


def _meta(d: SampleData, data: bytes) -> None:
    d.meta_bytes = data
    try:
        doc = loads_bounded(data, max_bytes=MAX_META_BYTES, what=f"{d.key}.json")
    except FormatError as e:
        d.problems.append(("members", str(e)))
        return
    if not isinstance(doc, dict):
        d.problems.append(("members", f"{d.key}.json is not a JSON object"))
        return
    d.meta = doc


def _npy(d: SampleData, name: str, data: bytes) -> np.ndarray | None:
    try:
        return npy_load(data)  # allow_pickle=False: object arrays are refused here
    except (ValueError, OSError, EOFError) as e:
        d.problems.append(("members", f"{d.key}.{name} is not a plain .npy array ({str(e)[:120]})"))
        return None


def fill_from_members(d: SampleData, members: list[tuple[str, bytes]], with_hash: bool = False) -> None:
    """Tar members (name, payload) of one sample -> ``d``; missing, extra and duplicate members are problems."""
    if with_hash:
        d.sha256 = members_sha256([(name.split(".", 1)[1], payload) for name, payload in members])
    by_ext: dict[str, bytes] = {}
    for name, payload in members:
        ext = name.split(".", 1)[1]
        d.payload_bytes += len(payload)
        if ext in by_ext:
            d.problems.append(("members", f"member {name!r} appears twice"))
            continue
        by_ext[ext] = payload
    videos = [e for e in by_ext if e in VIDEO_EXTS]
    expected = {"json", *ARRAY_MEMBERS, EVENTS_MEMBER}
    missing = sorted(expected - set(by_ext)) + ([] if videos else ["|".join(VIDEO_EXTS)])
    if missing:
        d.problems.append(("members", f"missing member(s): {', '.join('.' + m for m in missing)}"))
    if len(videos) > 1:
        d.problems.append(("members", f"{len(videos)} video members ({', '.join(videos)}); expected one"))
    extra = sorted(set(by_ext) - expected - set(VIDEO_EXTS))
    if extra:
        d.problems.append(("members", f"unexpected member(s): {', '.join('.' + e for e in extra)}"))
    if "json" in by_ext:
        _meta(d, bytes(by_ext["json"]))
    if len(videos) == 1:
        d.video_ext, d.video = videos[0], by_ext[videos[0]]
    for ext, attr in zip(ARRAY_MEMBERS, ("actions", "telemetry", "timestamps")):
        if ext in by_ext:
            setattr(d, attr, _npy(d, ext, by_ext[ext]))
    d.events = by_ext.get(EVENTS_MEMBER)


def read_tar_samples(path: Path, rows: list[dict], with_hash: bool = False) -> Iterator[tuple[dict, SampleData]]:
    from dsbuild.formats.webdataset import parse_members

    try:
        f = open(path, "rb")
    except OSError as e:
        for row in rows:
            yield row, SampleData(row["key"], problems=[("members", f"shard unreadable ({e.strerror})")])
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        for row in rows:
            d = SampleData(row["key"])
            off, length = row["offset"], row["length"]
            if off is None or length is None or off < 0 or length <= 0 or off + length > size:
                d.problems.append(("members", f"byte range {off}+{length} lies outside the shard ({size} bytes)"))
                yield row, d
                continue
            f.seek(off)
            try:
                fill_from_members(d, parse_members(f.read(length), key=row["key"], views=True), with_hash)
            except FormatError as e:
                d.problems.append(("members", str(e)))
            yield row, d


def _fill_from_row(d: SampleData, rec: dict) -> None:
    nulls = sorted(c for c in PARQUET_COLUMNS if rec.get(c) is None)
    if nulls:
        d.problems.append(("members", f"null or missing column(s): {', '.join(nulls)}"))
    if rec.get("key") is not None and rec["key"] != d.key:
        d.problems.append(("index", f"row holds key {rec['key']!r}"))
        return
    d.sha256 = rec.get("sha256")
    if rec.get("meta") is not None:
        _meta(d, rec["meta"].encode("utf-8", "surrogatepass"))
    ext = rec.get("video_ext")
    if ext is not None and ext not in VIDEO_EXTS:
        d.problems.append(("unsafe_members", f"video_ext {ext!r} is not one of {', '.join(VIDEO_EXTS)}"))
    elif rec.get("video") is not None:
        d.video, d.video_ext = rec["video"], ext
    d.events = rec.get("events")
    frames = rec.get("frames")
    for col, width_col, attr, dtype in (("actions", "n_controls", "actions", np.float32),
                                        ("telemetry", "n_channels", "telemetry", np.float32),
                                        ("timestamps", None, "timestamps", np.float64)):
        values = rec.get(col)
        width = 1 if width_col is None else rec.get(width_col)
        if values is None or frames is None or width is None:
            continue
        if frames < 0 or width < 0 or len(values) != frames * width:
            d.problems.append(("members", f"{col} holds {len(values)} values, not frames x {width_col or 1} "
                                          f"= {frames} x {width}"))
            continue
        arr = np.asarray(values, dtype=dtype)
        setattr(d, attr, arr if width_col is None else arr.reshape(frames, width))
    d.payload_bytes = sum(len(rec[c]) for c in ("video", "events") if rec.get(c) is not None) + (
        len(d.meta_bytes) if d.meta_bytes else 0)


def read_parquet_samples(path: Path, rows: list[dict]) -> Iterator[tuple[dict, SampleData]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def all_bad(msg: str):
        for row in rows:
            yield row, SampleData(row["key"], problems=[("members", msg)])

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        yield from all_bad(f"shard is not readable Parquet ({str(e)[:160]})")
        return
    columns = [c for c in PARQUET_COLUMNS if c in pf.schema_arrow.names]
    by_group: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_group[row["row_group"]].append(row)
    for group in sorted(by_group):
        if group is None or not 0 <= group < pf.num_row_groups:
            for row in by_group[group]:
                yield row, SampleData(row["key"], problems=[("index", f"row group {group} does not exist")])
            continue
        try:
            table = pf.read_row_group(group, columns=columns)
        except (OSError, pa.ArrowException) as e:
            for row in by_group[group]:
                yield row, SampleData(row["key"], problems=[("members", f"row group {group} unreadable "
                                                                        f"({str(e)[:160]})")])
            continue
        for row in by_group[group]:
            d = SampleData(row["key"])
            if row["row"] is None or not 0 <= row["row"] < table.num_rows:
                d.problems.append(("index", f"row {group}/{row['row']} does not exist"))
            else:
                _fill_from_row(d, {c: table.column(c)[row["row"]].as_py() for c in columns})
            yield row, d


def read_samples(path: Path | None, shard_format: str, rows: list[dict], unreadable: str = "shard unreadable",
                 with_hash: bool = False) -> Iterator[tuple[dict, SampleData]]:
    """The samples of ``rows`` from the local shard file ``path`` (None: every sample gets ``unreadable``).
    ``with_hash`` also hashes each tar sample's bytes (to name the damaged samples of a damaged shard)."""
    if path is None:
        return iter([(row, SampleData(row["key"], problems=[("members", unreadable)])) for row in rows])
    path = Path(path)
    if shard_format == "parquet":
        return read_parquet_samples(path, rows)
    return read_tar_samples(path, rows, with_hash)

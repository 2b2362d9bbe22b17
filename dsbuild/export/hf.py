"""Hugging Face ``datasets``: Parquet files and a dataset card that declares every feature, read with
``datasets.load_dataset(DEST, split="train")`` (or ``streaming=True``).

    DEST/README.md                       YAML front matter: dataset_info.features, configs.data_files per split
    DEST/data/<split>-NNNNN.parquet      one row per sample

HF infers features from the first files it sees unless a card declares them; inferred, a condition key
missing from the first session would come back as None for every row, and ``.mp4`` members would become
``Video()`` features that need torchcodec. So the card declares them all: ``mp4`` is ``binary``,
``conditions`` a list of ``{key, value}`` (every key of every session kept), arrays nested lists.
Parquet rather than our tars: the rows need their own shape (conditions as a list, arrays with their
names), and HF's Parquet reader has no extension-based decoding (a tar's ``.zst`` member would be
silently decompressed when ``zstandard`` is installed). The front matter is JSON, which is YAML.
"""

from __future__ import annotations

import re

import numpy as np

from dsbuild.core.errors import CorruptDataError, FormatError, UsageError
from dsbuild.core.jsonio import canonical_json, pretty_json
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import ExportSource
from dsbuild.formats.sample import Sample, sample_from_members

ROW_GROUP = 16  # rows hold whole clips: small groups keep a random read small
SPLIT_RE = re.compile(r"\w+(\.\w+)*", re.ASCII)  # what HF accepts as a split name


def _schema():
    import pyarrow as pa

    floats = pa.list_(pa.list_(pa.float32()))
    return pa.schema(
        [
            ("key", pa.string()),
            ("session_id", pa.string()),
            ("title", pa.string()),
            ("player", pa.string()),
            ("platform", pa.string()),
            ("build", pa.string()),
            ("started_at", pa.string()),
            ("conditions", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))),
            ("clip_index", pa.int64()),
            ("t_start", pa.float64()),
            ("t_end", pa.float64()),
            ("frames", pa.int64()),
            ("fps", pa.float64()),
            ("width", pa.int64()),
            ("height", pa.int64()),
            ("codec", pa.string()),
            ("mp4", pa.binary()),  # the MP4 clip, as the version holds it
            ("controls", pa.list_(pa.string())),
            ("actions", floats),  # actions[frame][j] is controls[j]
            ("telemetry_channels", pa.list_(pa.string())),
            ("telemetry", floats),
            ("timestamps", pa.list_(pa.float64())),
            ("events", pa.binary()),  # zstd JSONL of the raw action events
            ("json", pa.string()),  # the sample's full metadata document (text events, sources...)
            ("sha256", pa.string()),  # the sample hash in the version
        ]
    )


_STORED_AS_IS = ("mp4", "events")  # video and zstd gain nothing from another pass


def _leaves(name: str, t) -> list[str]:
    """Parquet's paths of a column's leaves (a list's values are "<name>.list.element"): what per-column
    compression must name, or pyarrow silently stores the column uncompressed."""
    import pyarrow as pa

    if pa.types.is_list(t):
        return _leaves(f"{name}.list.element", t.value_type)
    if pa.types.is_struct(t):
        return [p for f in t for p in _leaves(f"{name}.{f.name}", f.type)]
    return [name]


def _feature(t) -> dict:
    """A column's HF feature, as ``Features._to_yaml_list`` writes it (without needing ``datasets``)."""
    import pyarrow as pa

    if pa.types.is_list(t):
        inner = t.value_type
        if pa.types.is_struct(inner):
            return {"list": [{"name": f.name, **_feature(f.type)} for f in inner]}
        sub = _feature(inner)
        return {"list": sub.get("dtype", sub)}
    names = {
        pa.string(): "string",
        pa.binary(): "binary",
        pa.int64(): "int64",
        pa.float64(): "float64",
        pa.float32(): "float32",
    }
    return {"dtype": names[t]}


def _card(source: ExportSource) -> bytes:
    info = {
        "dataset_info": {"features": [{"name": f.name, **_feature(f.type)} for f in _schema()]},
        "configs": [
            {
                "config_name": "default",
                "data_files": [
                    {"split": s.name, "path": f"data/{s.name}-*.parquet"} for s in source.splits if s.samples
                ],
            }
        ],
    }
    split = f", split {source.split_set}" if source.split_set else ""
    empty = [s.name for s in source.splits if not s.samples]
    if empty:  # a split without files in the card: `datasets` refuses to load any split then
        split += f" (empty split(s) {', '.join(empty)} left out: no sample to export)"
    body = (
        f"# dsbuild version {source.version_id[:12]}\n\n"
        f"Exported by `dsbuild export --to hf` from version `{source.version_id}`{split}.\n"
        "Each row is one clip: `mp4` holds the video, `actions`/`telemetry` are per-frame arrays whose "
        "columns are named by `controls`/`telemetry_channels`, and `json` is the full sample metadata.\n"
    )
    return b"---\n" + pretty_json(info) + b"---\n\n" + body.encode()


def _nested(arrays: list[np.ndarray]):
    """list<list<float32>> from 2-D arrays (rows of each array become inner lists), without Python loops
    over values."""
    import pyarrow as pa

    rows = [a.shape[0] for a in arrays]
    widths = (
        np.concatenate([np.full(a.shape[0], a.shape[1], np.int64) for a in arrays]) if arrays else np.zeros(0, np.int64)
    )
    values = pa.array(
        np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.float32), pa.float32()
    )
    inner = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(widths)]), pa.int32()), values)
    return pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(rows)]), pa.int32()), inner)


def _sample(key: str, pairs) -> Sample:
    """The sample of proven members; one whose members do not parse (the version vouches for bytes that are
    no sample) is damaged data, exit 3, not the user's mistake."""
    try:
        return sample_from_members(key, dict(pairs))
    except FormatError as e:
        raise CorruptDataError(str(e), hint="`dsbuild validate --level structural` names the damaged samples") from None


def _table(samples: list[tuple[str, Sample]]):
    import pyarrow as pa

    schema = _schema()
    cols: dict[str, list] = {f.name: [] for f in schema}
    for digest, s in samples:
        m = s.meta
        ses, clip, video = m.session, m.clip, m.video
        for name, value in (
            ("key", s.key),
            ("session_id", ses.session_id),
            ("title", ses.title),
            ("player", ses.player),
            ("platform", ses.platform),
            ("build", ses.build),
            ("started_at", ses.started_at),
            ("conditions", [{"key": k, "value": v} for k, v in sorted(ses.conditions.items())]),
            ("clip_index", clip.index),
            ("t_start", clip.t_start),
            ("t_end", clip.t_end),
            ("frames", clip.frames),
            ("fps", video.fps),
            ("width", video.width),
            ("height", video.height),
            ("codec", video.codec),
            ("mp4", bytes(s.video)),
            ("controls", list(m.controls)),
            ("telemetry_channels", list(m.telemetry_channels)),
            ("timestamps", s.timestamps),
            ("events", bytes(s.events)),
            ("json", canonical_json(m.to_json()).decode()),
            ("sha256", digest),
        ):
            cols[name].append(value)
    arrays = {
        name: pa.array(cols[name], schema.field(name).type) for name in cols if name not in ("actions", "telemetry")
    }
    arrays["actions"] = _nested([s.actions for _, s in samples])
    arrays["telemetry"] = _nested([s.telemetry for _, s in samples])
    return pa.table([arrays[f.name] for f in schema], schema=schema)


def check(source: ExportSource) -> None:
    """Refuse what HF cannot load, before the export folder is claimed."""
    bad = [s.name for s in source.splits if not SPLIT_RE.fullmatch(s.name)]
    if bad:
        raise UsageError(
            f"split {bad[0]!r}: HF datasets accepts split names of letters, digits and '_' only",
            hint="make the split set with such names (`dsbuild split --ratios train=...,val=...`)",
        )


def write(source: ExportSource, folder: ExportFolder, tick: Ticker, target: int) -> None:
    import pyarrow.parquet as pq

    compression = {
        leaf: "NONE" if f.name in _STORED_AS_IS else "ZSTD" for f in _schema() for leaf in _leaves(f.name, f.type)
    }
    for split in source.splits:
        for n, group in enumerate(source.chunks(split.entries(), target)):
            rel = f"data/{split.name}-{n:05d}.parquet"
            if not folder.has(rel):
                rows = [(e.sha256, _sample(e.key, pairs)) for e, pairs in source.members(group)]
                tmp = folder.temp(rel.replace("/", "__"))
                pq.write_table(
                    _table(rows),
                    tmp,
                    row_group_size=ROW_GROUP,
                    compression=compression,
                    use_dictionary=["controls.list.element", "telemetry_channels.list.element"],
                    store_schema=False,
                )
                folder.adopt(rel, tmp)
            tick(len(group))
    folder.put("README.md", _card(source))

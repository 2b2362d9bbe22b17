"""Ray Data in and out: a version (or one split of it) as a ``ray.data.Dataset``, and a Dataset written
back as a derived version with its lineage (optional extra ``ray``).

    import dsbuild.ray
    ds = dsbuild.ray.read_version("catalog@v1", split="main/train")
    ds = ds.map_batches(reencode, batch_format="numpy")
    r = dsbuild.ray.write_version(ds, "catalog", parent="v1", transform={"name": "reencode-64x48"})

Rows are samples: ``key``, ``sha256`` (the sample hash), ``meta`` (the metadata document as JSON text),
``video`` (MP4 bytes), ``actions`` and ``telemetry`` (float32 [frames, n]), ``timestamps`` (float64
[frames]) and ``events`` (zstd JSONL). Reading is one task per shard (yielding blocks of at most
``BLOCK_SAMPLES`` samples, each proven against its sample hash), in key order when ``ordered``.
Writing takes the same columns (``sha256`` is recomputed, an optional ``parent_key`` names the parent
sample when a transform renames keys) and commits through ``convert.derive``: the same rows give the
same version id however Ray partitions them. Segments are written by the write tasks into the
catalog's build area, so a multi-node cluster needs that folder on a shared file system.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dsbuild.convert.derive import DerivedSample, DeriveResult, commit_derived, derive_config, encode_samples
from dsbuild.core.errors import DsbuildError, MissingDependency, UsageError
from dsbuild.core.jsonio import canonical_json, loads_bounded
from dsbuild.core.records import JsonValue
from dsbuild.export.source import open_source, proven_members
from dsbuild.formats.sample import MAX_META_BYTES, Sample, SampleMeta, sample_from_members
from dsbuild.lineage.catalog import Catalog, open_catalog

COLUMNS = ("key", "sha256", "meta", "video", "actions", "telemetry", "timestamps", "events")
WRITTEN = frozenset(COLUMNS) - {"sha256"}  # what write_version needs in every row
BLOCK_SAMPLES = 32  # a block of short clips stays well under Ray's 128 MB target block size


def _ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise MissingDependency("dsbuild.ray", "ray", "Ray Data") from None
    return ray


def _block(samples: list[tuple[str, Sample]], columns: tuple[str, ...]):
    from ray.data.block import BlockAccessor

    def objects(values: list) -> np.ndarray:
        out = np.empty(len(values), dtype=object)  # arrays of different shapes: Ray's variable-shaped tensors
        out[:] = values
        return out

    get = {
        "key": lambda h, s: s.key,
        "sha256": lambda h, s: h,
        "meta": lambda h, s: canonical_json(s.meta.to_json()).decode(),
        "video": lambda h, s: bytes(s.video),
        "actions": lambda h, s: s.actions,
        "telemetry": lambda h, s: s.telemetry,
        "timestamps": lambda h, s: s.timestamps,
        "events": lambda h, s: bytes(s.events),
    }
    return BlockAccessor.batch_to_block({c: objects([get[c](h, s) for h, s in samples]) for c in columns})


def _read_task(url: str, shard_format: str, items: list, columns: tuple[str, ...]):
    """One shard's samples (runs in a Ray worker): the catalog is opened by URL there."""
    catalog = open_catalog(url)
    batch = []
    for e, members in proven_members(catalog, shard_format, items):
        batch.append((e.sha256, sample_from_members(e.key, dict(members))))
        if len(batch) == BLOCK_SAMPLES:
            yield _block(batch, columns)
            batch = []
    if batch:
        yield _block(batch, columns)


def read_version(ref: str, split: str | None = None, columns: list[str] | None = None, *, ordered: bool = True):
    """The samples of version ``ref`` (PATH[@VERSION]; ``split`` = NAME/SPLIT for one split) as a
    ``ray.data.Dataset`` with one read task per shard; ``ordered`` keeps key order through later maps."""
    ray = _ray()
    from ray.data import DataContext, Datasource, ReadTask
    from ray.data.block import BlockMetadata

    cols = tuple(columns or COLUMNS)
    unknown = sorted(set(cols) - set(COLUMNS))
    if unknown:
        raise UsageError(f"unknown column {unknown[0]!r}; columns are {', '.join(COLUMNS)}")
    if split is not None and "/" not in split:
        raise UsageError(f"split {split!r}: a Dataset is one split; use NAME/SPLIT, e.g. main/train")
    source = open_source(ref, split)
    (chosen,) = source.splits
    fmt, url = source.manifest.shard_format, source.catalog.url

    class VersionDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int:
            return sum(source.sizes[e.key] for p in chosen.parts for e in p.entries)

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            tasks = []
            for part in chosen.parts:
                items = [(part.shard, e) for e in part.entries]
                meta = BlockMetadata(
                    num_rows=len(items),
                    size_bytes=sum(source.sizes[e.key] for e in part.entries),
                    input_files=None,
                    exec_stats=None,
                )
                tasks.append(
                    ReadTask(
                        functools.partial(_read_task, url, fmt, items, cols),
                        meta,
                        per_task_row_limit=per_task_row_limit,
                    )
                )
            return tasks

        def get_name(self) -> str:
            return "dsbuild"

    context = DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = ordered or before
    try:
        return ray.data.read_datasource(VersionDatasource(), override_num_blocks=max(1, len(chosen.parts)))
    finally:
        context.execution_options.preserve_order = before


def _rows_of(block) -> Iterator[dict]:
    """A Ray block's rows as dicts (as Ray gives them to a Datasink, not its public row type)."""
    return block.iter_rows(public_row_format=False)


def _sample(row: dict) -> DerivedSample:
    missing = sorted(WRITTEN - set(row))
    extra = sorted(set(row) - WRITTEN - {"sha256", "parent_key"})
    if missing or extra:
        raise UsageError(
            f"write_version: rows need {', '.join(sorted(WRITTEN))} (and may have parent_key); "
            + (f"missing {', '.join(missing)}" if missing else f"unknown column(s) {', '.join(extra)}"),
            hint="drop helper columns with ds.drop_columns([...]) before writing",
        )
    key = str(row["key"])
    meta = SampleMeta.from_json(loads_bounded(row["meta"], max_bytes=MAX_META_BYTES, what=f"{key} meta"), f"{key} meta")
    sample = Sample(
        key,
        meta,
        bytes(row["video"]),
        np.asarray(row["actions"], np.float32),
        np.asarray(row["telemetry"], np.float32),
        np.asarray(row["timestamps"], np.float64),
        bytes(row["events"]),
    )
    return DerivedSample(sample, str(row.get("parent_key") or key))


def write_version(
    ds,
    catalog: str | Path | Catalog,
    parent: str,
    transform: JsonValue,
    *,
    format: str | None = None,
    shard_size: int | None = None,
) -> DeriveResult:
    """Commit the rows of ``ds`` as a version derived from ``parent`` (a tag, id or prefix in
    ``catalog``). ``transform`` describes what was done (it is the version's config). Same rows => same
    version id."""
    ray = _ray()
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    cat = catalog if isinstance(catalog, Catalog) else open_catalog(catalog)
    parent_id = cat.resolve(parent)
    config = derive_config(cat, parent_id, transform, format=format, shard_size=shard_size)

    class VersionSink(Datasink):
        def __init__(self, folder: str):
            self.folder = folder
            self.encoded: list = []

        def write(self, blocks, ctx) -> list:
            rows = (_sample(row) for block in blocks for row in _rows_of(BlockAccessor.for_block(block)))
            return encode_samples(rows, config, Path(self.folder) / f"ray-{ctx.task_idx:06d}.seg")

        def on_write_complete(self, write_result) -> None:
            self.encoded = [e for part in write_result.write_returns for e in part]

    with cat.build_area() as area:
        sink = VersionSink(str(area.path))
        try:
            ds.write_datasink(sink)
        except ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None) or e.__cause__
            if isinstance(cause, DsbuildError):
                raise cause from None
            raise
        return commit_derived(cat, area, config, sink.encoded)


__all__ = ["BLOCK_SAMPLES", "COLUMNS", "read_version", "write_version"]

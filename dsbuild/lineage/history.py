"""The catalog's history (`log`), one version at a glance (`info`) and one sample's lineage (`lineage`)."""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from dataclasses import dataclass

from dsbuild.core.arrow import array
from dsbuild.core.errors import LineageError, UsageError
from dsbuild.core.records import Record
from dsbuild.formats.sample import KEY_RE
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import table_columns
from dsbuild.lineage.splitsets import open_split_set, split_set_summaries


def log_entries(catalog: Catalog) -> list[dict]:
    """Versions newest first, each with its tags and the change from its parent.

    Reads one small commit record per version (and the split pointers): it grows with the number of
    versions, never with their sizes."""
    tags: dict[str, list[str]] = {}
    for name, vid in sorted(catalog.tags().items()):
        tags.setdefault(vid, []).append(name)
    out = []
    for v in catalog.versions():
        c = v.commit
        if c is None:
            m = catalog.manifest(v.version_id)
            summary = {
                "samples": m.stats.samples,
                "bytes": m.stats.bytes,
                "format": m.shard_format,
                "content_id": m.content_id,
                "change": None,
            }
        else:
            summary = {
                "samples": c.samples,
                "bytes": c.bytes,
                "format": c.shard_format,
                "content_id": c.content_id,
                "change": dict(c.change) if c.parent else None,
            }
        out.append(
            {
                "version_id": v.version_id,
                "tags": tags.get(v.version_id, []),
                "created_at": v.created_at,
                "parent": v.parent,
                **summary,
                "split_sets": split_set_summaries(catalog, v.version_id),
            }
        )
    return out


def version_info(catalog: Catalog, version_id: str) -> dict:
    """One version without SQL: format, config, counts, hours, statistics, quarantine, splits and tags."""
    m = catalog.manifest(version_id)
    commit = catalog.commit_record(version_id)
    return {
        "version_id": version_id,
        "content_id": m.content_id,
        "catalog": catalog.url,
        "tags": sorted(t for t, v in catalog.tags().items() if v == version_id),
        "created_at": commit.created_at if commit else None,
        "parent": commit.parent if commit else None,
        "format": m.shard_format,
        "tool_version": m.tool_version,
        "config": m.config,
        "config_hash": m.config_hash,
        "stats": m.stats.to_json(),
        "vocabulary": m.vocabulary.to_json(),
        "quarantined": [q.to_json() for q in m.quarantined],
        "split_sets": split_set_summaries(catalog, version_id),
    }


def sample_lineage(catalog: Catalog, version_id: str, key: str) -> dict:
    """Everything a sample came from: session, source files with sha256, window, config, tool, location.

    A derived version's sample also names what it was made from: ``derived_from`` is the chain of
    (version, key, config) back to the sample converted from captures."""
    import pyarrow as pa
    import pyarrow.compute as pc

    m = catalog.manifest(version_id)
    table = catalog.index(version_id)
    hit = table.slice(0, 0)  # (a key no sample could have, e.g. an argument that was not UTF-8: none)
    if KEY_RE.fullmatch(key):  # (the key as an Arrow array: a Python str compared is converted through pandas)
        hit = table.filter(pc.is_in(table["key"], value_set=array([key], pa.string())))
    if hit.num_rows == 0:
        raise UsageError(
            f"{catalog.url}@{version_id[:12]}: no sample with key {key[:100]!r}",
            hint='`dsbuild query REF "select key from samples"` lists keys',
        )
    row = {name: values[0] for name, values in table_columns(hit.slice(0, 1)).items()}
    return {
        "key": key,
        "version_id": version_id,
        "sample_sha256": row["sha256"],
        "session": {k: row[k] for k in ("session_id", "title", "player", "platform", "build")},
        "window": {
            "t_start": row["t_start"],
            "t_end": row["t_end"],
            "frames": row["frames"],
            "clip_index": row["clip_index"],
        },
        "sources": [
            {"role": s.role, "path": s.path, "sha256": s.sha256, "bytes": s.bytes}
            for s in catalog.sessions(version_id).sources_of(row["session_id"])
        ],
        "config": m.config,
        "config_hash": m.config_hash,
        "tool_version": m.tool_version,
        "location": {k: row[k] for k in ("shard", "byte_offset", "byte_length", "row_group", "row_index")},
        "derived_from": _chain(catalog, row["parent_version"], row["parent_key"]),
    }


def _chain(catalog: Catalog, version_id: str | None, key: str | None) -> list[dict]:
    """(version, key, config) of each ancestor of a derived sample, nearest first. Each step reads one
    index row; a version cannot name itself or a descendant (its id hashes its parent's), so this ends."""
    import pyarrow.compute as pc

    out = []
    while version_id is not None:
        table = catalog.index(version_id, ["key", "parent_version", "parent_key"])
        hit = table.filter(pc.equal(table["key"], key)).to_pylist()
        if not hit:
            raise LineageError(f"{catalog.url}@{version_id[:12]}: parent sample {str(key)[:100]!r} is missing")
        out.append({"version_id": version_id, "key": key, "config": catalog.manifest(version_id).config})
        version_id, key = hit[0]["parent_version"], hit[0]["parent_key"]
    return out


@dataclass(frozen=True, slots=True)
class ShardLocation(Record):
    """One shard of a version, where a reader finds it."""

    url: str  # fsspec URL (file:// for a local catalog)
    path: str | None  # the local file (None on an object store)
    sha256: str
    bytes: int
    samples: int
    in_split: int  # samples of the requested split in it (all of them without a split)


def split_parts(split: str) -> tuple[str, str]:
    """(NAME, SPLIT) of ``--split NAME/SPLIT``."""
    name, slash, part = split.partition("/")
    if not slash or not name or not part:
        raise UsageError(f"--split {split!r}: use NAME/SPLIT, e.g. main/train")
    return name, part


def shard_locations(catalog: Catalog, version_id: str, split: str | None = None) -> list[ShardLocation]:
    """The version's shards in manifest order (the order of their samples' keys). With ``split``
    (NAME/SPLIT) the shards holding samples of that split, refused when one of them also holds other
    splits' samples (shards span sessions): a tar reader reads every sample of a listed shard, and
    ``dsbuild.export.materialize`` writes the split's own tars instead."""
    m = catalog.manifest(version_id)
    counts = None
    if split is not None:
        name, part = split_parts(split)
        index = catalog.index(version_id, ["key", "shard"])  # (a split file's own shard column is not trusted)
        shard_of = dict(zip(index["key"].to_pylist(), index["shard"].to_pylist()))
        keys = open_split_set(catalog, version_id, name).key_assignment(shard_of, only=part)
        counts = Counter(shard_of[k] for k in keys)
        shared = sum(0 < counts.get(s.path, 0) < s.samples for s in m.shards)
        if shared:
            raise UsageError(
                f"--split {split}: {shared} of {len(counts)} shards holding its samples also hold other splits' "
                "(a tar reader reads them all); add --materialize DIR to write and list the split's own tars"
            )
    out = []
    for s in m.shards:
        if counts is not None and not counts.get(s.path):
            continue
        local = catalog.root / s.path if catalog.root is not None else None
        if local is not None:
            with suppress(FileNotFoundError):  # (listed: its reader says it is missing)
                catalog.shard_file(s)  # a regular file inside the catalog: never another file's path
        url = local.resolve().as_uri() if local is not None else f"{catalog.url.rstrip('/')}/{s.path}"
        out.append(
            ShardLocation(
                url,
                str(local) if local is not None else None,
                s.sha256,
                s.bytes,
                s.samples,
                counts.get(s.path, 0) if counts is not None else s.samples,
            )
        )
    return out

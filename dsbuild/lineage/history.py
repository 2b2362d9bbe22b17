"""The catalog's history (`log`) and one sample's lineage (`lineage`)."""

from __future__ import annotations

import pyarrow.compute as pc

from dsbuild.errors import UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.diff import diff_versions, summary_line
from dsbuild.lineage.index import read_index
from dsbuild.split.files import list_split_sets


def log_entries(catalog: Catalog) -> list[dict]:
    """Versions newest first, each with its tags and a one-line summary of the change from its parent."""
    tags: dict[str, list[str]] = {}
    for name, vid in sorted(catalog.tags().items()):
        tags.setdefault(vid, []).append(name)
    known = {v.version_id for v in catalog.versions()}
    out = []
    for v in catalog.versions():
        m = catalog.manifest(v.version_id)
        parent = v.commit.get("parent")
        if parent in known and parent != v.version_id:
            change = summary_line(diff_versions(catalog, parent, catalog, v.version_id, limit=0))
        else:
            change = f"+{m.stats['samples']} samples (first version)" if not parent else "parent not in catalog"
        out.append({
            "version_id": v.version_id, "content_id": m.content_id, "tags": tags.get(v.version_id, []),
            "created_at": v.created_at, "samples": m.stats["samples"], "bytes": m.stats["bytes"],
            "format": m.shard_format, "parent": parent, "change": change,
            "split_sets": [sp.summary() for sp in list_split_sets(catalog.root, v.version_id)],
        })
    return out


def sample_lineage(catalog: Catalog, version_id: str, key: str) -> dict:
    """Everything a sample came from: session, source files with sha256, window, config, tool, location."""
    m = catalog.manifest(version_id)
    table = read_index(catalog.version_dir(version_id) / m.index["path"])
    hit = table.filter(pc.equal(table["key"], key))
    if hit.num_rows == 0:
        raise UsageError(f"{catalog.root}@{version_id[:12]}: no sample with key {key!r}")
    row = hit.to_pylist()[0]
    return {
        "key": key,
        "version_id": version_id,
        "sample_sha256": row["sha256"],
        "session": {k: row[k] for k in ("session_id", "title", "player", "platform", "build")},
        "window": {"t_start": row["t_start"], "t_end": row["t_end"], "frames": row["frames"],
                   "clip_index": row["clip_index"]},
        "sources": [{k: s[k] for k in ("role", "path", "sha256", "bytes")}
                    for s in m.sources if s["session"] == row["session_id"]],
        "config": m.config,
        "config_hash": m.config_hash,
        "tool_version": m.tool_version,
        "location": {"shard": row["shard"], "offset": row["offset"], "length": row["length"],
                     "row_group": row["row_group"], "row": row["row"]},
    }

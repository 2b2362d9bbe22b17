"""`diff`: what changed between two versions, by sample key and hash, plus statistics drift."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc

from dsbuild.lineage.catalog import Catalog

STAT_COLUMNS = [
    "key",
    "sha256",
    "title",
    "frames",
    "fps",
    "width",
    "height",
    "t_start",
    "t_end",
    "action_events",
    "text_events",
    "video_bytes",
]


def version_stats(table) -> dict:
    """Summary statistics of an index table (the things whose drift matters to training)."""
    n = table.num_rows
    dur = pc.subtract(table["t_end"], table["t_start"])
    seconds = pc.sum(dur).as_py() or 0.0
    res = Counter(f"{w}x{h}" for w, h in zip(table["width"].to_pylist(), table["height"].to_pylist()))
    fps = Counter(str(round(f or 0, 3)) for f in table["fps"].to_pylist())
    actions = pc.sum(table["action_events"]).as_py() or 0
    return {
        "samples": n,
        "hours": round(seconds / 3600, 6),
        "mean_duration_s": round(seconds / n, 6) if n else 0.0,
        "frames": pc.sum(table["frames"]).as_py() or 0,
        "resolution": dict(sorted(res.items())),
        "fps": dict(sorted(fps.items())),
        "action_events_per_s": round(actions / seconds, 6) if seconds else 0.0,
        "text_events": pc.sum(table["text_events"]).as_py() or 0,
        "video_bytes": pc.sum(table["video_bytes"]).as_py() or 0,
        "samples_per_title": dict(sorted(Counter(table["title"].to_pylist()).items())),
    }


def diff_versions(catalog_a: Catalog, a: str, catalog_b: Catalog, b: str, *, limit: int = 20) -> dict:
    ta = catalog_a.index(a, STAT_COLUMNS)
    tb = catalog_b.index(b, STAT_COLUMNS)
    ha = dict(zip(ta["key"].to_pylist(), ta["sha256"].to_pylist()))
    hb = dict(zip(tb["key"].to_pylist(), tb["sha256"].to_pylist()))
    added = sorted(hb.keys() - ha.keys())
    removed = sorted(ha.keys() - hb.keys())
    changed = sorted(k for k in ha.keys() & hb.keys() if ha[k] != hb[k])
    sa, sb = version_stats(ta), version_stats(tb)
    titles = sorted(set(sa["samples_per_title"]) | set(sb["samples_per_title"]))
    drift = {
        k: {"a": sa[k], "b": sb[k], "delta": round(sb[k] - sa[k], 6)}
        for k in ("samples", "hours", "mean_duration_s", "frames", "action_events_per_s", "text_events", "video_bytes")
    }
    return {
        "a": a,
        "b": b,
        "added": len(added),
        "removed": len(removed),
        "changed": len(changed),
        "unchanged": len(ha.keys() & hb.keys()) - len(changed),
        "added_keys": added[:limit],
        "removed_keys": removed[:limit],
        "changed_keys": changed[:limit],
        "per_title": {
            t: {"a": sa["samples_per_title"].get(t, 0), "b": sb["samples_per_title"].get(t, 0)} for t in titles
        },
        "drift": drift,
        "resolution": {"a": sa["resolution"], "b": sb["resolution"]},
        "fps": {"a": sa["fps"], "b": sb["fps"]},
    }

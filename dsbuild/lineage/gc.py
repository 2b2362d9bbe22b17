"""Garbage collection: shards no version references, replaced split sets, dead builds' leftovers,
temp files of record writes a kill -9 interrupted.

Safety: a shard is removed only if no committed version references it. On a local catalog, gc takes
the catalog lock, which every commit also takes, so no build can publish between the check and the
removal; a build in progress holds its shards in its own locked build folder until it commits, and a
push in progress, which sends shards straight to ``shards/``, names each in its build folder first
(``BuildArea.hold``): gc keeps what a live build holds.
Object stores have no locks: there a build uploads its shards before its manifest, so an upload in
progress is protected by a grace period — an unreferenced shard (or unpublished version file) younger
than ``grace`` seconds (default 24 h, longer than any build) is kept, and listed as kept.
"""

from __future__ import annotations

import time

from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.splitsets import unreferenced_split_folders

GRACE = 24 * 3600
INTERRUPTED_GRACE = 3600  # a record write (temp file, fsync, rename) never takes this long


def collect(catalog: Catalog, *, dry_run: bool = False, grace: float = GRACE, now: float | None = None) -> dict:
    """Remove (or, with ``dry_run``, list) garbage; returns what was (or would be) removed and kept.
    Ages are measured at ``now`` (default: the clock)."""
    with catalog.lock():
        used = {s.path for v in catalog.versions() for s in catalog.manifest(v.version_id).shards}
        now = time.time() if now is None else now
        garbage, young, kept_held = [], [], []
        listed = catalog.store.list("shards")
        held = catalog.held_by_builds()  # (after the listing: a push names a shard before it sends it)
        for key in listed:
            if key in used:
                continue
            if key in held:
                kept_held.append(key)
                continue
            if catalog.root is None:
                stamp = catalog.store.modified(key)
                if stamp is None or now - stamp < grace:
                    young.append(key)
                    continue
            garbage.append((key, catalog.store.size(key) or 0))
        unpublished = _unpublished(catalog, now, grace if catalog.root is None else 0)
        splits, unreadable = unreferenced_split_folders(catalog, now=now, grace=grace)
        if not dry_run:
            for key in [k for k, _ in garbage] + unpublished + splits:
                catalog.store.delete(key)
        builds = catalog.clean_stale_builds(dry_run=dry_run)
        writes = catalog.interrupted_writes(older_than=INTERRUPTED_GRACE, now=now, dry_run=dry_run)
    return {
        "shards": [{"path": k, "bytes": b} for k, b in garbage],
        "bytes": sum(b for _, b in garbage),
        "kept_young_shards": young,
        "kept_held_shards": kept_held,
        "unpublished_files": unpublished,
        "replaced_split_files": splits,
        "unreadable_split_pointers": unreadable,
        "stale_builds": builds,
        "interrupted_writes": writes,
        "dry_run": dry_run,
        "grace_seconds": grace if catalog.root is None else None,
    }


def _unpublished(catalog: Catalog, now: float, grace: float) -> list[str]:
    """Files of versions whose manifest never landed (an interrupted upload), past the grace period."""
    by_version: dict[str, list[str]] = {}
    for key in catalog.store.list("versions"):
        by_version.setdefault(key.split("/")[1], []).append(key)
    out = []
    for vid, keys in by_version.items():
        if f"versions/{vid}/manifest.json" in keys:
            continue
        stamps = [catalog.store.modified(k) or now for k in keys]
        if now - max(stamps) >= grace:
            out += keys
    return sorted(out)

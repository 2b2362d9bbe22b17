"""Thumbnail strips of the clips that failed or warned, read back through the shard format's reader."""

from __future__ import annotations

from dsbuild.core.errors import DsbuildError
from dsbuild.formats import get_format
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import LOCATOR_COLUMNS, entries_by_shard
from dsbuild.validators.images import strip
from dsbuild.validators.model import Report

MAX_STRIPS = 24  # clips shown on the page (each strip is ~20-40 KB of base64)
STRIPS_PER_CHECK = 6


def offending_clips(report: Report, per_check: int = STRIPS_PER_CHECK, limit: int = MAX_STRIPS) -> list[str]:
    """Keys of the first sample offenders of each failing or warning check, in check order."""
    keys: list[str] = []
    for c in report.checks:
        if c.status in ("fail", "warn"):
            keys += [k for k in [o.item for o in c.offenders if o.kind == "sample"][:per_check] if k not in keys]
    return keys[:limit]


def clip_strips(report: Report, catalog: Catalog | None = None) -> dict[str, bytes | None]:
    """key -> JPEG strip (None: no frame decodes) for ``offending_clips``, from ``catalog`` or the one the
    report names. A version too damaged to read gives no strips: the page is still written, and says so."""
    keys = set(offending_clips(report))
    if not keys:
        return {}
    out: dict[str, bytes | None] = {}
    try:
        cat = catalog or Catalog.open(report.catalog)
        m = cat.manifest(report.version_id)
        table = cat.index(report.version_id, [*LOCATOR_COLUMNS, "frames"])
        frames = dict(zip(table["key"].to_pylist(), table["frames"].to_pylist()))
        fmt = get_format(m.shard_format)
        records = {s.path: s for s in m.shards}
        for shard, entries in sorted(entries_by_shard(table).items()):
            wanted = [e for e in entries if e.key in keys]
            if not wanted or shard not in records:
                continue
            try:
                with fmt.reader(cat.shard_file(records[shard], proven=True)) as reader:
                    for e in wanted:
                        try:
                            out[e.key] = strip(bytes(reader.read(e).video), frames[e.key] or 1)
                        except (DsbuildError, OSError):
                            out[e.key] = None
            except (DsbuildError, OSError):
                out.update(dict.fromkeys((e.key for e in wanted), None))
    except (DsbuildError, OSError):
        return out
    return out

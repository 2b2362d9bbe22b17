"""Orchestration of a build: discover, quarantine, process sessions in parallel, commit one version."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from dsbuild import __version__
from dsbuild.convert.config import ConvertConfig
from dsbuild.convert.executors import run
from dsbuild.convert.session import SessionJob, SessionResult, source_set
from dsbuild.errors import CaptureError, DsbuildError, UsageError
from dsbuild.formats.capture import Session, discover_sessions, read_session
from dsbuild.formats.sample import ARRAY_MEMBERS, EVENTS_MEMBER, SAMPLE_FORMAT, VIDEO_EXT
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.hashing import sha256_bytes, sha256_json
from dsbuild.lineage.index import INDEX_FILE, INDEX_SCHEMA, index_bytes, read_index
from dsbuild.lineage.manifest import Manifest, ShardRecord, content_id


class NothingToConvert(DsbuildError):
    """Every session was quarantined: there is no dataset to commit."""

    exit_code = 1


@dataclass
class Progress:
    """What a progress display needs after each session."""

    total: int
    done: int = 0
    samples: int = 0
    bytes: int = 0
    quarantined: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ConvertResult:
    version_id: str
    content_id: str
    existed: bool
    catalog: str
    format: str
    samples: int
    shards: int
    bytes: int
    sessions: int
    quarantined: list[dict]
    long_clips: int
    repaired_sessions: int
    parent: str | None
    reused_sessions: int
    written_bytes: int  # shard bytes this build added to the catalog (0 for shards it could share)
    seconds: float

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _read_sessions(root: Path) -> tuple[list[Session], list[dict]]:
    """Parse every session.json; quarantine unreadable ones and every holder of a duplicated id."""
    sessions, quarantined = [], []
    for directory in discover_sessions(root):
        try:
            sessions.append(read_session(directory, root))
        except CaptureError as e:
            quarantined.append({"session": directory.relative_to(root).as_posix(), "path": e.path,
                                "reason": e.reason})
    by_id = defaultdict(list)
    for s in sessions:
        by_id[s.session_id].append(s)
    kept = []
    for s in sessions:
        twins = by_id[s.session_id]
        if len(twins) > 1:
            others = ", ".join(t.rel for t in twins if t is not s)
            quarantined.append({"session": s.session_id, "path": s.rel_of("session.json"),
                                "reason": f"duplicate session_id (also in {others})"})
        else:
            kept.append(s)
    return kept, quarantined


def _parent(catalog: Catalog, config: ConvertConfig, onto: str | None) -> tuple[str | None, Manifest | None]:
    """(parent version, its manifest when its shards can be reused: same config and tool version)."""
    versions = catalog.versions()
    if not onto and not versions:
        return None, None
    parent = catalog.resolve(onto)
    m = catalog.manifest(parent)
    same = m.config_hash == sha256_json(config.to_json()) and m.tool_version == __version__
    if onto and not same:
        changed = sorted(k for k, v in config.to_json().items() if m.config.get(k) != v) or ["tool version"]
        raise UsageError(f"--onto {onto}: version {parent[:12]} was built with other settings "
                         f"({', '.join(changed)}); convert without --onto for a fresh build")
    return parent, m if same else None


def convert(captures: Path, out: Path, config: ConvertConfig, *, workers: int | None = None,
            onto: str | None = None, executor: str = "local", ray_address: str | None = None,
            on_progress: Callable[[Progress], None] | None = None) -> ConvertResult:
    """Build a version of ``captures`` into the catalog ``out``. Same inputs + config => same version id.

    Sessions whose source files are unchanged since the parent version (``onto``, else the newest
    version when its config matches) keep their shards: only new or changed sessions are written.
    """
    from dsbuild.lineage.remote import RemoteCatalog, is_url, staged_captures

    if is_url(captures):
        with staged_captures(str(captures)) as local:
            return convert(local, out, config, workers=workers, onto=onto, executor=executor,
                           ray_address=ray_address, on_progress=on_progress)
    if is_url(out):
        remote = RemoteCatalog(str(out))
        with remote.locked():
            mirror = remote.pull(create=True)
            result = convert(captures, mirror.root, config, workers=workers, onto=onto, executor=executor,
                             ray_address=ray_address, on_progress=on_progress)
            remote.push(mirror, result.version_id)
        return replace(result, catalog=str(out))
    started = time.monotonic()
    captures, out = Path(captures), Path(out)
    if not captures.is_dir():
        raise UsageError(f"{captures}: capture folder does not exist" if not captures.exists()
                         else f"{captures}: is not a folder")
    sessions, quarantined = _read_sessions(captures)
    if not sessions and not quarantined:
        raise UsageError(f"{captures}: no sessions found (no session.json in it or below it)")
    catalog = Catalog.open(out, create=True)
    parent, base = _parent(catalog, config, onto)
    base_sources = defaultdict(list)
    for src in base.sources if base else ():
        base_sources[src["session"]].append(src)
    workers = workers or os.cpu_count() or 1
    progress = Progress(total=len(sessions))
    results: list[SessionResult] = []
    with catalog.build_area() as area:
        jobs = [SessionJob(s, area.path, config, source_set(base_sources[s.session_id])
                           if s.session_id in base_sources else None) for s in sessions]

        def on_result(r: SessionResult) -> None:
            results.append(r)
            progress.done += 1
            progress.samples += r.samples
            progress.bytes += r.video_bytes
            progress.quarantined += r.quarantine is not None
            if on_progress:
                on_progress(progress)

        run(executor, jobs, workers, on_result, ray_address)
        results.sort(key=lambda r: r.session_id)
        quarantined += [r.quarantine for r in results if r.quarantine]
        good = [r for r in results if r.quarantine is None]
        if not good:
            first = quarantined[0]
            raise NothingToConvert(f"all {len(quarantined)} sessions were quarantined; first: "
                                   f"{first['path']}: {first['reason']}")
        if any(r.reused for r in good):
            _fill_reused(catalog, parent, base, good)
        manifest, index, moves = _assemble(catalog, config, good, quarantined)
        written = sum(tmp.stat().st_size for tmp, rel in moves if not (catalog.root / rel).exists())
        version_id, existed = catalog.commit(area, moves, manifest, index,
                                             {"captures": str(captures.resolve()), "parent": parent})
    stats = manifest.stats
    return ConvertResult(
        version_id=version_id, content_id=manifest.content_id, existed=existed, catalog=str(out),
        format=config.format, samples=stats["samples"], shards=stats["shards"], bytes=stats["bytes"],
        sessions=stats["sessions"], quarantined=list(manifest.quarantined), long_clips=stats["long_clips"],
        repaired_sessions=stats["repaired_sessions"], parent=parent,
        reused_sessions=sum(r.reused for r in good), written_bytes=written,
        seconds=round(time.monotonic() - started, 3),
    )


def _fill_reused(catalog: Catalog, parent: str, base: Manifest, results: list[SessionResult]) -> None:
    """Give reused sessions the shards, index rows and reports they have in the parent version."""
    reused = {r.session_id: r for r in results if r.reused}
    table = read_index(catalog.version_dir(parent) / base.index["path"])
    for row in table.to_pylist():
        if row["session_id"] in reused:
            reused[row["session_id"]].rows.append(row)
    entries = {s["session_id"]: s for s in base.sessions}
    for sid, r in reused.items():
        r.shard_records = [s for s in base.shards if s.session == sid]
        r.repairs = entries[sid]["repairs"]
        r.controls, r.channels = tuple(entries[sid]["controls"]), tuple(entries[sid]["telemetry"])


def _assemble(catalog: Catalog, config: ConvertConfig, results: list[SessionResult],
              quarantined: list[dict]) -> tuple[Manifest, bytes, list[tuple[Path, str]]]:
    """Turn session results into the manifest, the index rows and the shard moves (pure bookkeeping)."""
    ext = "parquet" if config.format == "parquet" else "tar"
    shards, rows, moves, sources, sessions = [], [], [], [], []
    controls, channels, titles = set(), set(), Counter()
    long_clips = repaired = frames = 0
    seconds = 0.0
    for r in results:
        if r.reused:
            shards += r.shard_records
            session_rows = r.rows
        else:
            rels = []
            for ws in r.shards:
                rel = catalog.shard_path(ws.sha256, ext)
                rels.append(rel)
                moves.append((ws.tmp_path, rel))
                shards.append(ShardRecord(rel, ws.sha256, ws.bytes, len(ws.entries), r.session_id))
            entries = [e for ws in r.shards for e in ws.entries]
            session_rows = []
            for row, entry in zip(r.rows, entries, strict=True):
                if row["key"] != entry.key:
                    raise DsbuildError(f"internal: index order mismatch at {row['key']}")
                session_rows.append({**row, "shard": rels[row["shard"]], "offset": entry.offset,
                                     "length": entry.length, "row_group": entry.row_group, "row": entry.row})
        for row in session_rows:
            rows.append(row)
            frames += row["frames"]
            seconds += row["t_end"] - row["t_start"]
            titles[row["title"]] += 1
        sources += [{"session": r.session_id, **s} for s in r.sources]
        controls.update(r.controls)
        channels.update(r.channels)
        long_clips += r.repairs["video"]["long_clips"]
        is_repaired = any(r.repairs[k]["malformed"] or r.repairs[k]["out_of_order"] or r.repairs[k]["dropped_fields"]
                          for k in ("actions", "telemetry", "text"))
        repaired += is_repaired
        sessions.append({"session_id": r.session_id, "path": r.rel, "samples": r.samples, "repairs": r.repairs,
                         "controls": list(r.controls), "telemetry": list(r.channels)})
    index = index_bytes(rows)
    total_bytes = sum(s.bytes for s in shards)
    manifest = Manifest(
        tool_version=__version__,
        config=config.to_json(),
        config_hash=sha256_json(config.to_json()),
        shard_format=config.format,
        sources=tuple(sorted(sources, key=lambda s: s["path"])),
        shards=tuple(shards),
        sessions=tuple(sessions),
        quarantined=tuple(sorted(quarantined, key=lambda q: (q["path"], q["session"]))),
        index={"path": INDEX_FILE, "sha256": sha256_bytes(index), "rows": len(rows), "bytes": len(index)},
        schema={"sample_format": SAMPLE_FORMAT, "members": ["json", VIDEO_EXT, *ARRAY_MEMBERS,
                                                            EVENTS_MEMBER],
                "index_columns": INDEX_SCHEMA.names},
        vocabulary={"controls": sorted(controls), "telemetry": sorted(channels)},
        stats={"samples": len(rows), "shards": len(shards), "bytes": total_bytes, "frames": frames,
               "hours": round(seconds / 3600, 6), "sessions": len(results), "quarantined": len(quarantined),
               "long_clips": long_clips, "repaired_sessions": repaired, "samples_per_title": dict(sorted(titles.items()))},
        content_id=content_id([(r["key"], r["sha256"]) for r in rows]),
    )
    return manifest, index, moves

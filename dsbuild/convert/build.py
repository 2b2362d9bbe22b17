"""Orchestration of a build: discover, quarantine, process sessions in parallel, assemble shards, commit.

    sessions --(workers: cut, remux, encode)--> segment files
             --(plan: content-defined boundaries over the sorted samples)--> shards to reuse or write
             --(workers: byte-copy segments)--> shards --(commit: shards, then the version)--> catalog

Sessions whose source files are unchanged since the parent version (``onto``, else the newest version
with the same config) are not processed again: their samples are taken from the parent's shards, and
only the shards near a change are written. A parent shard that is missing (or, with ``rehash``, whose
bytes no longer match its name) is healed: its sessions are processed again from the captures.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dsbuild import __version__
from dsbuild.convert.assemble import Assembly, SampleRef, ShardTask, assemble_shard
from dsbuild.convert.captures import read_sessions, staged
from dsbuild.convert.config import ConvertConfig
from dsbuild.convert.notes import LossyStream, keyframe_hint, lossy_streams
from dsbuild.convert.session import SessionJob, SessionResult, process_session, source_roles, source_set
from dsbuild.core.errors import CheckFailed, LineageError, UsageError
from dsbuild.core.executor import ExecutorSpec, TaskPool
from dsbuild.core.hashcache import lookup
from dsbuild.core.hashing import sha256_bytes, sha256_json
from dsbuild.core.jsonio import printable
from dsbuild.core.records import Record
from dsbuild.core.store import is_url, local_path
from dsbuild.formats import get_format
from dsbuild.formats.sample import MEMBERS, SAMPLE_FORMAT, key_prefix
from dsbuild.formats.shards import WrittenShard
from dsbuild.lineage.catalog import Catalog, CommitRecord, catalog_to_fill
from dsbuild.lineage.index import INDEX_COLUMNS, INDEX_FILE, IndexRow, index_bytes, rows_from_table, table_from_bytes
from dsbuild.lineage.manifest import (
    SESSIONS_FILE,
    FilePin,
    Manifest,
    Quarantined,
    SessionRecord,
    SessionTable,
    ShardRecord,
    SourceRecord,
    Stats,
    Vocabulary,
    content_id,
    shard_key,
)


@dataclass
class Progress:
    """What a progress display needs: sessions, and the shards written meanwhile."""

    total: int
    done: int = 0
    samples: int = 0
    bytes: int = 0
    quarantined: int = 0
    shards_total: int = 0  # shards found to write so far (they are written while sessions are processed)
    shards_done: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class ConvertResult(Record):
    version_id: str
    content_id: str
    existed: bool
    catalog: str
    format: str
    samples: int
    shards: int
    bytes: int
    sessions: int
    quarantined: tuple[Quarantined, ...]
    long_clips: int
    repaired_sessions: int
    parent: str | None
    reused_sessions: int
    healed_sessions: int  # reused sessions processed again because a parent shard was missing or damaged
    written_shards: int
    reused_shards: int
    written_bytes: int  # shard bytes this build added to the catalog
    seconds: float
    repairs: dict[str, dict[str, int]]  # the version's repairs and drops by stream, summed over its sessions
    lossy_streams: tuple[LossyStream, ...] = ()  # streams that lost more than 1% of their lines (--strict: exit 1)
    keyframe_hint: str | None = None  # long clips from sparse keyframes: the interval and the --transcode fix


QUARANTINE_SHOWN = 5  # sessions whose reasons an all-quarantined build names (then "and N more")
# per-session counts of volume (not of anything repaired or dropped), and how a codec was carried
_NOT_REPAIRS = frozenset(
    {
        "lines",
        "events",
        "packets",
        "tracks",
        "clips_with_audio",
        "long_clips",
        "reencoded_from",
        "examples",
        "keyframe_gap_seconds",
        "keyframe_gap_frames",
    }
)


def repair_totals(sessions: list[dict]) -> dict[str, dict[str, int]]:
    """Every repair and drop of the sessions' records (``SessionRecord.repairs``) summed by stream and
    reason, under the names of ``sessions.json``: counts add, a reason (``truncated``, ``unreadable``,
    ``missing``) counts the sessions that have one. Nothing a convert skipped is left out of its report."""
    totals: dict[str, Counter] = defaultdict(Counter)

    def add(stream: str, report: dict) -> None:
        for name, value in report.items():
            if isinstance(value, dict):
                add(name, value)
            elif name not in _NOT_REPAIRS:
                totals[stream][name] += value if type(value) is int else int(bool(value))

    for repairs in sessions:
        add("sessions", {k: v for k, v in repairs.items() if not isinstance(v, dict)})  # audio_not_carried
        for stream, report in repairs.items():
            if isinstance(report, dict):
                add(stream, report)
    return {stream: dict(sorted(c.items())) for stream, c in sorted(totals.items())}


def reusable_parent(catalog: Catalog, config: ConvertConfig, onto: str | None) -> tuple[str | None, Manifest | None]:
    """(parent version, its manifest when its samples can be reused: same config, tool version, index
    columns and shard hashes — a parent from before a column or a hash was recorded would pass NULLs on,
    and the build would differ from a fresh one)."""
    if not onto and not catalog.versions():
        return None, None
    if not onto:  # the newest version built with these settings, else the newest (its samples not reused)
        for v in catalog.versions():
            try:
                m = catalog.manifest(v.version_id)
            except LineageError:  # a damaged version is no parent (`verify` names it); it never blocks a build
                continue
            if _reusable(m, config)[0]:
                return v.version_id, m
        return catalog.versions()[0].version_id, None
    parent = catalog.resolve(onto)
    m = catalog.manifest(parent)
    same, current = _reusable(m, config)
    if not same:
        theirs = m.config if isinstance(m.config, dict) else {}
        changed = (
            sorted(k for k, v in config.to_json().items() if json.dumps(theirs.get(k)) != json.dumps(v))
            + (["tool version"] if m.tool_version != __version__ else [])
            + ([] if current else ["index columns or shard hashes"])
        )
        raise UsageError(
            f"--onto {onto}: version {parent[:12]} was built with other settings ({', '.join(changed)})",
            hint="convert without --onto for a fresh build",
        )
    return parent, m


def _reusable(m: Manifest, config: ConvertConfig) -> tuple[bool, bool]:
    """(whether a version's samples can be reused by a build with ``config``, whether its index columns and
    shard hashes are the current ones)."""
    current = (
        isinstance(m.schema, dict)
        and m.schema.get("index_columns") == list(INDEX_COLUMNS)
        and all(s.blake3 for s in m.shards)
    )
    return m.config_hash == sha256_json(config.to_json()) and m.tool_version == __version__ and current, current


def _unchanged(session, parent_set: frozenset) -> list | None:
    """The session's source records if every file is unchanged since it was hashed (a stat and a hash
    cache hit each, no read) and they equal the parent's; None when a worker must look."""
    out = []
    for role, name in source_roles(session):
        path = session.path_of(name)
        try:
            st = path.stat()
        except OSError:
            if role == "video":
                return None
            continue
        digest = lookup(st)
        if digest is None:
            return None
        out.append(SourceRecord(session.session_id, role, session.rel_of(name), digest, st.st_size))
    return out if source_set(out) == parent_set else None


def _shard_healthy(catalog: Catalog, rec: ShardRecord, rehash: bool) -> bool:
    if catalog.store.size(rec.path) != rec.bytes:
        return False
    if not rehash:
        return True
    try:
        with open(catalog.shard_file(rec), "rb") as f:
            return rec.proof().feed(f).ok()
    except Exception:
        return False


@dataclass
class _Base:
    """What the parent version offers: rows and sources per session, shard compositions, health."""

    manifest: Manifest
    sessions: dict[str, SessionRecord]
    rows: dict[str, list[IndexRow]]
    sources: dict[str, frozenset]
    compositions: dict[tuple, ShardRecord]
    broken: set[str]  # sessions with a sample in a missing or damaged shard
    broken_shards: frozenset[str]


def parent_base(catalog: Catalog, parent: str, m: Manifest, rehash: bool, threads: int) -> _Base | None:
    """What the parent offers, or None when its rows cannot be reused: a Parquet version from before
    rows recorded their member sizes (shard planning weighs every sample by them) is built afresh, and so
    is one whose index or session records are missing or damaged (the build then restores them, when it
    is that very version again)."""
    rows: dict[str, list[IndexRow]] = defaultdict(list)
    by_shard: dict[str, list[IndexRow]] = defaultdict(list)
    try:
        index, table = catalog.index(parent), catalog.sessions(parent)
    except LineageError:
        return None
    for r in rows_from_table(index):
        if r.member_bytes is None:
            return None
        rows[r.session_id].append(r)
        by_shard[r.shard].append(r)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        health = dict(zip(m.shards, pool.map(lambda s: _shard_healthy(catalog, s, rehash), m.shards)))
    broken: set[str] = set()
    compositions: dict[tuple, ShardRecord] = {}
    for rec, ok in health.items():
        members = sorted(by_shard.get(rec.path, []), key=lambda r: r.key)
        if ok:
            compositions[tuple((r.key, r.sha256) for r in members)] = rec
        else:
            broken.update(r.session_id for r in members)
    sources = defaultdict(list)
    for s in table.sources:
        sources[s.session].append(s)
    return _Base(
        m,
        {s.session_id: s for s in table.sessions},
        rows,
        {k: source_set(v) for k, v in sources.items()},
        compositions,
        broken,
        frozenset(rec.path for rec, ok in health.items() if not ok),
    )


def convert(
    captures: str | Path,
    out: str | Path,
    config: ConvertConfig,
    *,
    executor: ExecutorSpec = ExecutorSpec(),
    onto: str | None = None,
    rehash: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> ConvertResult:
    """Build a version of ``captures`` into the catalog ``out`` (local paths or fsspec URLs).
    Same inputs + config => same version id, for any executor and worker count."""
    if is_url(captures):
        with staged(str(captures)) as local:
            return _build(local, str(captures), out, config, executor, onto, rehash, on_progress)
    return _build(
        local_path(captures),
        printable(str(local_path(captures).resolve())),
        out,
        config,
        executor,
        onto,
        rehash,
        on_progress,
    )


def _build(
    captures: Path,
    origin: str,
    out: str | Path,
    config: ConvertConfig,
    executor: ExecutorSpec,
    onto: str | None,
    rehash: bool,
    on_progress: Callable[[Progress], None] | None,
) -> ConvertResult:
    """``convert`` of a local capture root; ``origin`` is where the captures really are (a URL for
    captures staged from an object store), recorded so `verify` can name the command that heals."""
    started = time.monotonic()
    if not captures.is_dir():
        raise UsageError(
            f"{captures}: capture folder does not exist" if not captures.exists() else f"{captures}: is not a folder"
        )
    sessions, quarantined = read_sessions(captures)
    if not sessions and not quarantined:
        raise UsageError(f"{captures}: no sessions found (no session.json in it or below it)")
    with catalog_to_fill(out) as catalog:  # (a first build that fails leaves no empty catalog behind)
        parent, base_m = reusable_parent(catalog, config, onto)
        base = parent_base(catalog, parent, base_m, rehash, executor.count * 2) if base_m and parent else None
        fmt = get_format(config.format)
        progress = Progress(total=len(sessions))
        results: list[SessionResult] = []
        if not sessions:
            _refuse_all_quarantined(results, quarantined)
        with catalog.build_area() as area:
            jobs, known = [], []
            for s in sessions:
                parent_set = base.sources.get(s.session_id) if base and s.session_id not in base.broken else None
                cached = _unchanged(s, parent_set) if parent_set is not None else None
                if cached is not None:  # every file's stat is in the hash cache and matches the parent
                    known.append(SessionResult(s.rel, s.session_id, sources=cached, reused=True))
                else:
                    jobs.append(SessionJob(s, captures, area.path, config, parent_set))
            jobs.sort(key=lambda j: key_prefix(j.session.session_id))  # the order their samples enter shards
            shards_of = {s.path: s for s in base.manifest.shards} if base else {}
            assembly = Assembly(
                [key_prefix(j.session.session_id) for j in jobs],
                [ref for r in known for ref in _refs(r, base, shards_of)],
                fmt,
                config.format,
                config.shard_size,
                base.compositions if base else {},
                area.path,
                catalog.shard_file,
            )

            def finished(r: SessionResult) -> None:
                results.append(r)
                progress.done += 1
                progress.samples += (
                    len(r.samples) if not r.reused else len(_parent_of(r, base).rows.get(r.session_id, ()))
                )
                progress.bytes += r.video_bytes
                progress.quarantined += r.quarantine is not None
                if on_progress:
                    on_progress(progress)

            written = _sessions_and_shards(
                jobs,
                known,
                assembly,
                executor,
                progress,
                finished,
                lambda: _refuse_all_quarantined(results, quarantined),
                lambda r: _refs(r, base, shards_of),
                on_progress,
            )
            results.sort(key=lambda r: r.session_id)
            quarantined += [r.quarantine for r in results if r.quarantine]
            good = [r for r in results if r.quarantine is None]
            manifest, pinned, moves, sessions = _assemble(
                config, fmt.ext, good, base, assembly.plan, written, quarantined
            )
            new_bytes = sum(
                rec.bytes
                for _, rec in moves
                if catalog.store.size(rec.path) != rec.bytes or (base and rec.path in base.broken_shards)
            )
            commit = CommitRecord(
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                0,
                parent,
                origin,
                config.format,
                manifest.stats.samples,
                manifest.stats.bytes,
                manifest.content_id,
                change_counts(catalog, parent, pinned[INDEX_FILE]),
            )
            version_id, existed = catalog.commit(
                area, moves, manifest, pinned, commit, damaged=base.broken_shards if base else frozenset()
            )
        if existed:  # its own commit names its parent (the base reused may be the version itself)
            parent = getattr(catalog.commit_record(version_id), "parent", None)
        st = manifest.stats
        return ConvertResult(
            version_id=version_id,
            content_id=manifest.content_id,
            existed=existed,
            catalog=catalog.url,
            format=config.format,
            samples=st.samples,
            shards=st.shards,
            bytes=st.bytes,
            sessions=st.sessions,
            quarantined=manifest.quarantined,
            long_clips=st.long_clips,
            repaired_sessions=st.repaired_sessions,
            parent=parent,
            reused_sessions=sum(r.reused for r in good),
            healed_sessions=sum(
                1
                for r in good
                if base
                and not r.reused
                and r.session_id in base.broken
                and source_set(r.sources) == base.sources.get(r.session_id)
            ),  # (unchanged ones)
            written_shards=len(written),
            reused_shards=st.shards - len(written),
            written_bytes=new_bytes,
            seconds=round(time.monotonic() - started, 3),
            repairs=repair_totals([r.repairs for r in sessions]),
            lossy_streams=lossy_streams(sessions),
            keyframe_hint=keyframe_hint(sessions, config.clip_seconds),
        )


def _sessions_and_shards(
    jobs: list[SessionJob],
    known: list[SessionResult],
    assembly: Assembly,
    executor: ExecutorSpec,
    progress: Progress,
    finished: Callable[[SessionResult], None],
    complete: Callable[[], None],
    refs: Callable[[SessionResult], list[SampleRef]],
    on_progress: Callable[[Progress], None] | None,
) -> dict[int, WrittenShard]:
    """Process the sessions and write the shards their samples complete, in one pool: sessions go out a
    few at a time, so shard tasks run between them (and the segment files they leave are deleted) instead
    of waiting behind every session. ``finished`` sees each session's result (``known`` ones first),
    ``complete`` runs once all are in, before the last shards are planned. Returns the written shards
    by their number in the plan."""
    written: dict[int, WrittenShard] = {}
    total, seen = len(jobs) + len(known), 0
    with TaskPool(executor, inline=len(jobs) < 2) as pool:

        def submit(tasks: list[ShardTask]) -> None:
            for t in tasks:
                pool.submit(assemble_shard, t, t, f"shard {t.number}")
            progress.shards_total += len(tasks)

        def add(r: SessionResult, prefix: str | None) -> None:
            nonlocal seen
            seen += 1
            finished(r)
            if prefix is not None:
                submit(assembly.add(refs(r), prefix))
            if seen == total:
                complete()
                submit(assembly.finish())

        for r in known:
            add(r, None)
        waiting, in_flight = iter(jobs), 0
        limit = 1 if pool.inline else len(jobs) if executor.kind == "ray" else executor.count + 2
        while True:
            while in_flight < limit and (job := next(waiting, None)) is not None:
                pool.submit(process_session, job, None, f"session {job.session.rel}")
                in_flight += 1
            if not pool.pending:
                return written
            task, result = pool.next()
            if isinstance(result, SessionResult):  # a session (submitted with no task)
                in_flight -= 1
                add(result, key_prefix(result.session_id))
            elif isinstance(task, ShardTask) and isinstance(result, WrittenShard):
                written[task.number] = result
                assembly.release(task.refs)
                progress.shards_done += 1
                if on_progress:
                    on_progress(progress)
            else:  # (sessions give SessionResults, shard tasks WrittenShards)
                raise TypeError(f"task {task!r} gave a {type(result).__name__}")


def _parent_of(r: SessionResult, base: _Base | None) -> _Base:
    """The parent build whose rows a reused session takes."""
    if base is None:
        raise LineageError(f"session {r.session_id}: reused, but the build has no parent version")
    return base


def _refs(r: SessionResult, base: _Base | None, shards: dict[str, ShardRecord]) -> list[SampleRef]:
    """Where a session's samples are: its fresh segments, or the parent's shards (reused)."""
    if r.reused:
        refs = []
        for row in _parent_of(r, base).rows[r.session_id]:
            if row.member_bytes is None:  # (parent_base reuses no parent whose rows lack them)
                raise LineageError(f"sample {row.key}: reused from a parent row without member sizes")
            refs.append(SampleRef(row.key, row.sha256, row.member_bytes, parent=shards[row.shard], entry=row.entry()))
        return refs
    return [
        SampleRef(s.row.key, s.row.sha256, s.member_bytes, r.seg_path, s.seg_offset, s.seg_length) for s in r.samples
    ]


def _refuse_all_quarantined(results: list[SessionResult], quarantined: list[Quarantined]) -> None:
    """Nothing to commit, so no report: the reasons go in the message."""
    if any(r.quarantine is None for r in results):
        return
    every = quarantined + [
        r.quarantine for r in sorted(results, key=lambda r: r.session_id) if r.quarantine
    ]  # (all are)
    shown = "; ".join(f"{q.path}: {q.reason}" for q in every[:QUARANTINE_SHOWN])
    more = len(every) - QUARANTINE_SHOWN
    raise CheckFailed(
        f"all {len(every)} sessions were quarantined: {shown}" + (f"; and {more} more" if more > 0 else "")
    )


def _assemble(
    config: ConvertConfig,
    ext: str,
    results: list[SessionResult],
    base: _Base | None,
    shard_plan,
    written: dict,
    quarantined: list[Quarantined],
):
    """Manifest, index bytes, shard moves and session records from the session results and the shard
    plan (bookkeeping)."""
    rows_by_key = {s.row.key: s.row for r in results if not r.reused for s in r.samples}
    # A reused shard holds the same keys and sample hashes in the same order, hence the same bytes, as
    # the parent's shard: the parent's rows (with their locations) describe it, also for samples that
    # were processed again (a sample hash covers everything its row says).
    parent_rows = {row.key: row for rows_ in base.rows.values() for row in rows_} if base else {}
    for r in results:
        if r.reused:
            rows_by_key.update((row.key, row) for row in _parent_of(r, base).rows[r.session_id])
    shards, rows, moves = [], [], []
    for i, (group, reuse) in enumerate(zip(shard_plan.groups, shard_plan.reuse)):
        if reuse is not None:
            shards.append(reuse)
            rows += [parent_rows[ref.key] for ref in group]
            continue
        w = written[i]
        rec = ShardRecord(shard_key(w.sha256, ext), w.sha256, w.bytes, len(w.entries), w.blake3)
        shards.append(rec)
        moves.append((w.tmp_path, rec))
        for e in w.entries:
            rows.append(rows_by_key[e.key].located(rec.path, e))
    sources, sessions = [], []
    for r in results:
        sources += r.sources
        sessions.append(
            _parent_of(r, base).sessions[r.session_id]
            if r.reused
            else SessionRecord(r.session_id, r.rel, len(r.samples), r.controls, r.channels, r.repairs)
        )
    manifest, pinned = version_manifest(config.to_json(), config.format, shards, rows, sources, sessions, quarantined)
    return manifest, pinned, moves, sessions


def version_manifest(
    config: dict,
    shard_format: str,
    shards: list[ShardRecord],
    rows: list[IndexRow],
    sources: list[SourceRecord],
    sessions: list[SessionRecord],
    quarantined: list[Quarantined],
) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest of a version and the files it pins (name -> bytes: index, sessions), from its located
    rows and its sessions' records (shared by convert and derived versions)."""
    controls: set[str] = set()
    channels: set[str] = set()
    titles: Counter[str] = Counter()
    long_clips = repaired = 0
    for rec in sessions:
        controls.update(rec.controls)
        channels.update(rec.telemetry)
        long_clips += rec.repairs["video"]["long_clips"]
        repaired += _is_repaired(rec.repairs)
    rows = sorted(rows, key=lambda x: x.key)
    for row in rows:
        titles[row.title] += 1
    index = index_bytes(rows)
    table = SessionTable(tuple(sessions), tuple(sorted(sources, key=lambda s: s.path))).to_bytes()
    manifest = Manifest(
        tool_version=__version__,
        config=config,
        config_hash=sha256_json(config),
        shard_format=shard_format,
        shards=tuple(shards),
        quarantined=tuple(sorted(quarantined, key=lambda q: (q.path, q.session))),
        index=FilePin(INDEX_FILE, sha256_bytes(index), len(rows), len(index)),
        sessions=FilePin(SESSIONS_FILE, sha256_bytes(table), len(sessions), len(table)),
        schema={"sample_format": SAMPLE_FORMAT, "members": list(MEMBERS), "index_columns": list(INDEX_COLUMNS)},
        vocabulary=Vocabulary(tuple(sorted(controls)), tuple(sorted(channels))),
        stats=Stats(
            samples=len(rows),
            shards=len(shards),
            bytes=sum(s.bytes for s in shards),
            frames=sum(r.frames for r in rows),
            hours=round(sum(r.t_end - r.t_start for r in rows) / 3600, 6),
            sessions=len(sessions),
            quarantined=len(quarantined),
            long_clips=long_clips,
            repaired_sessions=repaired,
            samples_per_title=dict(sorted(titles.items())),
        ),
        content_id=content_id([(r.key, r.sha256) for r in rows]),
    )
    return manifest, {INDEX_FILE: index, SESSIONS_FILE: table}


def change_counts(catalog: Catalog, parent: str | None, index: bytes) -> dict[str, int]:
    """Added / removed / changed samples against the parent (by key and sample hash)."""
    if parent is None:
        return {}

    def pairs(table) -> dict[str, str]:
        return dict(zip(table.column("key").to_pylist(), table.column("sha256").to_pylist()))

    new = pairs(table_from_bytes(index, "index", ["key", "sha256"]))
    try:
        old = pairs(catalog.index(parent, ["key", "sha256"]))
    except LineageError:  # the parent's index is missing or damaged: no counts, never a failed build
        return {}
    return {
        "added": len(new.keys() - old.keys()),
        "removed": len(old.keys() - new.keys()),
        "changed": sum(1 for k in new.keys() & old.keys() if new[k] != old[k]),
    }


def _is_repaired(repairs: dict) -> bool:
    streams = any(
        isinstance(repairs.get(k), dict)
        and (
            repairs[k].get("malformed")
            or repairs[k].get("out_of_order")
            or repairs[k].get("dropped_fields")
            or repairs[k].get("duplicate_keys")
            or repairs[k].get("collisions")
            or repairs[k].get("missing")
            or repairs[k].get("unreadable")
        )
        for k in ("actions", "telemetry", "text")
    )
    video = repairs.get("video") or {}
    return bool(
        streams or video.get("truncated") or video.get("dropped_undecodable") or video.get("restamped_duplicate_pts")
    )

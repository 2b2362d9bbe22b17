"""Derived versions: samples made from another version's samples (re-encoded clips, filtered sets,
outputs of a Ray Data pipeline), committed like a convert, with their lineage.

    samples --(encode_samples, in workers: segments in the build area)--> SampleRefs
            --(convert.assemble: Assembly + assemble_shard)--> shards --(version_manifest, commit)--> catalog

Every derived sample records the version and key it was made from (index columns ``parent_version`` and
``parent_key``); its session must be its parent sample's, so the derived manifest carries the parent's
source files for those sessions and lineage reaches the captures from any version in a chain. The
manifest's config is a ``DeriveConfig`` (parent, the transform as its author describes it, format, shard
size), and the commit record names the parent. Samples are sorted by key and shards cut by content, so
the same samples give the same version id however they were produced or partitioned.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsbuild.convert.assemble import Assembly, SampleRef, assemble_shard
from dsbuild.convert.build import change_counts, version_manifest
from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.executor import ExecutorSpec, run_tasks
from dsbuild.core.records import SHA256, JsonValue, Record, spec
from dsbuild.formats import format_names, get_format
from dsbuild.formats.capture import parse_started_at
from dsbuild.formats.sample import Sample, members_blake3, members_sha256
from dsbuild.formats.shards import WrittenShard
from dsbuild.lineage.catalog import BuildArea, Catalog, CommitRecord
from dsbuild.lineage.index import INDEX_FILE, IndexRow
from dsbuild.lineage.manifest import ShardRecord, shard_key

DEFAULT_SHARD_SIZE = 256_000_000  # as convert's default, when the parent's config names none


@dataclass(frozen=True, slots=True)
class DeriveConfig(Record):
    """A derived version's config (hashed into its manifest like a convert's options)."""

    derived_from: str = field(metadata=spec(pattern=SHA256, doc="the parent version id"))
    transform: JsonValue  # what was done, as its author describes it (name, parameters, code version)
    format: str
    shard_size: int = field(metadata=spec(minimum=1 << 16))

    def __post_init__(self) -> None:
        if self.format not in format_names():
            raise UsageError(f"format must be one of {', '.join(format_names())}, not {self.format!r}")


@dataclass(frozen=True, slots=True)
class DeriveResult(Record):
    version_id: str = field(metadata=spec(pattern=SHA256))
    parent: str = field(metadata=spec(pattern=SHA256))
    existed: bool  # an identical version was already committed
    content_id: str = field(metadata=spec(pattern=SHA256))
    samples: int
    shards: int
    bytes: int


@dataclass(frozen=True)
class DerivedSample:
    """A new sample and the key of the parent-version sample it was made from."""

    sample: Sample
    parent_key: str


@dataclass(frozen=True)
class Encoded:
    """A derived sample as a worker wrote it: where its segment is, and its index row (not located)."""

    ref: SampleRef
    row: IndexRow


def derive_config(
    catalog: Catalog, parent: str, transform: JsonValue, *, format: str | None = None, shard_size: int | None = None
) -> DeriveConfig:
    """Options for a version derived from ``parent`` (a resolved id): the parent's format and shard size
    unless given."""
    m = catalog.manifest(parent)
    inherited = m.config.get("shard_size") if isinstance(m.config, dict) else None
    return DeriveConfig(
        parent,
        transform,
        format or m.shard_format,
        shard_size or (inherited if isinstance(inherited, int) else DEFAULT_SHARD_SIZE),
    )


def _check(s: Sample) -> None:
    m = s.meta
    if m.key != s.key:
        raise FormatError(f"{s.key}: its metadata names key {m.key!r}")
    frames = m.clip.frames
    shapes = {
        "actions": (s.actions.shape, (frames, len(m.controls))),
        "telemetry": (s.telemetry.shape, (frames, len(m.telemetry_channels))),
        "timestamps": (s.timestamps.shape, (frames,)),
    }
    for name, (got, want) in shapes.items():
        if tuple(got) != want:
            raise FormatError(f"{s.key}: {name} has shape {tuple(got)}, its metadata says {want}")


def _row(s: Sample, sha256: str, blake3: str, size: int, parent_version: str, parent_key: str) -> IndexRow:
    m = s.meta
    ses, clip, video = m.session, m.clip, m.video
    return IndexRow(
        key=s.key,
        sha256=sha256,
        shard="",
        session_id=ses.session_id,
        title=ses.title,
        player=ses.player,
        platform=ses.platform,
        build=ses.build,
        started_at=parse_started_at(ses.started_at),
        conditions=tuple(sorted(ses.conditions.items())),
        clip_index=clip.index,
        t_start=clip.t_start,
        t_end=clip.t_end,
        frames=clip.frames,
        fps=video.fps,
        width=video.width,
        height=video.height,
        codec=video.codec,
        has_audio=video.has_audio,
        n_controls=len(m.controls),
        n_channels=len(m.telemetry_channels),
        video_bytes=len(s.video),
        bytes=size,
        action_events=m.action_events,
        text_events=len(m.text),
        source_video_sha256=m.sources.get("video", ""),
        parent_version=parent_version,
        parent_key=parent_key,
        blake3=blake3,
    )


def encode_samples(samples: Iterable[DerivedSample], config: DeriveConfig, seg_path: Path) -> list[Encoded]:
    """Write the samples' segments into one file (runs in a worker; ``seg_path`` is in the build area)."""
    fmt = get_format(config.format)
    out, offset = [], 0
    with open(seg_path, "wb") as f:
        for d in samples:
            s = d.sample
            _check(s)
            members = s.members()
            digest = members_sha256(members)
            seg = fmt.encode(s.key, digest, members)
            f.write(seg.data)
            out.append(
                Encoded(
                    SampleRef(s.key, digest, seg.member_bytes, seg_path, offset, len(seg.data)),
                    _row(
                        s,
                        digest,
                        members_blake3(members),
                        sum(len(p) for _, p in members),
                        config.derived_from,
                        d.parent_key,
                    ),
                )
            )
            offset += len(seg.data)
    return out


def _lineage(catalog: Catalog, parent: str, encoded: list[Encoded]):
    """The parent's session and source records of the derived samples' sessions; refuses a sample whose
    parent key is not in the parent version or whose session is not its parent sample's."""
    table = catalog.index(parent, ["key", "session_id"])
    session_of = dict(zip(table.column("key").to_pylist(), table.column("session_id").to_pylist()))
    counts: dict[str, int] = {}
    for e in encoded:
        r = e.row
        if r.parent_key not in session_of:
            raise UsageError(f"{r.key}: parent key {str(r.parent_key)[:100]!r} is not in version {parent[:12]}")
        if session_of[r.parent_key] != r.session_id:
            raise UsageError(
                f"{r.key}: session {r.session_id!r} is not its parent sample's "
                f"({session_of[r.parent_key]!r}); a derived sample keeps its parent's session"
            )
        counts[r.session_id] = counts.get(r.session_id, 0) + 1
    table = catalog.sessions(parent)
    sessions = [replace(s, samples=counts[s.session_id]) for s in table.sessions if s.session_id in counts]
    sources = [s for s in table.sources if s.session in counts]
    return sessions, sources


def commit_derived(
    catalog: Catalog,
    area: BuildArea,
    config: DeriveConfig,
    encoded: list[Encoded],
    *,
    executor: ExecutorSpec = ExecutorSpec(workers=1),
) -> DeriveResult:
    """Assemble the encoded samples into shards and commit the derived version (manifest last)."""
    keys = [e.row.key for e in encoded]
    if not keys:
        raise UsageError("a derived version needs at least one sample")
    if len(set(keys)) != len(keys):
        dup = sorted(k for k in set(keys) if keys.count(k) > 1)[0]
        raise UsageError(f"key {dup!r} appears more than once; keys of a version are unique")
    parent = config.derived_from
    sessions, sources = _lineage(catalog, parent, encoded)
    fmt = get_format(config.format)
    tasks = Assembly(
        (), [e.ref for e in encoded], fmt, config.format, config.shard_size, {}, area.path, catalog.shard_file
    ).finish()
    written: dict[int, WrittenShard] = {}
    run_tasks(
        assemble_shard, tasks, executor, lambda i, w: written.__setitem__(i, w), describe=lambda t: f"shard {t.number}"
    )
    rows_by_key = {e.row.key: e.row for e in encoded}
    shards, rows, moves = [], [], []
    for i in range(len(tasks)):
        w = written[i]
        rec = ShardRecord(shard_key(w.sha256, fmt.ext), w.sha256, w.bytes, len(w.entries), w.blake3)
        shards.append(rec)
        moves.append((w.tmp_path, rec))
        rows += [rows_by_key[e.key].located(rec.path, e) for e in w.entries]
    manifest, pinned = version_manifest(config.to_json(), config.format, shards, rows, sources, sessions, [])
    commit = CommitRecord(
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        0,
        parent,
        None,
        config.format,
        manifest.stats.samples,
        manifest.stats.bytes,
        manifest.content_id,
        change_counts(catalog, parent, pinned[INDEX_FILE]),
    )
    vid, existed = catalog.commit(area, moves, manifest, pinned, commit)
    st = manifest.stats
    return DeriveResult(
        version_id=vid,
        parent=parent,
        existed=existed,
        content_id=manifest.content_id,
        samples=st.samples,
        shards=st.shards,
        bytes=st.bytes,
    )


def derive(
    catalog: Catalog,
    parent: str,
    samples: Iterable[DerivedSample],
    transform: JsonValue,
    *,
    format: str | None = None,
    shard_size: int | None = None,
) -> DeriveResult:
    """Commit a version of ``samples`` derived from version ``parent`` (a ref), in this process."""
    vid = catalog.resolve(parent)
    config = derive_config(catalog, vid, transform, format=format, shard_size=shard_size)
    with catalog.build_area() as area:
        encoded = encode_samples(samples, config, area.path / "derived.seg")
        return commit_derived(catalog, area, config, encoded)

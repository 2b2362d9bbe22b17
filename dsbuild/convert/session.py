"""One session -> a segment file of encoded samples. Runs inside a worker; returns a small, plain result.

Everything a session produces depends only on the session's files and the config, never on which worker
ran it or when: that is what makes builds byte-identical for any ``--workers``. Shards are assembled
later from the segments of all sessions (``convert.assemble``), so workers stay independent.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from dsbuild.convert.config import ConvertConfig
from dsbuild.core.errors import CaptureError, FormatError, StorageError
from dsbuild.core.files import UnsafeFile
from dsbuild.core.hashcache import hashed
from dsbuild.core.jsonio import canonical_json, clip_text
from dsbuild.formats import get_format
from dsbuild.formats.capture import SESSION_FILE, Session, parse_started_at
from dsbuild.formats.sample import (
    ClipAudio,
    ClipVideo,
    ClipWindow,
    ContinuousControl,
    Sample,
    SampleMeta,
    SessionFields,
    TextEvent,
    members_blake3,
    members_sha256,
    sample_key,
)
from dsbuild.formats.streams import ActionTrack, TelemetryTrack, TextTrack, scan
from dsbuild.formats.video import DemuxReport, VideoSource
from dsbuild.lineage.index import IndexRow
from dsbuild.lineage.manifest import Quarantined, SourceRecord


@dataclass(frozen=True)
class SessionJob:
    session: Session
    root: Path  # the capture root (every file read must resolve inside it)
    seg_dir: Path  # where the segment file goes (the build area)
    config: ConvertConfig
    # Source files of this session in the parent version (same config): equal sources => reuse its samples.
    parent_sources: frozenset[tuple] | None = None


@dataclass(frozen=True)
class SampleOut:
    """A sample as written to the segment file: its index row (no location yet) and where its segment is."""

    row: IndexRow
    seg_offset: int
    seg_length: int
    member_bytes: tuple[int, ...]


@dataclass
class SessionResult:
    """What the build needs from one session: its samples (in a segment file), sources and reports."""

    rel: str
    session_id: str
    sources: list[SourceRecord] = field(default_factory=list)
    samples: list[SampleOut] = field(default_factory=list)
    seg_path: Path | None = None
    controls: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    repairs: dict = field(default_factory=dict)
    quarantine: Quarantined | None = None
    video_bytes: int = 0
    reused: bool = False  # unchanged since the parent version: its samples are taken from the parent


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def source_roles(session: Session) -> list[tuple[str, str]]:
    """(role, file name) of every source file a session names."""
    return [("session", SESSION_FILE), ("video", session.video)] + sorted(session.streams.items())


def hash_sources(session: Session, root: Path) -> tuple[list[SourceRecord], dict[Path, tuple]]:
    """sha256 of every source file (paths relative to the capture root, never host paths), and the
    (size, mtime, inode) each had when it was hashed, to detect files that change while read.
    Unchanged files come from the per-machine hash cache (``core.hashcache``)."""
    out, seen = [], {}
    for role, name in source_roles(session):
        path = session.path_of(name)
        if not path.exists():
            if role == "video":
                raise CaptureError(session.rel_of(name), "video file is missing")
            continue
        try:
            digest, size, st = hashed(path, root)
        except UnsafeFile as e:
            raise CaptureError(session.rel_of(name), str(e).split(": ", 1)[-1]) from None
        except OSError as e:
            raise CaptureError(session.rel_of(name), f"cannot read: {e.strerror or e}") from None
        if size != st.st_size:
            raise CaptureError(session.rel_of(name), "changed while reading (size changed during hashing)")
        seen[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
        out.append(SourceRecord(session.session_id, role, session.rel_of(name), digest, size))
    return out, seen


def _identities(session: Session) -> dict[Path, tuple | None]:
    """Each source file's (size, mtime, inode) before the session's work reads or hashes any of it; for
    ``session.json``, as the main process parsed it."""
    out: dict[Path, tuple | None] = {}
    for _, name in source_roles(session):
        path = session.path_of(name)
        try:
            out[path] = _identity(path)
        except OSError:
            out[path] = None
    if session.read_as is not None:
        out[session.path_of(SESSION_FILE)] = session.read_as
    return out


def _check_unchanged(session: Session, seen: dict[Path, tuple], before: dict[Path, tuple | None]) -> None:
    """Every file hashed is the file that was read: as it was before the work began (``before``), when it
    was hashed (``seen``) and now. A change between the read and the hash (an editor saving while the
    video is still being hashed) would otherwise commit the old contents under the new file's hash, and
    every later build would reuse them."""
    for path, hashed_as in seen.items():
        try:
            now = _identity(path)
        except OSError:
            now = None
        if not now == hashed_as == before.get(path, hashed_as):
            raise CaptureError(
                session.rel_of(path.relative_to(session.directory).as_posix()),
                "changed while reading (size or modification time differ from when it was "
                "read or hashed); convert again once the capture is complete",
            )


def source_set(sources: list[SourceRecord]) -> frozenset[tuple]:
    """Order-free identity of a session's inputs: (role, path, sha256, bytes) of every file."""
    return frozenset((s.role, s.path, s.sha256, s.bytes) for s in sources)


def _events_blob(events: list[tuple], controls: tuple[str, ...], compressor: zstandard.ZstdCompressor) -> bytes:
    lines = [canonical_json({"t": t, "control": c, "value": v}) for t, c, v in events]
    return compressor.compress(b"\n".join(lines) + (b"\n" if lines else b""))


def process_session(job: SessionJob) -> SessionResult:
    """Cut and encode one session into its segment file; a CaptureError quarantines it with the reason."""
    session = job.session
    result = SessionResult(rel=session.rel, session_id=session.session_id)
    seg_path = job.seg_dir / f"{session.session_id}.seg"
    try:
        before = _identities(session)
        # Source hashing runs in a thread beside demux/remux (hashlib and most of PyAV release the GIL).
        with ThreadPoolExecutor(1, "dsbuild-hash") as hasher:
            sources = hasher.submit(hash_sources, session, job.root)
            if job.parent_sources is not None and source_set(sources.result()[0]) == job.parent_sources:
                result.sources, result.reused = sources.result()[0], True
                return result
            try:
                with open(seg_path, "wb") as seg:
                    _process(job, seg, result, sources, before)
            except OSError as e:
                if isinstance(e, PermissionError) or e.filename not in (None, str(seg_path)):
                    raise
                raise StorageError(
                    f"cannot write {seg_path}: {e.strerror or e}",
                    hint="check free space and permissions, then run the command again",
                ) from None
        result.seg_path = seg_path
    except StorageError:
        seg_path.unlink(missing_ok=True)
        raise
    except Exception as e:  # one bad capture never stops a build: quarantine it with the reason
        seg_path.unlink(missing_ok=True)
        result.quarantine = Quarantined(session.session_id, *_reason(session, e))
        result.samples, result.seg_path = [], None
    return result


def _reason(session: Session, e: Exception) -> tuple[str, str]:
    if isinstance(e, CaptureError):
        return e.path, clip_text(e.reason, 400)
    if isinstance(e, FormatError):
        return session.rel_of(session.video), clip_text(str(e), 400)
    if isinstance(e, OSError):
        where = Path(e.filename).name if e.filename else session.rel
        return (session.rel_of(where) if e.filename else where), clip_text(e.strerror or str(e), 400)
    return session.rel_of(session.video), clip_text(f"unexpected {type(e).__name__}: {e}", 400)


def _clip_video(info, clip) -> ClipVideo:
    """The clip's encoding for its metadata; audio placement relative to the clip's first video frame."""
    a = clip.audio
    audio = (
        None
        if a is None
        else ClipAudio(
            a.codec, a.sample_rate, a.channels, start=a.t_start - float(clip.frame_t[0]), duration=a.t_end - a.t_start
        )
    )
    return ClipVideo(
        info.codec,
        clip.width,
        clip.height,
        info.fps,
        codec_tag=info.codec_tag,
        has_audio=audio is not None,
        audio=audio,
    )


def _continuous(session: Session, controls: tuple[str, ...]) -> dict[str, ContinuousControl] | None:
    """The declared continuous controls among a session's action columns (None: none, and the samples'
    metadata is what it was before continuous controls existed)."""
    specs = {
        c: ContinuousControl(session.controls[c].get("unit"), _range(session.controls[c].get("range")))
        for c in controls
        if c in session.continuous
    }
    return specs or None


def _range(value: list | None) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(x) for x in value)


def _stream(session: Session, kind: str, root: Path):
    name = session.streams.get(kind)
    if not name:
        return scan(None, kind, root)
    try:
        return scan(session.path_of(name), kind, root, session.continuous if kind == "actions" else frozenset())
    except UnsafeFile as e:
        raise CaptureError(session.rel_of(name), str(e).split(": ", 1)[-1]) from None
    except OSError as e:
        raise CaptureError(session.rel_of(name), f"cannot read: {e.strerror or e}") from None


def _process(job: SessionJob, seg, result: SessionResult, sources: Future, before: dict[Path, tuple | None]) -> None:
    session, config, root = job.session, job.config, job.root
    fmt = get_format(config.format)
    scans = {k: _stream(session, k, root) for k in ("actions", "telemetry", "text")}
    actions, telemetry = ActionTrack(scans["actions"], root), TelemetryTrack(scans["telemetry"], root)
    text = TextTrack(scans["text"], root)
    result.controls, result.channels = actions.controls, telemetry.channels
    continuous = _continuous(session, actions.controls)
    compressor = zstandard.ZstdCompressor(level=config.zstd_level, write_checksum=True)
    fields = SessionFields(
        session.session_id,
        session.title,
        session.player,
        session.platform,
        session.build,
        session.started_at,
        dict(session.conditions),
    )
    demux = DemuxReport()
    try:
        video_source = VideoSource(
            session.path_of(session.video), audio=config.audio, transcode=config.transcode
        ).__enter__()
    except FormatError as e:
        raise CaptureError(session.rel_of(session.video), str(e)) from None
    source_list, seen = None, None
    try:
        info = video_source.info
        for clip in video_source.clips(config.clip_seconds, demux):
            video = clip.data
            if source_list is None:
                source_list, seen = sources.result()
            frame_t = clip.frame_t
            key = sample_key(session.session_id, clip.index)
            dense, raw = actions.clip(frame_t, clip.t_start, clip.t_end)
            texts = text.clip(clip.t_start, clip.t_end)
            meta = SampleMeta(
                key=key,
                session=fields,
                clip=ClipWindow(clip.index, clip.t_start, clip.t_end, len(frame_t), clip.t_end - clip.t_start),
                video=_clip_video(info, clip),
                controls=actions.controls,
                telemetry_channels=telemetry.channels,
                text=tuple(TextEvent(e["t"], e["text"], e["speaker"]) for e in texts),
                action_events=len(raw),
                sources={s.role: s.sha256 for s in source_list},
                continuous=continuous,
            )
            sample = Sample(
                key,
                meta,
                video,
                dense,
                telemetry.clip(frame_t, clip.t_start, clip.t_end),
                frame_t,
                _events_blob(raw, actions.controls, compressor),
            )
            members = sample.members()
            digest = members_sha256(members)
            segment = fmt.encode(key, digest, members)
            offset = seg.tell()
            seg.write(segment.data)
            result.video_bytes += len(video)
            result.samples.append(
                SampleOut(
                    IndexRow(
                        key=key,
                        sha256=digest,
                        shard="",
                        session_id=session.session_id,
                        title=session.title,
                        player=session.player,
                        platform=session.platform,
                        build=session.build,
                        started_at=parse_started_at(session.started_at),
                        conditions=tuple(sorted(session.conditions.items())),
                        clip_index=clip.index,
                        t_start=clip.t_start,
                        t_end=clip.t_end,
                        frames=len(frame_t),
                        fps=info.fps,
                        width=clip.width,
                        height=clip.height,
                        codec=info.codec,
                        has_audio=clip.audio is not None,
                        n_controls=len(actions.controls),
                        n_channels=len(telemetry.channels),
                        video_bytes=len(video),
                        bytes=sum(len(p) for _, p in members),
                        action_events=len(raw),
                        text_events=len(texts),
                        source_video_sha256=meta.sources["video"],
                        blake3=members_blake3(members),
                    ),
                    offset,
                    len(segment.data),
                    segment.member_bytes,
                )
            )
    finally:
        video_source.__exit__(None, None, None)
    if not result.samples or source_list is None or seen is None:  # (both are set with the first clip)
        why = demux.truncated or "no decodable frames"
        raise CaptureError(session.rel_of(session.video), f"video yielded no clips ({why})")
    result.sources = source_list
    _check_unchanged(session, seen, before)
    for kind, track in (("actions", actions), ("telemetry", telemetry), ("text", text)):
        scans[kind].report.outside_video = track.outside()
    result.repairs = {k: s.report.to_json() for k, s in scans.items()}
    result.repairs.update(video=demux.to_json(), audio_not_carried=demux.audio_not_carried)

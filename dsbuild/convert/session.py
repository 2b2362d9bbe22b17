"""One session -> shards of clips. Runs inside a worker process; returns a small, plain result.

Everything a session produces depends only on the session's files and the config, never on which worker
ran it or when: that is what makes builds byte-identical for any ``--workers``.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import zstandard

from dsbuild.convert.config import ConvertConfig
from dsbuild.convert.resample import dense_actions, resample_telemetry, window
from dsbuild.errors import CaptureError, FormatError, StorageError
from dsbuild.formats.capture import SESSION_FILE, Session
from dsbuild.formats.sample import SAMPLE_FORMAT, Sample, members_sha256, sample_key
from dsbuild.formats.safejson import canonical_json
from dsbuild.formats.shards import ShardWriter, WrittenShard
from dsbuild.formats.streams import Actions, read_actions, read_telemetry, read_text
from dsbuild.formats.video import DemuxReport, VideoSource
from dsbuild.lineage.hashing import sha256_file


@dataclass(frozen=True)
class SessionJob:
    session: Session
    tmp_dir: Path
    config: ConvertConfig
    # Source files of this session in the parent version (same config): equal sources => reuse its shards.
    parent_sources: frozenset[tuple] | None = None


@dataclass
class SessionResult:
    """What the build needs from one session: its shards (still temporary), index rows, and reports."""

    rel: str
    session_id: str
    sources: list[dict] = field(default_factory=list)
    shards: list[WrittenShard] = field(default_factory=list)
    shard_records: list = field(default_factory=list)  # reused sessions: the parent's ShardRecords
    rows: list[dict] = field(default_factory=list)  # per-sample index rows; "shard" is a local number
    controls: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    repairs: dict = field(default_factory=dict)
    quarantine: dict | None = None
    video_bytes: int = 0
    reused: bool = False  # unchanged since the parent version: its shards and index rows are taken as they are

    @property
    def samples(self) -> int:
        return len(self.rows)


def make_writer(config: ConvertConfig, tmp_dir: Path, stem: str) -> ShardWriter:
    if config.format == "parquet":
        from dsbuild.formats.parquet import ParquetShardWriter

        return ParquetShardWriter(tmp_dir, stem, config.shard_size,
                                  row_group_samples=config.parquet_row_group_samples)
    from dsbuild.formats.webdataset import TarShardWriter

    return TarShardWriter(tmp_dir, stem, config.shard_size)


def _sources(session: Session) -> list[dict]:
    """sha256 of every source file, paths relative to the capture root (never host paths)."""
    roles = [("session", SESSION_FILE), ("video", session.video)] + sorted(session.streams.items())
    out = []
    for role, name in roles:
        path = session.path_of(name)
        if not path.is_file():
            if role == "video":
                raise CaptureError(session.rel_of(name), "video file is missing")
            continue
        try:
            digest, size = sha256_file(path)
        except OSError as e:
            raise CaptureError(session.rel_of(name), f"cannot read: {e.strerror}") from None
        out.append({"role": role, "path": session.rel_of(name), "sha256": digest, "bytes": size})
    return out


def source_set(sources: list[dict]) -> frozenset[tuple]:
    """Order-free identity of a session's inputs: (role, path, sha256, bytes) of every file."""
    return frozenset((s["role"], s["path"], s["sha256"], s["bytes"]) for s in sources)


def _events_blob(actions: Actions, sl: slice, compressor: zstandard.ZstdCompressor) -> bytes:
    lines = [canonical_json({"t": float(t), "control": actions.controls[c], "value": float(v)})
             for t, c, v in zip(actions.t[sl], actions.control[sl], actions.value[sl])]
    return compressor.compress(b"\n".join(lines) + (b"\n" if lines else b""))


def process_session(job: SessionJob) -> SessionResult:
    """Cut, encode and write one session; a CaptureError quarantines it with a precise reason."""
    session, config = job.session, job.config
    result = SessionResult(rel=session.rel, session_id=session.session_id)
    writer = make_writer(config, job.tmp_dir, session.session_id)
    try:
        # A pipeline of threads (hashlib, file writes and much of PyAV release the GIL): one hashes the
        # source files, this one demuxes/remuxes clips and hashes samples, one writes and hashes shards.
        with ThreadPoolExecutor(1, "dsbuild-hash") as hasher, ThreadPoolExecutor(1, "dsbuild-write") as io:
            sources = hasher.submit(_sources, session)
            if job.parent_sources is not None and source_set(sources.result()) == job.parent_sources:
                result.sources, result.reused = sources.result(), True
                return result
            _process(session, config, writer, result, io, sources)
        result.shards = writer.close()
    except StorageError:
        writer.abort()
        raise
    except Exception as e:  # one bad capture never stops a build: quarantine it with the reason
        writer.abort()
        result.quarantine = {"session": session.session_id, **_reason(session, e)}
        result.rows, result.shards = [], []
    return result


def _reason(session: Session, e: Exception) -> dict:
    if isinstance(e, CaptureError):
        return {"path": e.path, "reason": e.reason}
    if isinstance(e, FormatError):
        return {"path": session.rel_of(session.video), "reason": str(e)}
    if isinstance(e, OSError):
        return {"path": e.filename or session.rel, "reason": e.strerror or str(e)}
    return {"path": session.rel_of(session.video), "reason": f"unexpected {type(e).__name__}: {e}"}


def _process(session: Session, config: ConvertConfig, writer: ShardWriter, result: SessionResult,
             io: ThreadPoolExecutor, sources: Future) -> None:
    stream_path = {k: session.path_of(v) for k, v in session.streams.items()}
    actions, a_rep = read_actions(stream_path.get("actions"))
    telemetry, t_rep = read_telemetry(stream_path.get("telemetry"))
    text, x_rep = read_text(stream_path.get("text"))
    result.controls, result.channels = actions.controls, telemetry.channels
    compressor = zstandard.ZstdCompressor(level=config.zstd_level, write_checksum=True)
    text_t = np.array([e.t for e in text], dtype=np.float64)
    demux = DemuxReport()
    video_path = session.path_of(session.video)
    try:
        source = VideoSource(video_path, audio=config.audio, transcode=config.transcode).__enter__()
    except FormatError as e:
        raise CaptureError(session.rel_of(session.video), str(e)) from None
    pending: deque[Future] = deque()
    try:
        info = source.info
        for clip in source.clips(config.clip_seconds, demux):
            video, frame_t = clip.data, clip.frame_t
            key = sample_key(session.session_id, clip.index)
            sl = window(actions.t, clip.t_start, clip.t_end)
            tsl = window(text_t, clip.t_start, clip.t_end)
            meta = {
                "format": SAMPLE_FORMAT,
                "key": key,
                "session": session.fields(),
                "clip": {"index": clip.index, "t_start": clip.t_start, "t_end": clip.t_end,
                         "frames": len(frame_t), "duration": clip.t_end - clip.t_start},
                "video": info.to_json(clip.audio),
                "controls": list(actions.controls),
                "telemetry_channels": list(telemetry.channels),
                "text": [e.to_json() for e in text[tsl]],
                "action_events": sl.stop - sl.start,
            }
            draft = Sample(
                key=key, meta=meta, video=video, video_ext=info.ext,
                actions=dense_actions(actions, frame_t),
                telemetry=resample_telemetry(telemetry, frame_t),
                timestamps=frame_t, events=_events_blob(actions, sl, compressor),
            )
            row = {
                "key": key, "session_id": session.session_id, "title": session.title, "player": session.player,
                "platform": session.platform, "build": session.build,
                "conditions": canonical_json(session.conditions).decode(),
                "clip_index": clip.index, "t_start": clip.t_start, "t_end": clip.t_end,
                "frames": len(frame_t), "fps": info.fps, "width": info.width, "height": info.height,
                "codec": info.codec, "video_bytes": len(video),
                "action_events": sl.stop - sl.start, "text_events": tsl.stop - tsl.start,
            }
            if not result.sources:
                result.sources = sources.result()
            source_hashes = {s["role"]: s["sha256"] for s in result.sources}
            sample = replace(draft, meta={**draft.meta, "sources": source_hashes})
            members = sample.members()
            digest = members_sha256(members)
            row.update(sha256=digest, bytes=sum(len(p) for _, p in members),
                       source_video_sha256=source_hashes["video"])
            pending.append(io.submit(_write, sample, members, row, writer, result))
            while len(pending) > 2:  # bounds memory to a few clips in flight
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        source.__exit__(None, None, None)
    if not result.rows:
        why = demux.truncated or "no decodable frames"
        raise CaptureError(session.rel_of(session.video), f"video yielded no clips ({why})")
    result.repairs = {"actions": a_rep.to_json(), "telemetry": t_rep.to_json(), "text": x_rep.to_json(),
                      "video": demux.to_json(), "audio_not_carried": demux.audio_not_carried}


def _write(sample: Sample, members: list[tuple[str, bytes]], row: dict, writer: ShardWriter,
           result: SessionResult) -> None:
    """The write stage (one thread, so clips stay in order): append to the shard, record the row."""
    writer.add(sample, members, row["sha256"])
    result.video_bytes += len(sample.video)
    result.rows.append({**row, "shard": len(writer.shards)})

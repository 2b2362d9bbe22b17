"""`dsbuild import lerobot`: a LeRobot dataset folder as the ``lerobot`` package writes it, one session per
episode. Both layouts in use (``codebase_version`` in ``meta/info.json``):

    v2.1  data/chunk-000/episode_000000.parquet              one episode per file
          videos/chunk-000/<camera>/episode_000000.mp4
          meta/info.json, meta/episodes.jsonl, meta/tasks.jsonl
    v3.0  data/chunk-000/file-000.parquet                    many episodes per file
          videos/<camera>/chunk-000/file-000.mp4             episodes one after another: meta/episodes/
          meta/info.json, meta/episodes/chunk-000/file-000.parquet, meta/tasks.parquet

Each camera (a ``video`` feature, cut out of its file by the episode's ``from_timestamp``/``to_timestamp``
in v3.0, or an ``image`` feature whose pictures sit in the parquet) becomes one H.264 stream of the
session's ``video.mp4``, on the dataset's own clock (1/fps): frame k of the episode is shown at k/fps, and
every row of the parquet is placed at its ``timestamp`` on that grid, so ``fps`` and times are kept exactly.
``action`` becomes actions (each element a declared continuous control: ``action.0``, ...), the other
numeric features (``observation.state``, ...) telemetry, and the task of each row's ``task_index`` the
``task`` condition and a text event where it changes. Nothing is resampled or guessed silently: a row off
the fps grid, a frame that falls on another's time, a value that is not a finite float32 is dropped, named
with its file and row, and counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from heapq import merge
from pathlib import Path
from typing import Any

from dsbuild.core.errors import UsageError
from dsbuild.importers.common import (
    H264Writer,
    ImportReport,
    SessionReport,
    jsonl,
    read_lines,
    session_id,
    staged,
    write_session,
)

SUPPORTED = ("v2.1", "v3.0")
BOOKKEEPING = frozenset(["timestamp", "frame_index", "episode_index", "index", "task_index"])
NUMERIC = re.compile(r"(float|int|uint)(8|16|32|64)")
F32_MAX = 3.4028234663852886e38
MAX_META = 16 << 20  # meta/info.json: a few KB as written
MAX_VALUES = 4096  # elements of one feature (the contract's list limit)
MAX_FPS = 1000
MAX_T = 1e7  # seconds into an episode (115 days): a later timestamp is no frame's
GRID = 1e-4  # seconds: a timestamp this close to k/fps is frame k (LeRobot's own tolerance_s)
PATH_FIELD = re.compile(r"\{(episode_chunk|episode_index|video_key|chunk_index|file_index)(:0?\d{1,2}d)?\}")
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class LeRobotImport:
    title: str | None = None  # default: the dataset folder's name (a guess, counted)
    player: str | None = None  # default: info.json's robot_type, else "unknown" (a guess, counted)
    conditions: tuple[tuple[str, str], ...] = ()
    camera: str | None = None  # the camera whose stream comes first (default: the first in info.json)
    crf: int = 18


@dataclass(frozen=True)
class Dataset:
    """What ``meta/`` says: version, clock, features by role, and where an episode's files are."""

    root: Path
    version: str
    fps: int
    robot_type: str | None
    cameras: tuple[str, ...]  # video and image features, primary first
    videos: frozenset[str]  # those stored as video files (the rest: pictures in the parquet)
    actions: tuple[str, ...]
    telemetry: tuple[str, ...]
    data_path: str
    video_path: str | None
    chunks_size: int
    tasks: dict[int, str]


@dataclass(frozen=True)
class Episode:
    index: int
    data: str  # relative path of its parquet file
    videos: dict[str, tuple[str, float, float]]  # camera -> (relative path, from_timestamp, to_timestamp)


def _template(info: dict, key: str, required: bool) -> str | None:
    value = info.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or "\x00" in value:
        raise UsageError(f"meta/info.json: {key} {value!r} is not a path template", hint="is this a LeRobot dataset?")
    rest = PATH_FIELD.sub("", value)
    if "{" in rest or "}" in rest or value.startswith("/") or ".." in value.split("/"):
        raise UsageError(f"meta/info.json: {key} {value!r} is not a path template of this layout")
    return value


def _file(root: Path, rel: str) -> Path:
    """``rel`` under ``root``, never outside it (the templates come from the dataset)."""
    path = root / rel
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{rel}: leads outside the dataset")
    return path


def _json(path: Path) -> Any:
    if path.stat().st_size > MAX_META:
        raise UsageError(f"{path}: over {MAX_META} bytes")
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{path}: not JSON ({e})") from None


def read_meta(root: Path, camera: str | None) -> Dataset:
    """The dataset's ``meta/``; UsageError names the file and what is wrong (a version not supported)."""
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise UsageError(f"{root}: no meta/info.json", hint="name a LeRobot dataset folder (v2.1 or v3.0)")
    info = _json(info_path)
    if not isinstance(info, dict):
        raise UsageError(f"{info_path}: not a JSON object")
    version = info.get("codebase_version")
    if version not in SUPPORTED:
        raise UsageError(
            f"{info_path}: codebase_version {version!r} is not supported; supported: {', '.join(SUPPORTED)}",
            hint="convert it with lerobot's scripts: v2.0 to v2.1 with lerobot 0.3 "
            "(lerobot.datasets.v21.convert_dataset_v20_to_v21), v2.1 to v3.0 with 0.4 (v30.convert_dataset_v21_to_v30)",
        )
    fps, features = info.get("fps"), info.get("features")
    if isinstance(fps, float) and fps.is_integer():
        fps = int(fps)
    if not isinstance(fps, int) or isinstance(fps, bool) or not 0 < fps <= MAX_FPS:
        raise UsageError(f"{info_path}: fps {fps!r} is not a whole number of frames per second up to {MAX_FPS}")
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        raise UsageError(f"{info_path}: features is not an object of objects")
    cameras = [k for k, f in features.items() if f.get("dtype") in ("video", "image")]
    if camera is not None:
        if camera not in cameras:
            raise UsageError(f"--camera {camera}: not a camera of this dataset; its cameras: {', '.join(cameras)}")
        cameras.remove(camera)
        cameras.insert(0, camera)
    if not cameras:
        raise UsageError(f"{info_path}: no video or image feature: a session needs a video")
    numeric = [k for k, f in features.items() if k not in BOOKKEEPING and NUMERIC.fullmatch(str(f.get("dtype")))]
    chunks = info.get("chunks_size", 1000)
    if not isinstance(chunks, int) or chunks <= 0:
        raise UsageError(f"{info_path}: chunks_size {chunks!r} is not a positive whole number")
    robot = info.get("robot_type")
    videos = frozenset(k for k in cameras if features[k]["dtype"] == "video")
    return Dataset(
        root,
        version,
        fps,
        robot if isinstance(robot, str) and 0 < len(robot) <= 1024 else None,
        tuple(cameras),
        videos,
        tuple(k for k in numeric if k == "action"),
        tuple(k for k in numeric if k != "action"),
        _template(info, "data_path", True) or "",
        _template(info, "video_path", bool(videos)),
        chunks,
        _tasks(root, version),
    )


def _tasks(root: Path, version: str) -> dict[int, str]:
    """task_index -> task text (meta/tasks.jsonl in v2.1, meta/tasks.parquet in v3.0)."""
    tasks: dict[int, str] = {}
    if version == "v2.1":
        path = root / "meta" / "tasks.jsonl"
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        for lineno, text in read_lines(path):
            try:
                row = json.loads(text) if text is not None else None
            except ValueError:
                row = None
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("task_index"), int)
                or not isinstance(row.get("task"), str)
            ):
                raise UsageError(f'{path}:{lineno}: not a {{"task_index": int, "task": str}} line')
            tasks[row["task_index"]] = row["task"]
        return tasks
    table = _parquet(root / "meta" / "tasks.parquet", None, UsageError)
    texts = [
        c
        for c in table.column_names
        if c != "task_index" and str(table.schema.field(c).type) in ("string", "large_string")
    ]
    if "task_index" not in table.column_names or len(texts) != 1:
        raise UsageError(
            f"{root / 'meta' / 'tasks.parquet'}: expected task_index and one text column, found {table.column_names}"
        )
    for i, text in zip(table.column("task_index").to_pylist(), table.column(texts[0]).to_pylist(), strict=True):
        if isinstance(i, int) and isinstance(text, str):
            tasks[i] = text
    return tasks


def _parquet(path: Path, columns: list[str] | None, error: type[Exception] = ValueError):
    """A parquet file's table; ``error`` names the file when it is missing or does not parse."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise error(f"{path.name}: no such file")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise error(f"not a readable parquet file ({type(e).__name__}: {str(e)[:160]})") from None


def _format(template: str, **fields: object) -> str:
    return PATH_FIELD.sub(lambda m: format(fields[m.group(1)], (m.group(2) or ":")[1:]), template)


def episodes(ds: Dataset) -> list[Episode]:
    """The dataset's episodes in index order, with the files that hold them."""
    if ds.version == "v2.1":
        path = ds.root / "meta" / "episodes.jsonl"
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        found = []
        for lineno, text in read_lines(path):
            try:
                row = json.loads(text) if text is not None else None
            except ValueError:
                row = None
            ep = row.get("episode_index") if isinstance(row, dict) else None
            if not isinstance(ep, int) or ep < 0:
                raise UsageError(f"{path}:{lineno}: no episode_index")
            chunk = ep // ds.chunks_size
            rel = _format(ds.data_path, episode_chunk=chunk, episode_index=ep)
            videos = {
                k: (_format(ds.video_path or "", episode_chunk=chunk, video_key=k, episode_index=ep), 0.0, math.inf)
                for k in sorted(ds.videos)
            }
            found.append(Episode(ep, rel, videos))
        return sorted(found, key=lambda e: e.index)
    return _episodes_v3(ds)


def _episodes_v3(ds: Dataset) -> list[Episode]:
    folder = ds.root / "meta" / "episodes"
    files = sorted(folder.rglob("*.parquet"), key=lambda p: p.relative_to(folder).as_posix()) if folder.is_dir() else []
    if not files:
        raise UsageError(f"{folder}: no episode metadata (meta/episodes/chunk-*/file-*.parquet)")
    found = []
    for path in files:
        names = set(_schema_names(path))
        wanted = ["episode_index", "data/chunk_index", "data/file_index"]
        for k in ds.videos:
            wanted += [f"videos/{k}/{c}" for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        missing = [c for c in wanted if c not in names]
        if missing:
            raise UsageError(f"{path}: no column {', '.join(missing)}")
        for n, row in enumerate(_parquet(path, wanted, UsageError).to_pylist()):
            bad = [c for c in wanted if not _number(row[c], whole="timestamp" not in c)]
            if bad:
                raise UsageError(f"{path}: row {n}: {', '.join(bad)} is not a number")
            ep = row["episode_index"]
            rel = _format(ds.data_path, chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
            videos = {}
            for k in sorted(ds.videos):
                p = f"videos/{k}/"
                where = _format(
                    ds.video_path or "",
                    video_key=k,
                    chunk_index=row[p + "chunk_index"],
                    file_index=row[p + "file_index"],
                )
                videos[k] = (where, float(row[p + "from_timestamp"]), float(row[p + "to_timestamp"]))
            found.append(Episode(ep, rel, videos))
    return sorted(found, key=lambda e: e.index)


def _number(value: object, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) and value >= 0 if whole else math.isfinite(value)


def _schema_names(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError and others for a broken footer
        raise UsageError(f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:160]})") from None


class _Rows:
    """One data file, read once for all the episodes it holds (v3.0 keeps many in one file)."""

    def __init__(self, ds: Dataset):
        self.ds = ds
        self.path: str | None = None
        self.table: Any = None
        self.error: str | None = None

    def episode(self, ep: Episode) -> Any:
        import pyarrow.compute as pc

        if ep.data != self.path:
            self.path, self.table, self.error = ep.data, None, None
            columns = ["timestamp", "episode_index", "task_index", *self.ds.actions, *self.ds.telemetry]
            columns += [k for k in self.ds.cameras if k not in self.ds.videos]
            try:
                self.table = _parquet(_file(self.ds.root, ep.data), columns)
            except ValueError as e:
                self.error = str(e)
        if self.table is None:
            raise ValueError(self.error)
        return self.table.filter(pc.equal(self.table.column("episode_index"), ep.index))


def grid(ts: object, fps: int) -> tuple[int | None, bool]:
    """(frame k whose time k/fps the timestamp is, whether it had to be moved onto the grid), or None when
    it is off the grid. A timestamp is on it when it is k/fps as float32 (as LeRobot stores it: hours into
    an episode that is further from k/fps than ``GRID``), moved when within ``GRID`` of k/fps."""
    import numpy as np

    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts <= MAX_T:
        return None, False
    k = round(ts * fps)
    if float(np.float32(k / fps)) == float(np.float32(ts)):
        return k, False
    return (k, True) if abs(ts - k / fps) <= GRID else (None, False)


def _values(value: object, name: str, report: SessionReport, where: str) -> list[tuple[str, float]]:
    """(channel, value) of one feature's cell: a number, or a list of them (``name.0``, ``name.1``, ...)."""
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    if len(items) > MAX_VALUES:
        report.drop("fields", where, f"{name}: {len(items)} values (over {MAX_VALUES})")
        return []
    out = []
    for i, v in items:
        channel = name if i is None else f"{name}.{i}"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= F32_MAX:
            out.append((channel, float(v)))
        else:
            report.drop("fields", where, f"{channel}: {v!r} is not a finite float32")
    return out


def _camera_frames(
    path: Path, start: float, end: float, fps: int, report: SessionReport, where: str
) -> Iterator[tuple[int, Any]]:
    """(frame k, picture) of a video file between ``start`` and ``end`` seconds on its own clock, k counted
    from ``start`` at 1/fps; a frame off that grid, or on the time of the frame before, is dropped."""
    import av

    half = 0.5 / fps
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if start > 0:  # to the keyframe at or before the episode (microseconds: FFmpeg's own time base)
            container.seek(int(start * 1_000_000), backward=True)
        last = -1
        try:
            for frame in container.decode(stream):
                if frame.time is None:
                    report.drop("video_frames", where, "a frame without a time")
                    continue
                if frame.time < start - half:
                    continue  # the episode before (after a seek to the keyframe before ours)
                if frame.time >= end - half:
                    break
                k = round((frame.time - start) * fps)
                if abs(frame.time - start - k / fps) > GRID or k <= last:
                    report.drop(
                        "video_frames", where, f"the frame at {frame.time:.6f} s is not frame {last + 1} at {fps} fps"
                    )
                    continue
                last = k
                yield k, frame
        except av.error.FFmpegError as e:
            report.drop("video_frames", where, f"does not decode after frame {last} ({e.strerror or e})")


def _picture_frames(
    cells: list, ks: list[tuple[int, int]], report: SessionReport, where: str
) -> Iterator[tuple[int, Any]]:
    """(frame k, picture) of an image feature: each row's PNG or JPEG bytes in the parquet."""
    import av

    for row, k in ks:
        cell = cells[row]
        data = cell.get("bytes") if isinstance(cell, dict) else None
        frames = []
        if isinstance(data, bytes):
            try:
                frames = av.CodecContext.create("png" if data[:4] == b"\x89PNG" else "mjpeg", "r").decode(
                    av.Packet(data)
                )
            except av.error.FFmpegError:
                frames = []
        if not frames:
            report.drop("video_frames", f"{where} row {row}", "no picture that decodes")
            continue
        yield k, frames[0]


def _open_cameras(ds: Dataset, ep: Episode, table, ks, report: SessionReport, rel: str) -> list[tuple[str, Iterator]]:
    """Each camera's frame iterator, its first frame already read; a camera whose file is missing or does
    not open is left out of the session, named and counted."""
    import av

    out = []
    for camera in ds.cameras:
        if camera in ds.videos:
            vrel, start, end = ep.videos[camera]
            try:
                path = _file(ds.root, vrel)
                if not path.is_file():
                    raise ValueError(f"{vrel}: no such file")
                with av.open(str(path)) as probe:
                    if not probe.streams.video:
                        raise ValueError(f"{vrel}: no video stream")
            except (ValueError, av.error.FFmpegError) as e:
                reason = str(e) if isinstance(e, ValueError) else f"{vrel}: does not open ({e.strerror or e})"
                report.drop("cameras", rel, f"{camera}: {reason}")
                continue
            frames = _camera_frames(path, start, end, ds.fps, report, vrel)
        else:
            frames = _picture_frames(table.column(camera).to_pylist(), ks, report, f"{rel}: {camera}")
        first = next(frames, None)
        if first is None:
            report.drop("cameras", rel, f"{camera}: no frame of episode {ep.index}")
            continue
        out.append((camera, _chain(first, frames)))
    return out


def _chain(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _write_video(path: Path, cameras: list[tuple[str, Iterator]], fps: int, crf: int) -> list[int]:
    """The cameras as streams of one MP4 on the 1/fps clock, interleaved by time; each stream's frames."""
    writer = H264Writer(path, Fraction(1, fps), crf)
    heads = [next(frames) for _, frames in cameras]
    for _, frame in heads:
        writer.add_stream(frame, Fraction(fps))
    counts = [0] * len(cameras)
    try:
        streams = [_tagged(i, _chain(heads[i], frames)) for i, (_, frames) in enumerate(cameras)]
        for k, i, frame in merge(*streams, key=lambda x: (x[0], x[1])):
            writer.add(frame, k, i)
            counts[i] += 1
    finally:
        writer.close()
    return counts


def _tagged(i: int, frames: Iterator) -> Iterator[tuple[int, int, Any]]:
    for k, frame in frames:
        yield k, i, frame


def import_episode(
    ds: Dataset, ep: Episode, rows: _Rows, out: Path, options: LeRobotImport, taken: set[str]
) -> SessionReport:
    """One episode -> one session folder under ``out``; ValueError names why it cannot be."""
    table = rows.episode(ep)
    rel = ep.data
    if table.num_rows == 0:
        raise ValueError(f"no rows of episode {ep.index}")
    sid, _ = session_id(f"episode_{ep.index:06d}", taken)
    report = SessionReport(sid, rel)
    if options.title is None:
        report.guessed["title_from_folder"] += 1
    if options.player is None and ds.robot_type is None:
        report.guessed["player_unknown"] += 1
    ks: list[tuple[int, int]] = []  # (row, frame k) of the rows kept, in row order
    last = -1
    for row, ts in enumerate(table.column("timestamp").to_pylist()):
        k, snapped = grid(ts, ds.fps)
        if k is None or k <= last:
            reason = (
                f"timestamp {ts!r} is not on the 1/{ds.fps} s grid"
                if k is None
                else f"timestamp {ts!r} repeats or goes back"
            )
            report.drop("rows", f"{rel}: episode {ep.index} row {row}", reason)
            continue
        if snapped:
            report.guessed["timestamps_snapped"] += 1
        ks.append((row, k))
        last = k
    if not ks:
        raise ValueError(f"episode {ep.index}: no row has a usable timestamp")
    actions, telemetry, text, controls = _streams(ds, table, ks, report, f"{rel}: episode {ep.index}")
    folder = out / sid
    video = folder.with_name(folder.name + ".video.mp4")
    try:
        cameras = _open_cameras(ds, ep, table, ks, report, rel)
        if not cameras:
            raise ValueError(f"episode {ep.index}: no camera has a frame")
        counts = _write_video(video, cameras, ds.fps, options.crf)
        for (camera, _), n in zip(cameras, counts, strict=True):
            if n != len(ks):
                report.drop("frame_mismatch", rel, f"{camera}: {n} frames for {len(ks)} rows of episode {ep.index}")
        report.duration = round(max(k for _, k in ks) / ds.fps, 6)
        report.actions, report.telemetry = len(actions), len(telemetry)
        tasks = [e["text"] for e in text]
        conditions = dict(options.conditions)
        if tasks:
            conditions.setdefault("task", tasks[0][:1024])
        doc: dict = {
            "session_id": sid,
            "title": options.title or ds.root.resolve().name,
            "player": options.player or ds.robot_type or "unknown",
            "video": "video.mp4",
            "lerobot": {
                "codebase_version": ds.version,
                "episode_index": ep.index,
                "fps": ds.fps,
                "cameras": [c for c, _ in cameras],
            },
        }
        if conditions:
            doc["conditions"] = dict(sorted(conditions.items()))
        if controls:
            doc["controls"] = {c: {"kind": "continuous"} for c in sorted(controls)}
        streams = {"actions": jsonl(actions)} if ds.actions else {}
        if ds.telemetry:
            streams["telemetry"] = jsonl(telemetry)
        if text:
            streams["text"] = jsonl(text)
        write_session(folder, doc, streams, video)
    finally:
        video.unlink(missing_ok=True)
    return report


def _streams(ds: Dataset, table, ks, report: SessionReport, where: str):
    """Actions (every element a continuous control), telemetry rows and task changes, at each row's k/fps."""
    cols = {name: table.column(name).to_pylist() for name in (*ds.actions, *ds.telemetry)}
    task_col = table.column("task_index").to_pylist()
    actions: list[dict] = []
    telemetry: list[dict] = []
    text: list[dict] = []
    controls: set[str] = set()
    task = None
    for row, k in ks:
        t = k / ds.fps
        at = f"{where} row {row}"
        for name in ds.actions:
            for control, v in _values(cols[name][row], name, report, at):
                controls.add(control)
                actions.append({"t": t, "control": control, "value": v})
        reading: dict = {"t": t}
        for name in ds.telemetry:
            reading.update(_values(cols[name][row], name, report, at))
        if len(reading) > 1:
            telemetry.append(reading)
        index = task_col[row]
        if index != task:
            task = index
            if index in ds.tasks:
                text.append({"t": t, "text": ds.tasks[index]})
            else:
                report.drop("tasks", at, f"task_index {index!r} is not in the dataset's tasks")
    return actions, telemetry, text, controls


def import_lerobot(src: Path, dest: Path, options: LeRobotImport, progress: Progress | None = None) -> ImportReport:
    if not src.is_dir():
        raise UsageError(f"{src}: not a folder", hint="name a LeRobot dataset folder (with meta/info.json)")
    ds = read_meta(src, options.camera)
    eps = episodes(ds)
    if not eps:
        raise UsageError(f"{src}: the dataset has no episodes")
    report = ImportReport(str(src), str(dest))
    taken: set[str] = set()
    rows = _Rows(ds)
    with staged(dest) as tmp:
        for done, ep in enumerate(eps):
            if progress is not None:
                progress(done, len(eps), f"episode {ep.index}")
            try:
                report.sessions.append(import_episode(ds, ep, rows, tmp, options, taken))
            except ValueError as e:
                report.failed.append((ep.data, f"episode {ep.index}: {e}"))
        if progress is not None:
            progress(len(eps), len(eps), "")
        if not report.sessions:
            raise UsageError("; ".join(f"{f}: {r}" for f, r in report.failed[:3]))
    return report

"""`dsbuild import video`: a folder of video files (any container PyAV opens), each file one session,
with optional sidecar logs beside it:

    NAME.inputs.csv       t,control,value   (value a number, or down/up)
    NAME.inputs.jsonl     {"t": ..., "control": ..., "value": ...}
    NAME.telemetry.csv    t,channel,channel,...

Times are seconds from the video's first frame, or absolute (epoch seconds or ISO 8601) with a clock that
says when the first frame was shown. A line that does not fit the video (before its start, after its end,
earlier than the line before it) is dropped and named with file and line: it is never moved to where it
might have belonged. The video is copied as it is: ``convert`` cuts it.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import UsageError
from dsbuild.formats.capture import DOCS, parse_started_at
from dsbuild.importers.common import ImportReport, SessionReport, jsonl, read_lines, session_id, staged, write_session

VIDEO_SUFFIXES = frozenset(
    [
        ".mkv",
        ".mp4",
        ".m4v",
        ".mov",
        ".webm",
        ".ts",
        ".m2ts",
        ".mts",
        ".avi",
        ".flv",
        ".mpg",
        ".mpeg",
        ".wmv",
        ".ogv",
        ".3gp",
    ]
)  # files tried as videos; any other file that is not a sidecar is ignored (and counted)
SIDECARS = (".inputs.csv", ".inputs.jsonl", ".telemetry.csv")
PRESSED = {"down": 1.0, "up": 0.0}
PATTERN_FIELDS = ("title", "player", "session")
MAX_CHANNELS = 1024
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class VideoImport:
    """What the user said about the recordings: fixed fields, or a pattern over their relative paths."""

    title: str | None = None
    player: str | None = None
    conditions: tuple[tuple[str, str], ...] = ()
    pattern: str | None = None
    clock: str | None = None  # an ISO 8601 time of the first frame, or "meta" (the container's creation_time)


def compile_pattern(pattern: str) -> tuple[re.Pattern, tuple[str, ...]]:
    """``{title}/{player}/{session}.mkv`` as a regex over relative POSIX paths: ``{name}`` matches one path
    part or less, ``*`` anything within a part; names other than title, player and session are conditions."""
    names: list[str] = []
    out = []
    for piece in re.split(r"(\{[^{}]*\}|\*)", pattern):
        if piece == "*":
            out.append("[^/]*")
        elif piece.startswith("{") and piece.endswith("}"):
            name = piece[1:-1]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) or name in names:
                raise UsageError(f"--pattern {pattern!r}: {piece} is not a field name, or is given twice")
            names.append(name)
            out.append(f"(?P<{name}>[^/]+?)")
        elif "{" in piece or "}" in piece:
            raise UsageError(f"--pattern {pattern!r}: unbalanced brace", hint="e.g. '{title}/{player}/{session}.mkv'")
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out)), tuple(names)


def _is_sidecar(name: str) -> bool:
    return name.endswith(SIDECARS)


def find_videos(src: Path) -> tuple[list[Path], int]:
    """(the video files under ``src`` sorted by relative path, how many other files were ignored); links
    are not followed, hidden files and folders are skipped."""
    videos, ignored = [], 0
    for path in sorted(src.rglob("*"), key=lambda p: p.relative_to(src).as_posix()):
        rel = path.relative_to(src)
        if any(part.startswith(".") for part in rel.parts) or path.is_symlink() or not path.is_file():
            continue
        if path.suffix.lower() in VIDEO_SUFFIXES:
            videos.append(path)
        elif not _is_sidecar(path.name):
            ignored += 1
    return videos, ignored


@dataclass(frozen=True)
class VideoSpan:
    """The video's first and last displayed instant (seconds on its own clock) and its creation time."""

    start: float
    end: float
    created: str | None

    @property
    def duration(self) -> float:
        return self.end - self.start


def probe(path: Path) -> VideoSpan:
    """The span of a video's first stream, from its packets, once a frame decodes; raises ValueError with
    the reason when no demuxer opens the file or it holds no decodable video."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError("holds no video stream")
            stream = container.streams.video[0]
            tb = stream.time_base
            if tb is None:
                raise ValueError("its video stream has no time base")
            start, end, decoded = math.inf, -math.inf, False
            for packet in container.demux(stream):
                if packet.pts is None or packet.size == 0:
                    continue
                start = min(start, float(packet.pts * tb))
                end = max(end, float((packet.pts + (packet.duration or 0)) * tb))
                if not decoded:
                    decoded = bool(packet.decode())
            created = container.metadata.get("creation_time") or stream.metadata.get("creation_time")
    except av.error.FFmpegError as e:
        raise ValueError(f"no demuxer opens it ({e.strerror or e})") from None
    if not decoded or start == math.inf:
        raise ValueError("holds no decodable video frame")
    return VideoSpan(start, end, created)


def _clock_origin(clock: str | None, span: VideoSpan) -> tuple[float | None, str | None]:
    """(epoch seconds of the first frame, the ISO time for ``started_at``) from ``--clock``."""
    if clock is None:
        return None, None
    text = span.created if clock == "meta" else clock
    when = parse_started_at(text)
    if when is None:
        raise ValueError(
            "--clock meta: the container records no creation_time; give --clock 2026-11-01T10:00:00Z"
            if clock == "meta"
            else f"--clock {clock!r} is not an ISO 8601 time"
        )
    return when.timestamp(), when.isoformat().replace("+00:00", "Z")


def _time(text: object, origin: float | None) -> float | None:
    """A log's time in seconds from the first frame: a number, or with a clock an absolute time (epoch
    seconds or ISO 8601) minus the clock's origin, to the microsecond. None when unreadable."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        t = float(text)
    elif isinstance(text, str):
        try:
            t = float(text)
        except ValueError:
            when = parse_started_at(text.strip()) if origin is not None else None
            if when is None:
                return None
            t = when.timestamp()
    else:
        return None
    if not math.isfinite(t):
        return None
    return t if origin is None else round(t - origin, 6)


class _Fit:
    """Whether each line's time fits the video: not before its first frame, not after its end, not
    earlier than the line before (a log out of order is named, never sorted into a guessed place)."""

    def __init__(self, duration: float):
        self.duration = duration
        self.last: tuple[float, int] | None = None

    def problem(self, t: float, lineno: int) -> str | None:
        if t < 0:
            return f"t={t:g} s is before the video's first frame"
        if t > self.duration:
            return f"t={t:g} s is after the video's end at {self.duration:.3f} s"
        if self.last is not None and t < self.last[0]:
            return f"t={t:g} s is earlier than line {self.last[1]} (t={self.last[0]:g} s): the log is not in time order"
        self.last = (t, lineno)
        return None


def _value(raw: object) -> float | None:
    if isinstance(raw, str) and raw.strip().lower() in PRESSED:
        return PRESSED[raw.strip().lower()]
    if isinstance(raw, bool):
        return None
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _input_rows(path: Path, report: SessionReport, where: str) -> Iterator[tuple[int, object, object, object]]:
    """(line, t, control, value) of an input log as written: CSV with a header ``t,control,value`` or
    JSON Lines of objects with those keys."""
    if path.suffix == ".jsonl":
        for lineno, text in read_lines(path):
            try:
                obj = json.loads(text) if text is not None else None
            except json.JSONDecodeError as e:
                report.drop("action_lines", f"{where}:{lineno}", f"invalid JSON ({e.msg})")
                continue
            if not isinstance(obj, dict):
                report.drop("action_lines", f"{where}:{lineno}", "not a JSON object of t, control, value")
                continue
            yield lineno, obj.get("t"), obj.get("control"), obj.get("value")
        return
    rows = _csv_rows(path, report, where, "action_lines")
    header = next(rows, None)
    if header is None:
        return
    cols = {name.strip().lower(): i for i, name in enumerate(header[1])}
    cols.setdefault("value", cols.get("state", -1))  # (a down/up log may call the column state)
    if not {"t", "control"} <= cols.keys() or cols["value"] < 0:
        _unusable(rows, header[0], report, where, "action_lines", "t, control, value (or state)")
        return
    for lineno, row in rows:
        if len(row) != len(header[1]):
            report.drop("action_lines", f"{where}:{lineno}", f"{len(row)} fields, the header has {len(header[1])}")
            continue
        yield lineno, row[cols["t"]], row[cols["control"]], row[cols["value"]]


def _unusable(
    rows: Iterator[tuple[int, list[str]]], header: int, report: SessionReport, where: str, what: str, want: str
) -> None:
    """A CSV whose header is not the one asked for: its header line and every line after it are dropped
    (counted, the header named), never read by guessing which column is which."""
    report.drop(what, f"{where}:{header}", f"the header must be {want}; no line of the file was read")
    for lineno, _ in rows:
        report.drop(what, f"{where}:{lineno}", "the file has no usable header")


def _csv_rows(path: Path, report: SessionReport, where: str, what: str) -> Iterator[tuple[int, list[str]]]:
    for lineno, text in read_lines(path):
        if text is None:
            report.drop(what, f"{where}:{lineno}", "not UTF-8 text, or longer than 1 MiB")
            continue
        yield lineno, next(csv.reader([text]))


def read_inputs(path: Path, where: str, duration: float, origin: float | None, report: SessionReport) -> list[dict]:
    """The events of an input log, each checked against the video; every line dropped is named."""
    fit = _Fit(duration)
    out = []
    for lineno, raw_t, raw_control, raw_value in _input_rows(path, report, where):
        at = f"{where}:{lineno}"
        t, value = _time(raw_t, origin), _value(raw_value)
        control = raw_control.strip() if isinstance(raw_control, str) else ""
        if t is None:
            report.drop("action_lines", at, f"t {raw_t!r} is not a time")
        elif not 1 <= len(control) <= 128:
            report.drop("action_lines", at, "control must be a name of 1 to 128 characters")
        elif value is None:
            report.drop("action_lines", at, f"value {raw_value!r} is not a number, down or up")
        elif not -1 <= value <= 1:
            report.drop("action_lines", at, f"value {value:g} is outside [-1, 1] (see {DOCS})")
        elif (problem := fit.problem(t, lineno)) is not None:
            report.drop("action_lines", at, problem)
        else:
            out.append({"t": t, "control": control, "value": value})
    return out


def read_telemetry(path: Path, where: str, duration: float, origin: float | None, report: SessionReport) -> list[dict]:
    """The readings of a telemetry CSV (header ``t,channel,...``); an empty cell is no reading, a cell
    that is not a number is dropped and named (the rest of its line is kept)."""
    rows = _csv_rows(path, report, where, "telemetry_lines")
    header = next(rows, None)
    if header is None:
        return []
    names = [n.strip() for n in header[1]]
    channels = names[1:]
    if (
        not names
        or names[0].lower() != "t"
        or len(set(channels)) != len(channels)
        or len(channels) > MAX_CHANNELS
        or any(not 1 <= len(n) <= 128 or n == "t" for n in channels)
    ):
        want = f"t, then at most {MAX_CHANNELS} distinct channel names of 1 to 128 characters"
        _unusable(rows, header[0], report, where, "telemetry_lines", want)
        return []
    fit = _Fit(duration)
    out = []
    for lineno, row in rows:
        at = f"{where}:{lineno}"
        t = _time(row[0], origin) if row else None
        if len(row) != len(names):
            report.drop("telemetry_lines", at, f"{len(row)} fields, the header has {len(names)}")
        elif t is None:
            report.drop("telemetry_lines", at, f"t {row[0]!r} is not a time")
        elif (problem := fit.problem(t, lineno)) is not None:
            report.drop("telemetry_lines", at, problem)
        else:
            reading: dict = {"t": t}
            for name, cell in zip(channels, row[1:]):
                if not cell.strip():
                    continue
                try:
                    x = float(cell)
                except ValueError:
                    x = math.nan
                if not math.isfinite(x) or abs(x) > 3.4028234663852886e38:
                    report.drop("telemetry_cells", at, f"channel {name!r}: {cell!r} is not a finite float32")
                    continue
                reading[name] = x
            out.append(reading)
    return out


def _sidecar(video: Path, suffixes: tuple[str, ...], where: str) -> Path | None:
    stem = video.with_suffix("")
    found = [stem.with_name(stem.name + s) for s in suffixes if stem.with_name(stem.name + s).is_file()]
    if len(found) > 1:
        raise ValueError(f"two input logs beside {where}: {found[0].name} and {found[1].name}; keep one")
    return found[0] if found else None


def _fields(rel: str, options: VideoImport, matcher, src: Path) -> tuple[dict, str, list[str]]:
    """(session fields, the session's name, what was guessed) for a video at ``rel``."""
    found: dict[str, str] = {}
    if matcher is not None:
        m = matcher[0].fullmatch(rel)
        if m is None:
            raise ValueError(f"does not match --pattern {options.pattern!r}")
        found = m.groupdict()
    guessed = []
    conditions = {k: v for k, v in found.items() if k not in PATTERN_FIELDS}
    conditions.update(options.conditions)
    title = options.title or found.get("title")
    player = options.player or found.get("player")
    if title is None:
        title = src.resolve().name or "untitled"
        guessed.append("title_from_folder")
    if player is None:
        player = "unknown"
        guessed.append("player_unknown")
    doc: dict = {"title": title, "player": player}
    if conditions:
        doc["conditions"] = dict(sorted(conditions.items()))
    name = found.get("session") or rel.rsplit(".", 1)[0]
    return doc, name, guessed


def import_videos(src: Path, dest: Path, options: VideoImport, progress: Progress | None = None) -> ImportReport:
    """Import every video under ``src`` into a new capture folder ``dest``; see the module docstring."""
    if not src.is_dir():
        raise UsageError(f"{src}: not a folder", hint="name the folder that holds your videos")
    matcher = compile_pattern(options.pattern) if options.pattern else None
    videos, ignored = find_videos(src)
    if not videos:
        raise UsageError(f"{src}: no video files ({', '.join(sorted(VIDEO_SUFFIXES))})")
    report = ImportReport(str(src), str(dest), ignored=ignored)
    taken: set[str] = set()
    with staged(dest) as tmp:
        for done, video in enumerate(videos):
            rel = video.relative_to(src).as_posix()
            if progress is not None:
                progress(done, len(videos), rel)
            try:
                session = _import_one(video, rel, src, tmp, options, matcher, taken)
            except ValueError as e:
                report.failed.append((rel, str(e)))
                continue
            report.sessions.append(session)
        if progress is not None:
            progress(len(videos), len(videos), "")
        if not report.sessions:
            reasons = "; ".join(f"{f}: {r}" for f, r in report.failed[:3])
            raise UsageError(f"{src}: no video could be imported ({reasons})")
    return report


def _import_one(video: Path, rel: str, src: Path, out: Path, options: VideoImport, matcher, taken: set[str]):
    doc, name, guessed = _fields(rel, options, matcher, src)
    inputs = _sidecar(video, (".inputs.csv", ".inputs.jsonl"), rel)
    telemetry = _sidecar(video, (".telemetry.csv",), rel)
    span = probe(video)
    origin, started = _clock_origin(options.clock, span)
    sid, renamed = session_id(name, taken)
    report = SessionReport(sid, rel, duration=round(span.duration, 6))
    report.guessed.update(guessed)
    if renamed:
        report.guessed["session_id_renamed"] += 1
    streams = {}
    base = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
    if inputs is not None:
        events = read_inputs(inputs, base + inputs.name, span.duration, origin, report)
        report.actions = len(events)
        streams["actions"] = jsonl(events)
    if telemetry is not None:
        readings = read_telemetry(telemetry, base + telemetry.name, span.duration, origin, report)
        report.telemetry = len(readings)
        streams["telemetry"] = jsonl(readings)
    doc = {"session_id": sid, **doc, "video": "video" + video.suffix.lower()}
    if started is not None:
        doc["started_at"] = started
    write_session(out / sid, doc, streams, video)
    return report

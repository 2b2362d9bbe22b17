"""`dsbuild import mcap`: MCAP robot logs, one session per file.

Channels are read as the ``mcap`` writers write them: JSON (``jsonschema`` schema, or none), ROS 2 CDR
(``ros2msg`` schema, via ``mcap-ros2-support``) or protobuf (via ``mcap-protobuf-support``). One image
topic becomes the video (raw images and JPEG/PNG compressed images, re-encoded to H.264 at their log
times); chosen topics become telemetry (every numeric field, flattened with its path: ``joint_states/
position.0``) and actions (the same, declared continuous controls: a robot's commands are in its own
units). Times are log times, zero at the first video frame. A ROS 2 bag in sqlite3 storage (``.db3``)
and ``ros2idl`` schemas are refused in one line naming what is supported.
"""

from __future__ import annotations

import base64
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dsbuild.core.errors import MissingDependency, UsageError
from dsbuild.importers.common import ImportReport, SessionReport, jsonl, session_id, staged, write_session

SUPPORTED = "MCAP files with JSON (jsonschema), ROS 2 CDR (ros2msg) or protobuf channels"
F32_MAX = 3.4028234663852886e38
MAX_LIST = 4096  # numbers taken from one list field (an image's bytes are no telemetry)
MAX_NAMES = 1024  # telemetry channels, or controls, per session (the contract's limit)
MAX_DEPTH = 32
MAX_JSON_MESSAGE = 64 << 20
RAW_FORMATS = {
    "rgb8": ("rgb24", 3),
    "bgr8": ("bgr24", 3),
    "mono8": ("gray", 1),
    "rgba8": ("rgba", 4),
    "bgra8": ("bgra", 4),
}
TIME_BASE = Fraction(1, 90000)  # the video's clock: log times to 11 microseconds
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class McapImport:
    video_topic: str
    telemetry_topics: tuple[str, ...] = ()
    action_topics: tuple[str, ...] = ()
    title: str | None = None
    player: str | None = None
    conditions: tuple[tuple[str, str], ...] = ()
    crf: int = 18


def _readers():
    try:
        from mcap.reader import make_reader
    except ImportError:
        raise MissingDependency("dsbuild import mcap", "importers", "mcap") from None
    factories = []
    try:
        from mcap_ros2.decoder import DecoderFactory as Ros2

        factories.append(Ros2())
    except ImportError:
        pass
    try:
        from mcap_protobuf.decoder import DecoderFactory as Protobuf

        factories.append(Protobuf())
    except ImportError:
        pass
    return make_reader, factories


def plain(obj: object, depth: int = 0) -> object:
    """A decoded message as plain Python (dicts, lists, numbers, strings, bytes), whatever decoded it."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, dict):
        return {str(k): plain(v, depth + 1) for k, v in obj.items()}
    if hasattr(obj, "DESCRIPTOR") and hasattr(obj, "ListFields"):  # a protobuf message: every field, set or not
        return {f.name: plain(getattr(obj, f.name), depth + 1) for f in obj.DESCRIPTOR.fields}
    slots = getattr(type(obj), "__slots__", None)
    if isinstance(slots, (list, tuple)) and slots:  # a ROS 2 message (mcap_ros2's dynamic classes)
        return {s: plain(getattr(obj, s), depth + 1) for s in slots}
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Sequence) or (hasattr(obj, "__iter__") and hasattr(obj, "__len__")):
        return [plain(v, depth + 1) for v in obj]
    raise ValueError(f"a {type(obj).__name__} is not a message value")


def flatten(msg: object, prefix: str, report: SessionReport, where: str) -> Iterator[tuple[str, float]]:
    """(path, value) of every numeric field: nested fields joined with '.', list items by index. Strings,
    bytes and booleans are no numbers (left out); a list over ``MAX_LIST`` or a value beyond float32 is
    dropped and named."""
    if isinstance(msg, dict):
        for k, v in msg.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix and not prefix.endswith("/") else prefix + k, report, where)
    elif isinstance(msg, list):
        if len(msg) > MAX_LIST:
            report.drop("fields", where, f"{prefix}: a list of {len(msg)} values (over {MAX_LIST})")
            return
        for i, v in enumerate(msg):
            yield from flatten(v, f"{prefix}.{i}", report, where)
    elif isinstance(msg, (int, float)) and not isinstance(msg, bool):
        x = float(msg)
        if math.isfinite(x) and abs(x) <= F32_MAX:
            yield prefix, x
        else:
            report.drop("fields", where, f"{prefix}: {msg!r} is not a finite float32")


def _topic_name(topic: str) -> str:
    return topic.strip("/") or "root"


def _schema_problem(topic: str, schema, channel) -> str | None:
    """Why a topic's messages cannot be read, in one line naming what can."""
    enc, schema_enc = channel.message_encoding, schema.encoding if schema is not None else ""
    ok = {("json", "jsonschema"), ("json", ""), ("cdr", "ros2msg"), ("protobuf", "protobuf")}
    if (enc, schema_enc) in ok:
        return None
    return (
        f"topic {topic}: message encoding {enc!r} with schema encoding {schema_enc!r} is not supported; "
        "supported: json (jsonschema), cdr (ros2msg), protobuf"
    )


def _image(msg: dict) -> tuple[object, str] | str:
    """(an av.VideoFrame, what it was) from a raw or compressed image message, or why not."""
    import av
    import numpy as np

    data = msg.get("data")
    if isinstance(data, str):  # JSON carries bytes as base64
        try:
            data = base64.b64decode(data, validate=True)
        except ValueError:
            return "data is not base64"
    elif isinstance(data, list):
        data = bytes(data) if all(isinstance(b, int) and 0 <= b < 256 for b in data) else None
    if not isinstance(data, bytes):
        return "no image data"
    if isinstance(msg.get("format"), str):  # sensor_msgs/CompressedImage, foxglove.CompressedImage
        codec = "png" if "png" in msg["format"].lower() else "mjpeg"
        try:
            decoder: Any = av.CodecContext.create(codec, "r")
            frames = decoder.decode(av.Packet(data))
        except av.error.FFmpegError as e:
            return f"{msg['format']} image does not decode ({e.strerror or e})"
        return (frames[0], "compressed") if frames else f"{msg['format']} image holds no picture"
    encoding, width, height = msg.get("encoding"), msg.get("width"), msg.get("height")
    if encoding not in RAW_FORMATS or not isinstance(width, int) or not isinstance(height, int):
        return f"image encoding {encoding!r} is not one of {', '.join(RAW_FORMATS)}"
    fmt, channels = RAW_FORMATS[encoding]
    step = msg.get("step") or width * channels
    if width <= 0 or height <= 0 or not isinstance(step, int) or step < width * channels or len(data) < step * height:
        return f"a {width}x{height} {encoding} image with step {step} does not fit its {len(data)} bytes"
    pixels = np.frombuffer(data, np.uint8, step * height).reshape(height, step)[:, : width * channels]
    pixels = pixels.reshape(height, width, channels) if channels > 1 else pixels
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format=fmt), "raw"


class _Encoder:
    """H.264 in MP4 at the frames' own times (variable frame rate kept), keyframes about every second."""

    def __init__(self, path: Path, first, rate: Fraction, crf: int):
        import av

        self.container = av.open(str(path), "w", format="mp4", options={"fflags": "+bitexact"})
        self.width, self.height = first.width - first.width % 2, first.height - first.height % 2
        self.stream = self.container.add_stream("libx264", rate=rate)
        self.stream.width, self.stream.height, self.stream.pix_fmt = self.width, self.height, "yuv420p"
        self.stream.time_base = TIME_BASE
        self.stream.codec_context.time_base = TIME_BASE
        gop = str(max(1, round(rate)))
        self.stream.codec_context.options = {
            "crf": str(crf),
            "g": gop,
            "keyint_min": gop,
            "x264-params": "scenecut=0",  # keyframes exactly every second: convert cuts clips there
            "threads": "1",
        }
        self.stream.codec_context.flags |= int(av.codec.context.Flags.bitexact)

    def add(self, frame, pts: int) -> None:
        frame = frame.reformat(width=self.width, height=self.height, format="yuv420p")
        frame.pts, frame.time_base = pts, TIME_BASE
        self.container.mux(self.stream.encode(frame))

    def close(self) -> None:
        self.container.mux(self.stream.encode())
        self.container.close()


def _topics(summary) -> dict[str, tuple[Any, Any, int]]:
    """topic -> (schema, channel, messages) from an MCAP summary."""
    out: dict[str, tuple[Any, Any, int]] = {}
    counts = summary.statistics.channel_message_counts if summary.statistics else {}
    for cid, ch in sorted(summary.channels.items()):
        schema = summary.schemas.get(ch.schema_id)
        n = counts.get(cid, 0)
        if ch.topic in out:
            n += out[ch.topic][2]
        out[ch.topic] = (schema, ch, n)
    return out


def _decode(schema, channel, data: bytes, decoders: dict, factories) -> object:
    if channel.message_encoding == "json":
        if len(data) > MAX_JSON_MESSAGE:
            raise ValueError(f"a JSON message of {len(data)} bytes (over {MAX_JSON_MESSAGE})")
        return json.loads(data)
    decoder = decoders.get(channel.id)
    if decoder is None:
        for factory in factories:
            decoder = factory.decoder_for(channel.message_encoding, schema)
            if decoder is not None:
                break
        if decoder is None:
            raise ValueError(
                f"no decoder for {channel.message_encoding} (install mcap-ros2-support or mcap-protobuf-support)"
            )
        decoders[channel.id] = decoder
    return plain(decoder(data))


def import_one(path: Path, rel: str, out: Path, options: McapImport, taken: set[str]) -> SessionReport:
    """One MCAP file -> one session folder under ``out``; ValueError names why the file cannot be."""
    make_reader, factories = _readers()
    wanted = (options.video_topic, *options.telemetry_topics, *options.action_topics)
    with open(path, "rb") as f:
        try:
            reader = make_reader(f)
            summary = reader.get_summary()
        except Exception as e:  # the mcap package raises many kinds (McapError, struct.error, ValueError)
            raise ValueError(f"not a readable MCAP file ({type(e).__name__}: {e})") from None
        if summary is None:
            raise ValueError("the MCAP file has no summary (was it written to the end?)")
        topics = _topics(summary)
        for topic in wanted:
            if topic not in topics:
                listed = ", ".join(f"{t} ({(s.name if s else '?')}, {n})" for t, (s, _, n) in topics.items())
                raise ValueError(f"topic {topic} is not in the file; its topics: {listed or 'none'}")
            problem = _schema_problem(topic, topics[topic][0], topics[topic][1])
            if problem is not None:
                raise ValueError(problem)
        sid, renamed = session_id(path.stem, taken)
        report = SessionReport(sid, rel)
        report.guessed.update(_guesses(options))
        if renamed:
            report.guessed["session_id_renamed"] += 1
        return _convert(reader, path, rel, out / sid, options, report, factories)


def _guesses(options: McapImport) -> list[str]:
    return (["title_from_file"] if options.title is None else []) + (
        ["player_unknown"] if options.player is None else []
    )


def _convert(reader, path: Path, rel: str, folder: Path, options: McapImport, report: SessionReport, factories):
    """Read the chosen topics in log-time order, encode the video, and write the session."""
    video_times = [m.log_time for _, _, m in reader.iter_messages(topics=[options.video_topic])]
    if not video_times:
        raise ValueError(f"topic {options.video_topic} holds no messages")
    gaps = sorted(b - a for a, b in zip(video_times, video_times[1:]) if b > a)
    rate = Fraction(round(1e9 / gaps[len(gaps) // 2])) if gaps else Fraction(30)
    video = folder.with_name(folder.name + ".video.mp4")  # encoded beside the session, copied in by write_session
    try:
        return _convert_into(reader, path, rel, folder, video, rate, options, report, factories)
    finally:
        video.unlink(missing_ok=True)


def _convert_into(reader, path, rel, folder, video, rate, options, report, factories) -> SessionReport:
    decoders: dict = {}
    encoder: _Encoder | None = None
    t0: int | None = None
    last_pts = -1
    pending_actions: list[dict] = []
    pending_telemetry: list[dict] = []
    controls: set[str] = set()
    channels: set[str] = set()
    actions = set(options.action_topics)
    telemetry = set(options.telemetry_topics)
    index: Counter = Counter()
    try:
        for schema, channel, message in reader.iter_messages(topics=[options.video_topic, *actions, *telemetry]):
            topic = channel.topic
            index[topic] += 1
            where = f"{rel}: {topic} message {index[topic]}"
            try:
                msg = _decode(schema, channel, message.data, decoders, factories)
            except Exception as e:  # a decoder's own errors (CDR, protobuf, JSON) name the bad message
                report.drop("messages", where, f"does not decode ({type(e).__name__}: {str(e)[:120]})")
                continue
            if topic == options.video_topic:
                got = _image(msg) if isinstance(msg, dict) else "not an image message"
                if isinstance(got, str):
                    report.drop("video_frames", where, got)
                    continue
                frame, _ = got
                if t0 is None:
                    t0 = message.log_time
                    encoder = _Encoder(video, frame, rate, options.crf)
                pts = round(Fraction(message.log_time - t0, 1_000_000_000) / TIME_BASE)
                if pts <= last_pts:
                    report.drop("video_frames", where, "logged at the time of the frame before it")
                    continue
                assert encoder is not None
                encoder.add(frame, pts)
                last_pts = pts
                continue
            prefix = _topic_name(topic) + "/"
            if isinstance(msg, dict) and isinstance(msg.get("header"), dict) and "stamp" in msg["header"]:
                msg = {k: v for k, v in msg.items() if k != "header"}  # a ROS header: the log time is the time
            values = []
            for name, value in flatten(msg, prefix, report, where):
                if len(name) > 128:
                    report.drop("fields", where, f"{name[:60]}...: a name over 128 characters")
                else:
                    values.append((name, value))
            row = {"t": message.log_time}
            if topic in actions:
                for name, v in values:
                    if name in controls or len(controls) < MAX_NAMES:
                        controls.add(name)
                        pending_actions.append({"t": message.log_time, "control": name, "value": v})
                    else:
                        report.drop("fields", where, f"{name}: over {MAX_NAMES} controls")
            if topic in telemetry:
                for name, v in values:
                    if name in channels or len(channels) < MAX_NAMES:
                        channels.add(name)
                        row[name] = v
                    else:
                        report.drop("fields", where, f"{name}: over {MAX_NAMES} channels")
                pending_telemetry.append(row)
    finally:
        if encoder is not None:
            encoder.close()
    if t0 is None:
        raise ValueError(f"topic {options.video_topic}: no message is an image this importer reads")
    report.duration = round(last_pts * float(TIME_BASE), 6)

    def rel_t(e: dict) -> dict:
        return {**e, "t": (e["t"] - t0) / 1e9}

    streams = {}
    if options.action_topics:
        report.actions = len(pending_actions)
        streams["actions"] = jsonl(map(rel_t, pending_actions))
    if options.telemetry_topics:
        report.telemetry = len(pending_telemetry)
        streams["telemetry"] = jsonl(map(rel_t, pending_telemetry))
    started = datetime.fromtimestamp(t0 // 1_000_000_000, UTC).replace(microsecond=(t0 // 1000) % 1_000_000)
    doc: dict = {
        "session_id": report.session_id,
        "title": options.title or path.stem,
        "player": options.player or "unknown",
        "video": "video.mp4",
        "started_at": started.isoformat().replace("+00:00", "Z"),
    }
    if options.conditions:
        doc["conditions"] = dict(sorted(options.conditions))
    if controls:
        doc["controls"] = {c: {"kind": "continuous"} for c in sorted(controls)}
    write_session(folder, doc, streams, video)
    return report


def find_files(src: Path) -> list[Path]:
    """MCAP files (and sqlite3 bags, to refuse by name) under ``src``, or ``src`` itself."""
    if src.is_file():
        return [src]
    return sorted(
        (p for p in src.rglob("*") if p.suffix in (".mcap", ".db3") and p.is_file() and not p.is_symlink()),
        key=lambda p: p.relative_to(src).as_posix(),
    )


def import_mcap(src: Path, dest: Path, options: McapImport, progress: Progress | None = None) -> ImportReport:
    if not src.exists():
        raise UsageError(f"{src}: no such file or folder", hint="name an .mcap file or a folder of them")
    files = find_files(src)
    if not files:
        raise UsageError(f"{src}: no .mcap files", hint=f"supported: {SUPPORTED}")
    report = ImportReport(str(src), str(dest))
    taken: set[str] = set()
    with staged(dest) as tmp:
        for done, path in enumerate(files):
            rel = path.name if src.is_file() else path.relative_to(src).as_posix()
            if progress is not None:
                progress(done, len(files), rel)
            if path.suffix == ".db3":
                report.failed.append(
                    (
                        rel,
                        f"a ROS 2 bag in sqlite3 storage is not supported ({SUPPORTED}): `ros2 bag convert` it to MCAP",
                    )
                )
                continue
            try:
                report.sessions.append(import_one(path, rel, tmp, options, taken))
            except ValueError as e:
                report.failed.append((rel, str(e)))
        if progress is not None:
            progress(len(files), len(files), "")
        if not report.sessions:
            raise UsageError("; ".join(f"{f}: {r}" for f, r in report.failed[:3]))
    return report

"""`dsbuild import mcap`: MCAP robot logs, one session per file.

Channels are read as the ``mcap`` writers write them: JSON (``jsonschema`` schema, or none), ROS 2 CDR
(``ros2msg`` schema, via ``mcap-ros2-support``) or protobuf (via ``mcap-protobuf-support``). One image
topic becomes the video (raw images and JPEG/PNG compressed images, re-encoded to H.264 at their log
times; compressed video, ``foxglove.CompressedVideo`` in H.264 or H.265, remuxed as it is, one access unit
per message, at their log times); chosen topics become telemetry (every numeric field, flattened with its path: ``joint_states/
position.0``) and actions (the same, declared continuous controls: a robot's commands are in its own
units). Times are log times, zero at the first video frame. A ROS 2 bag in sqlite3 storage (``.db3``)
and ``ros2idl`` schemas are refused in one line naming what is supported.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dsbuild.core.errors import MissingDependency, UsageError
from dsbuild.importers.common import (
    H264Writer,
    ImportReport,
    SessionReport,
    jsonl,
    session_id,
    staged,
    write_session,
)

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
# foxglove.CompressedVideo's ``format`` -> FFmpeg's raw demuxer of that codec; these are remuxed into MP4
# as they are. Its other formats (vp9, av1) are refused by name.
VIDEO_FORMATS = {"h264": "h264", "h265": "hevc"}
KNOWN_VIDEO_FORMATS = ("h264", "h265", "vp9", "av1")
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


def payload(msg: dict) -> bytes | str:
    """A message's ``data`` bytes (JSON carries them as base64, CDR may as a list of ints), or why not."""
    data = msg.get("data")
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except ValueError:
            return "data is not base64"
    elif isinstance(data, list):
        data = bytes(data) if all(isinstance(b, int) and 0 <= b < 256 for b in data) else None
    return data if isinstance(data, bytes) else "no image data"


def is_compressed_video(schema, msg: object) -> bool:
    """Whether a video topic's message is compressed video (``foxglove.CompressedVideo``, by its schema's
    name or a video ``format``) rather than an image."""
    name = schema.name if schema is not None else ""
    fmt = msg.get("format") if isinstance(msg, dict) else None
    return name.endswith("CompressedVideo") or (isinstance(fmt, str) and fmt.lower() in KNOWN_VIDEO_FORMATS)


def is_keyframe(codec: str, data: bytes) -> bool:
    """Whether an Annex B access unit holds an IDR picture (H.264 NAL type 5) or an IRAP picture (H.265
    NAL types 16-23): where a decoder can start, and where convert may cut a clip."""
    for start in re.finditer(b"\x00\x00\x01", data):
        i = start.end()
        if i < len(data):
            if codec == "h264" and data[i] & 0x1F == 5:
                return True
            if codec == "hevc" and 16 <= (data[i] >> 1) & 0x3F <= 23:
                return True
    return False


def _image(msg: dict) -> object:
    """An av.VideoFrame from a raw or compressed image message, or (a str) why not."""
    import av
    import numpy as np

    data = payload(msg)
    if isinstance(data, str):
        return data
    if isinstance(msg.get("format"), str):  # sensor_msgs/CompressedImage, foxglove.CompressedImage
        codec = "png" if "png" in msg["format"].lower() else "mjpeg"
        try:
            decoder: Any = av.CodecContext.create(codec, "r")
            frames = decoder.decode(av.Packet(data))
        except av.error.FFmpegError as e:
            return f"{msg['format']} image does not decode ({e.strerror or e})"
        return frames[0] if frames else f"{msg['format']} image holds no picture"
    encoding, width, height = msg.get("encoding"), msg.get("width"), msg.get("height")
    if encoding not in RAW_FORMATS or not isinstance(width, int) or not isinstance(height, int):
        return f"image encoding {encoding!r} is not one of {', '.join(RAW_FORMATS)}"
    fmt, channels = RAW_FORMATS[encoding]
    step = msg.get("step") or width * channels
    if width <= 0 or height <= 0 or not isinstance(step, int) or step < width * channels or len(data) < step * height:
        return f"a {width}x{height} {encoding} image with step {step} does not fit its {len(data)} bytes"
    pixels = np.frombuffer(data, np.uint8, step * height).reshape(height, step)[:, : width * channels]
    pixels = pixels.reshape(height, width, channels) if channels > 1 else pixels
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format=fmt)


class _Remuxer:
    """Compressed video access units in MP4 as they are (no re-encode), at their log times. FFmpeg's raw
    demuxer reads the first keyframe's parameter sets (SPS/PPS) into the stream's codec parameters; the
    MP4 muxer turns them and the Annex B units into its own layout."""

    def __init__(self, path: Path, codec: str, first: bytes, rate: Fraction):
        import io

        import av

        try:
            with av.open(io.BytesIO(first), format=codec) as probe:
                template = probe.streams.video[0] if probe.streams.video else None
                if template is None or not template.codec_context.width:
                    raise ValueError(f"the first {codec} keyframe does not say the picture size (no SPS?)")
                self.container = av.open(str(path), "w", format="mp4", options={"fflags": "+bitexact"})
                self.stream = self.container.add_stream_from_template(template)
        except av.error.FFmpegError as e:
            raise ValueError(f"the first {codec} keyframe does not parse ({e.strerror or e})") from None
        self.stream.time_base = TIME_BASE
        self.duration = max(1, round(1 / (rate * TIME_BASE)))  # the last frame's; the others' follow from pts

    def add(self, unit: tuple[bytes, bool], pts: int) -> None:
        import av

        data, key = unit
        packet = av.Packet(data)
        packet.pts = packet.dts = pts  # (foxglove.CompressedVideo has no B-frames: decode order is display order)
        packet.time_base, packet.duration, packet.is_keyframe = TIME_BASE, self.duration, key
        packet.stream = self.stream
        self.container.mux(packet)

    def close(self) -> None:
        self.container.close()


def video_codec(topic: str, msg: object) -> str:
    """The FFmpeg codec of a compressed-video topic, from its first message's ``format``; ValueError names
    the topic and what is supported when it is another."""
    fmt = msg.get("format") if isinstance(msg, dict) else None
    codec = VIDEO_FORMATS.get(fmt.lower()) if isinstance(fmt, str) else None
    if codec is None:
        raise ValueError(
            f"topic {topic}: compressed video format {fmt!r} is not supported; "
            f"supported: {', '.join(VIDEO_FORMATS)} (remuxed as they are)"
        )
    return codec


class _VideoTrack:
    """The video topic's messages into the session's video: images re-encoded (``H264Writer``), compressed
    video remuxed (``_Remuxer``), each at its log time; the first decoded message says which it is."""

    def __init__(self, topic: str, path: Path, rate: Fraction, crf: int):
        self.topic, self.path, self.rate, self.crf = topic, path, rate, crf
        self.codec: str | None = None  # the compressed video's codec; None: images
        self.seen = False
        self.sink: H264Writer | _Remuxer | None = None
        self.t0: int | None = None
        self.last_pts = -1

    def add(self, schema, msg: object, log_time: int, where: str, report: SessionReport) -> None:
        if not self.seen:
            self.seen = True
            if is_compressed_video(schema, msg):
                self.codec = video_codec(self.topic, msg)
        item = self._item(msg)
        if isinstance(item, str):
            report.drop("video_frames", where, item)
            return
        if self.t0 is None:
            self.t0 = log_time
            if self.codec is None:
                self.sink = H264Writer(self.path, TIME_BASE, self.crf)
                self.sink.add_stream(item, self.rate)
            else:
                self.sink = _Remuxer(self.path, self.codec, item[0], self.rate)
        pts = round(Fraction(log_time - self.t0, 1_000_000_000) / TIME_BASE)
        if pts <= self.last_pts:
            report.drop("video_frames", where, "logged at the time of the frame before it")
            return
        assert self.sink is not None
        self.sink.add(item, pts)
        self.last_pts = pts

    def _item(self, msg: object) -> Any:
        """An av.VideoFrame (images) or (access unit, keyframe?) (compressed video), or why not."""
        if not isinstance(msg, dict):
            return "not an image message"
        if self.codec is None:
            return _image(msg)
        fmt = msg.get("format")
        if not isinstance(fmt, str) or VIDEO_FORMATS.get(fmt.lower()) != self.codec:
            return f"format {fmt!r} in a {self.codec} stream"
        data = payload(msg)
        if isinstance(data, str):
            return data
        key = is_keyframe(self.codec, data)
        if self.t0 is None and not key:
            return "before the first keyframe (no decoder can start there)"
        return data, key

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


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
    track = _VideoTrack(options.video_topic, video, rate, options.crf)
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
                track.add(schema, msg, message.log_time, where, report)
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
        track.close()
    t0 = track.t0
    if t0 is None:
        raise ValueError(f"topic {options.video_topic}: no message is an image or video frame this importer reads")
    report.duration = round(track.last_pts * float(TIME_BASE), 6)

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

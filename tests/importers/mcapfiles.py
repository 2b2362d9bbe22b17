"""MCAP files written by the real ``mcap`` writers (``mcap``, ``mcap-ros2-support``), for the importer's
tests and docs: a camera topic, a telemetry topic and an action topic, at known log times."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

T0 = 1_793_527_200_000_000_000  # 2026-11-01T10:00:00Z in nanoseconds
FPS = 20
W, H = 64, 48


def picture(i: int) -> np.ndarray:
    """A moving, grainy RGB picture (no clip is frozen or black)."""
    rng = np.random.default_rng(i)
    img = rng.integers(0, 90, (H, W, 3), dtype=np.uint8)
    img[:, (i * 3) % W : (i * 3) % W + 8] = 250
    return img


def frame_times(frames: int) -> list[int]:
    return [T0 + i * 1_000_000_000 // FPS for i in range(frames)]


def states(frames: int) -> list[tuple[int, list[float], float]]:
    """(log time, joint positions in rad, speed) at every other frame, offset by 1 ms."""
    return [
        (T0 + i * 1_000_000_000 // FPS + 1_000_000, [0.5 * i, -2.5 + 0.25 * i], 10.0 + i) for i in range(0, frames, 2)
    ]


def commands(frames: int) -> list[tuple[int, list[float]]]:
    """(log time, joint targets in rad, far outside [-1, 1]) at every third frame."""
    return [(T0 + i * 1_000_000_000 // FPS + 2_000_000, [3.0 * i - 7.5, 1.25]) for i in range(0, frames, 3)]


IMAGE_SCHEMA = {
    "type": "object",
    "properties": {
        "width": {"type": "integer"},
        "height": {"type": "integer"},
        "encoding": {"type": "string"},
        "step": {"type": "integer"},
        "data": {"type": "string", "contentEncoding": "base64"},
    },
}


def json_mcap(path: Path, frames: int = 30) -> Path:
    """JSON channels with jsonschema schemas: /camera (raw rgb8 images), /state, /cmd."""
    from mcap.writer import Writer

    with open(path, "wb") as f:
        w = Writer(f)
        w.start(profile="", library="tests")
        image = w.register_schema("RawImage", "jsonschema", json.dumps(IMAGE_SCHEMA).encode())
        state = w.register_schema("State", "jsonschema", json.dumps({"type": "object"}).encode())
        cam = w.register_channel("/camera", "json", image)
        st = w.register_channel("/state", "json", state)
        cmd = w.register_channel("/cmd", "json", state)
        msgs = []
        for i, t in enumerate(frame_times(frames)):
            img = picture(i)
            doc = {
                "width": W,
                "height": H,
                "encoding": "rgb8",
                "step": W * 3,
                "data": base64.b64encode(img.tobytes()).decode(),
            }
            msgs.append((t, cam, doc))
        msgs += [(t, st, {"joint": {"position": p}, "speed": s, "frame_id": "base"}) for t, p, s in states(frames)]
        msgs += [(t, cmd, {"target": p}) for t, p in commands(frames)]
        for t, channel, doc in sorted(msgs, key=lambda m: (m[0], m[1])):
            w.add_message(channel, log_time=t, data=json.dumps(doc).encode(), publish_time=t)
        w.finish()
    return path


HEADER = """builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec"""
IMAGE_MSG = "std_msgs/Header header\nstring format\nuint8[] data\n" + "=" * 80 + "\nMSG: std_msgs/Header\n" + HEADER
JOINT_MSG = "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort\n"
JOINT_MSG += "=" * 80 + "\nMSG: std_msgs/Header\n" + HEADER
ARRAY_MSG = "float64[] data\n"


def jpeg(img: np.ndarray) -> bytes:
    from fractions import Fraction

    import av

    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt = W, H, "yuvj420p"
    ctx.time_base = Fraction(1, 1)
    frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuvj420p")
    return b"".join(bytes(p) for p in ctx.encode(frame))


def ros2_mcap(path: Path, frames: int = 30) -> Path:
    """ROS 2 CDR channels: /camera/compressed (sensor_msgs/msg/CompressedImage, JPEG), /joint_states
    (sensor_msgs/msg/JointState), /cmd (std_msgs/msg/Float64MultiArray-like)."""
    from mcap_ros2.writer import Writer

    with open(path, "wb") as f:
        w = Writer(f)
        image = w.register_msgdef("sensor_msgs/msg/CompressedImage", IMAGE_MSG)
        joints = w.register_msgdef("sensor_msgs/msg/JointState", JOINT_MSG)
        array = w.register_msgdef("example/msg/Targets", ARRAY_MSG)
        msgs = []
        for i, t in enumerate(frame_times(frames)):
            header = {"stamp": {"sec": t // 10**9, "nanosec": t % 10**9}, "frame_id": "cam"}
            msgs.append(
                (t, 0, "/camera/compressed", image, {"header": header, "format": "jpeg", "data": jpeg(picture(i))})
            )
        for t, p, s in states(frames):
            header = {"stamp": {"sec": t // 10**9, "nanosec": t % 10**9}, "frame_id": "base"}
            doc = {"header": header, "name": ["a", "b"], "position": p, "velocity": [s, s], "effort": []}
            msgs.append((t, 1, "/joint_states", joints, doc))
        msgs += [(t, 2, "/cmd", array, {"data": p}) for t, p in commands(frames)]
        for t, _, topic, schema, doc in sorted(msgs, key=lambda m: (m[0], m[1])):
            w.write_message(topic, schema, doc, log_time=t, publish_time=t)
        w.finish()
    return path


def _protobuf_classes():
    """RawImage and State as protobuf message classes, built from a descriptor (no generated code)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="robot_test.proto", package="robot_test", syntax="proto3")
    image = file.message_type.add(name="RawImage")
    for n, (name, kind) in enumerate(
        [
            ("width", F.TYPE_UINT32),
            ("height", F.TYPE_UINT32),
            ("encoding", F.TYPE_STRING),
            ("step", F.TYPE_UINT32),
            ("data", F.TYPE_BYTES),
        ],
        1,
    ):
        image.field.add(name=name, number=n, type=kind, label=F.LABEL_OPTIONAL)
    state = file.message_type.add(name="State")
    state.field.add(name="position", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_REPEATED)
    state.field.add(name="speed", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"robot_test.{n}")) for n in ("RawImage", "State")
    )


def protobuf_mcap(path: Path, frames: int = 30) -> Path:
    """Protobuf channels (``mcap-protobuf-support``): /camera (raw rgb8), /state, /cmd (State)."""
    from mcap_protobuf.writer import Writer

    RawImage, State = _protobuf_classes()
    msgs: list[tuple[int, int, str, object]] = []
    for i, t in enumerate(frame_times(frames)):
        msgs.append(
            (t, 0, "/camera", RawImage(width=W, height=H, encoding="rgb8", step=W * 3, data=picture(i).tobytes()))
        )
    msgs += [(t, 1, "/state", State(position=p, speed=s)) for t, p, s in states(frames)]
    msgs += [(t, 2, "/cmd", State(position=p)) for t, p in commands(frames)]
    with open(path, "wb") as f:
        w = Writer(f)
        for t, _, topic, msg in sorted(msgs, key=lambda m: (m[0], m[1])):
            w.write_message(topic, msg, log_time=t, publish_time=t)
        w.finish()
    return path


GOP = 10  # frames between keyframes of the compressed-video files: clips of 0.5 s at 20 fps


def h264_units(frames: int, codec: str = "libx264") -> list[tuple[bytes, bool]]:
    """(Annex B access unit, keyframe?) of ``frames`` pictures, as a robot's encoder streams them: no
    B-frames, parameter sets repeated before every keyframe, one unit per picture."""
    from fractions import Fraction

    import av

    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt = W, H, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, FPS), Fraction(FPS)
    ctx.flags |= av.codec.context.Flags.bitexact
    if codec == "libx264":
        ctx.options = {"preset": "ultrafast", "bframes": "0", "g": str(GOP), "keyint_min": str(GOP), "threads": "1"}
        ctx.options["x264-params"] = "scenecut=0"
    else:
        ctx.options = {
            "preset": "ultrafast",
            "x265-params": f"bframes=0:keyint={GOP}:min-keyint={GOP}:scenecut=0:"
            "pools=1:frame-threads=1:log-level=error:repeat-headers=1",
        }
    units = []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(picture(i), format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        units += [(bytes(p), bool(p.is_keyframe)) for p in ctx.encode(frame)]
    units += [(bytes(p), bool(p.is_keyframe)) for p in ctx.encode()]
    assert len(units) == frames
    return units


VIDEO_SCHEMA = {
    "type": "object",
    "properties": {
        "timestamp": {"type": "object"},
        "frame_id": {"type": "string"},
        "data": {"type": "string", "contentEncoding": "base64"},
        "format": {"type": "string"},
    },
}


VIDEO_MSG = "builtin_interfaces/Time timestamp\nstring frame_id\nuint8[] data\nstring format\n"
VIDEO_MSG += "=" * 80 + "\nMSG: builtin_interfaces/Time\nint32 sec\nuint32 nanosec"


def _compressed_video_class():
    """foxglove.CompressedVideo (timestamp, frame_id, data, format) as a protobuf class, from a descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    F = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    stamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(stamp)
    pool.Add(stamp)
    file = descriptor_pb2.FileDescriptorProto(
        name="foxglove/CompressedVideo.proto",
        package="foxglove",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    video = file.message_type.add(name="CompressedVideo")
    video.field.add(name="timestamp", number=1, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    video.field.add(name="frame_id", number=2, type=F.TYPE_STRING)
    video.field.add(name="data", number=3, type=F.TYPE_BYTES)
    video.field.add(name="format", number=4, type=F.TYPE_STRING)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("foxglove.CompressedVideo"))


def video_mcap(path: Path, kind: str = "json", frames: int = 30, first: int = 0, fmt: str = "h264") -> Path:
    """/camera as foxglove.CompressedVideo (``kind`` json, protobuf or ros2): one access unit per message at
    the frame times, from picture ``first`` on (a log that starts inside a GOP), and /cmd as in
    ``json_mcap``. ``fmt`` is the message's format field (h265 encodes with libx265; any other is
    written as H.264 bytes under that name)."""
    from mcap.writer import Writer

    units = h264_units(frames, "libx265" if fmt == "h265" else "libx264")[first:]
    times = frame_times(frames)[first:]
    with open(path, "wb") as f:
        if kind == "ros2":
            from mcap_ros2.writer import Writer as Ros2Writer

            w2 = Ros2Writer(f)
            schema = w2.register_msgdef("foxglove_msgs/msg/CompressedVideo", VIDEO_MSG)
            for t, (data, _) in zip(times, units):
                stamp = {"sec": t // 10**9, "nanosec": t % 10**9}
                doc = {"timestamp": stamp, "frame_id": "cam", "data": data, "format": fmt}
                w2.write_message("/camera", schema, doc, log_time=t, publish_time=t)
            w2.finish()
            return path
        if kind == "protobuf":
            from mcap_protobuf.writer import Writer as ProtobufWriter

            CompressedVideo = _compressed_video_class()
            w = ProtobufWriter(f)
            for t, (data, _) in zip(times, units):
                msg = CompressedVideo(frame_id="cam", data=data, format=fmt)
                msg.timestamp.FromNanoseconds(t)
                w.write_message("/camera", msg, log_time=t, publish_time=t)
            w.finish()
            return path
        w = Writer(f)
        w.start(profile="", library="tests")
        video = w.register_schema("foxglove.CompressedVideo", "jsonschema", json.dumps(VIDEO_SCHEMA).encode())
        state = w.register_schema("State", "jsonschema", json.dumps({"type": "object"}).encode())
        cam = w.register_channel("/camera", "json", video)
        cmd = w.register_channel("/cmd", "json", state)
        msgs = []
        for t, (data, _) in zip(times, units):
            stamp = {"sec": t // 10**9, "nsec": t % 10**9}
            doc = {"timestamp": stamp, "frame_id": "cam", "data": base64.b64encode(data).decode(), "format": fmt}
            msgs.append((t, cam, doc))
        msgs += [(t, cmd, {"target": p}) for t, p in commands(frames) if t >= times[0]]
        for t, channel, doc in sorted(msgs, key=lambda m: (m[0], m[1])):
            w.add_message(channel, log_time=t, data=json.dumps(doc).encode(), publish_time=t)
        w.finish()
    return path

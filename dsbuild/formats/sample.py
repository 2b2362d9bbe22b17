"""A sample (one clip) and its canonical encoding, shared by every shard format.

The sample hash is computed over the canonical members, not over a shard's bytes, so the same clip has
the same hash in a WebDataset tar and in a Parquet row: content ids compare across formats and layouts.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass

import numpy as np

from dsbuild.errors import FormatError
from dsbuild.formats.safejson import canonical_json

SAMPLE_FORMAT = "dsbuild.sample/1"
KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
# Member extensions in canonical order (the order of tar members and of the hash).
ARRAY_MEMBERS = ("actions.npy", "telemetry.npy", "timestamps.npy")
EVENTS_MEMBER = "events.jsonl.zst"
VIDEO_EXT = "mp4"  # the video member of every sample convert writes: every clip is MP4
VIDEO_EXTS = ("mp4", "webm", "mkv")  # video members readers accept (versions written before clips were all MP4)


def sample_key(session_id: str, clip_index: int) -> str:
    """``<session>__<clip:06d>``: unique (fixed-width suffix), dot-free, sorts by session then clip."""
    return f"{session_id}__{clip_index:06d}"


def npy_bytes(arr: np.ndarray) -> bytes:
    """NumPy .npy v1.0 bytes: deterministic header, no pickle."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def npy_load(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


MAX_EVENTS_BYTES = 256 << 20  # raw events of one clip; a frame claiming more is a bomb, not a capture


def decompress_events(blob: bytes, limit: int = MAX_EVENTS_BYTES) -> bytes:
    """The raw action events of a sample, decompressed with a hard output bound (zip-bomb safe):
    a frame header claiming more than ``limit`` is refused unread, and streaming stops at ``limit``."""
    import zstandard

    try:
        claimed = zstandard.get_frame_parameters(blob).content_size
        if claimed != zstandard.CONTENTSIZE_UNKNOWN and claimed > limit:
            raise FormatError(f"events frame claims {claimed} bytes, over the limit of {limit}")
        out, total = [], 0
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)) as reader:
            while chunk := reader.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    raise FormatError(f"events expand beyond {limit} bytes (over the limit)")
                out.append(chunk)
    except zstandard.ZstdError as e:
        raise FormatError(f"events do not decompress (not valid zstd: {e})") from None
    return b"".join(out)


@dataclass(frozen=True)
class Sample:
    """One clip with all its modalities. ``events`` is the zstd-compressed canonical JSONL of the raw
    action events in the window (zstd pays ~5x there; it would gain nothing on video)."""

    key: str
    meta: dict
    video: bytes
    video_ext: str
    actions: np.ndarray  # float32 [frames, controls]
    telemetry: np.ndarray  # float32 [frames, channels]
    timestamps: np.ndarray  # float64 [frames], seconds from the session's first frame
    events: bytes

    def members(self) -> list[tuple[str, bytes]]:
        """(extension, payload) pairs in canonical order."""
        return [
            ("json", canonical_json(self.meta)),
            (self.video_ext, self.video),
            ("actions.npy", npy_bytes(self.actions)),
            ("telemetry.npy", npy_bytes(self.telemetry)),
            ("timestamps.npy", npy_bytes(self.timestamps)),
            (EVENTS_MEMBER, self.events),
        ]


def members_sha256(members: list[tuple[str, bytes]]) -> str:
    """Hash of a sample's canonical members: extension, length and payload of each, in order."""
    h = hashlib.sha256()
    for ext, payload in members:
        h.update(ext.encode())
        h.update(b"\0%d\0" % len(payload))
        h.update(payload)
    return h.hexdigest()

"""A sample (one clip with all its modalities), its typed metadata and its canonical members.

The sample hash is computed over the canonical members, not over a shard's bytes, so the same clip has
the same hash in a WebDataset tar and in a Parquet row: content ids compare across formats and layouts.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blake3 import blake3

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import canonical_json
from dsbuild.core.records import Record, spec

if TYPE_CHECKING:  # numpy loads lazily: `dsbuild log` and `info` start without it
    import numpy as np

SAMPLE_FORMAT = "dsbuild.sample/2"
KEY_PATTERN = r"[A-Za-z0-9_-]{1,80}"
KEY_RE = re.compile(KEY_PATTERN)
VIDEO_EXT = "mp4"  # every clip of every version is MP4: one member name for every reader
GAP_SECONDS = 1.0  # no frame for longer than this is a gap in the recording, which no clip's window spans
# Member extensions in canonical order (the order of tar members and of the hash).
MEMBERS = ("json", VIDEO_EXT, "actions.npy", "telemetry.npy", "timestamps.npy", "events.jsonl.zst")
ARRAY_MEMBERS = MEMBERS[2:5]
EVENTS_MEMBER = MEMBERS[5]
MAX_EVENTS_BYTES = 256 << 20  # raw events of one clip; a frame claiming more is a bomb, not a capture
MAX_META_BYTES = 64 << 20  # a sample's metadata holds its text events; far beyond any clip


def sample_key(session_id: str, clip_index: int) -> str:
    """``<session>__<clip:06d>``: unique (fixed-width suffix), dot-free, sorts by session then clip."""
    return f"{key_prefix(session_id)}{clip_index:06d}"


def key_prefix(session_id: str) -> str:
    """What every key of a session starts with: no key of it sorts below this string."""
    return f"{session_id}__"


@dataclass(frozen=True, slots=True)
class SessionFields(Record):
    """The capture session's fields, carried into every sample (no host paths)."""

    session_id: str
    title: str
    player: str
    platform: str | None = None
    build: str | None = None
    started_at: str | None = None
    conditions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClipWindow(Record):
    """Where the clip lies in its session: seconds from the session's first video frame."""

    index: int = field(metadata=spec(minimum=0))
    t_start: float
    t_end: float
    frames: int = field(metadata=spec(minimum=0))
    duration: float


@dataclass(frozen=True, slots=True)
class ClipAudio(Record):
    """The audio carried in the clip's MP4 (cut to the clip's window)."""

    codec: str
    sample_rate: int = field(metadata=spec(minimum=1))
    channels: int = field(metadata=spec(minimum=1))
    start: float  # seconds from the clip's first video frame (negative: audio starts earlier)
    duration: float


@dataclass(frozen=True, slots=True)
class ClipVideo(Record):
    """The clip's encoding: what a GPU decoder needs to know before it sees the bytes."""

    codec: str
    width: int = field(metadata=spec(minimum=1))
    height: int = field(metadata=spec(minimum=1))
    fps: float | None
    container: str = VIDEO_EXT
    codec_tag: str | None = None
    has_audio: bool = False
    audio: ClipAudio | None = None


@dataclass(frozen=True, slots=True)
class TextEvent(Record):
    t: float
    text: str
    speaker: str | None = None


@dataclass(frozen=True, slots=True)
class ContinuousControl(Record):
    """A control its session declares continuous (docs/capture-format.md): its action values are any
    finite float32, in this unit and (where known) this range, not a button or an axis in [-1, 1]."""

    unit: str | None = field(default=None, metadata=spec(absent_when_none=True))
    range: tuple[float, ...] | None = field(default=None, metadata=spec(absent_when_none=True))


@dataclass(frozen=True, slots=True)
class SampleMeta(Record):
    """The ``<key>.json`` member."""

    FORMAT = SAMPLE_FORMAT
    key: str = field(metadata=spec(pattern=KEY_PATTERN))
    session: SessionFields
    clip: ClipWindow
    video: ClipVideo
    controls: tuple[str, ...]
    telemetry_channels: tuple[str, ...]
    text: tuple[TextEvent, ...]
    action_events: int = field(metadata=spec(minimum=0))
    sources: dict[str, str]  # role -> sha256 of the source file (session, video, actions...)
    continuous: dict[str, ContinuousControl] | None = field(
        default=None, metadata=spec(absent_when_none=True, doc="controls whose values are not held to [-1, 1]")
    )  # absent when the session declares none: every capture/1 sample keeps its bytes


@dataclass(frozen=True, slots=True)
class SampleVideo(Record):
    """The ``<key>.json`` member as the loader learns a session's codec from it: the key and the clip's
    encoding, checked as ``SampleMeta`` checks them; the rest is left unread (per session, on every
    loader's start)."""

    FORMAT = SAMPLE_FORMAT
    PARTIAL = True
    key: str = field(metadata=spec(pattern=KEY_PATTERN))
    video: ClipVideo


def npy_bytes(arr: np.ndarray) -> bytes:
    """NumPy .npy v1.0 bytes: deterministic header, no pickle. A bool or number array's header is
    ``npy_header``'s (cached: the bytes ``write_array`` makes, not formatted again for every member)."""
    import numpy as np

    arr = np.ascontiguousarray(arr)
    if arr.dtype.kind in "biuf":
        return npy_header(arr.dtype.str, arr.shape) + arr.tobytes()
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


ARRAY_DESCRS = ("<f4", "<f4", "<f8")  # the dtypes of ARRAY_MEMBERS (actions, telemetry, timestamps) as written
MAX_NPY_HEADER = 4096  # a .npy header of ours is 128 bytes; one claiming more is refused unparsed


@functools.lru_cache(maxsize=1024)
def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The exact header (magic to padding) ``npy_bytes`` writes for a C-order array of ``descr`` and
    ``shape``: a member that starts with it and holds exactly the array's bytes after it needs no parse."""
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npy_problem(data: bytes | memoryview, descr: str, shape: tuple[int, ...], total: int | None = None) -> str | None:
    """What keeps the .npy member ``data`` from being exactly a C-order ``descr`` array of ``shape``
    (None: nothing). The common case is one comparison with the header the writer makes; anything else is
    parsed by its header (magic, version, a length of at most ``MAX_NPY_HEADER``, then dtype, byte order,
    ``fortran_order`` and shape) and named: a big-endian float64 or a Fortran-order array of the right
    size is a damaged sample, never bytes reinterpreted as float32. Nothing is converted. ``total``: the
    member's size, when ``data`` is only its first bytes (at least ``MAX_NPY_HEADER + 16`` of them)."""
    need = math.prod(shape) * int(descr[2:])  # ("<f4": 4 bytes a value; numpy is not needed to say so)
    head = npy_header(descr, shape)
    total = len(data) if total is None else total
    if total == len(head) + need and data[: len(head)] == head:
        return None
    import numpy as np

    want = np.dtype(descr)
    data = bytes(data[: MAX_NPY_HEADER + 16])
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        return "not a .npy array (no NUMPY magic)"
    major = data[6]
    width = 2 if major == 1 else 4 if major in (2, 3) else 0
    if not width:
        return f".npy version {major} is unknown"
    hlen = int.from_bytes(data[8 : 8 + width], "little")
    if hlen > MAX_NPY_HEADER:
        return f".npy header claims {hlen} bytes, over the limit of {MAX_NPY_HEADER}"
    f = io.BytesIO(data)
    try:
        np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        got_shape, fortran, dtype = read(f, max_header_size=MAX_NPY_HEADER)
    except (ValueError, TypeError, SyntaxError, OSError, EOFError) as e:
        return f".npy header does not parse ({str(e)[:80]})"
    what = f"{dtype.str} {list(got_shape)}{' fortran_order' if fortran else ''}"
    if dtype != want or dtype.byteorder not in ("<", "=", "|") or tuple(got_shape) != tuple(shape):
        return f"is {what}, expected {descr} {list(shape)}"
    if fortran and sum(n > 1 for n in shape) > 1:
        return f"is {what} (Fortran order), expected C order"
    if total - f.tell() != need:
        return f"holds {total - f.tell()} bytes after its header, its {descr} {list(shape)} array needs {need}"
    return None  # the right array, its header formatted otherwise (another numpy wrote it)


def array_shapes(frames: int, controls: int, channels: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of a sample's ARRAY_MEMBERS (actions, telemetry, timestamps), as its index row gives them."""
    return ((frames, controls), (frames, channels), (frames,))


def arrays_problem(heads: Sequence[tuple[bytes | memoryview, int]], shapes: Sequence[tuple[int, ...]]) -> str | None:
    """What keeps a sample's array members from being exactly the arrays its index row records, naming
    the member (``npy_problem`` of each; None: nothing). ``heads``: each ARRAY_MEMBERS member's bytes, or
    its first bytes, with its size; ``shapes``: ``array_shapes`` of its row."""
    for ext, descr, shape, (head, size) in zip(ARRAY_MEMBERS, ARRAY_DESCRS, shapes, heads):
        if why := npy_problem(head, descr, shape, total=size):
            return f"{ext} {why}"
    return None


def npy_load(data: bytes, native: bool = False) -> np.ndarray:
    """A plain .npy array; its header's shape and dtype must account for exactly the bytes that follow it
    (ValueError otherwise): ``np.load`` allocates what the header declares before reading, so a 100-byte
    member declaring (2**40,) floats was an out-of-memory failure, not a damaged sample. ``native``: also
    little-endian and in C order, as the writer makes it (readers that slice the bytes, like the loader,
    would read anything else as other numbers; a wrong dtype is left to the checks that name it)."""
    import numpy as np

    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f, max_header_size=MAX_NPY_HEADER)
    if dtype.hasobject:
        raise ValueError("object arrays are refused (they would need pickle)")
    if native and (dtype.byteorder == ">" or (fortran and sum(n > 1 for n in shape) > 1)):
        raise ValueError(f"it is {dtype.str}{' in Fortran order' if fortran else ''}: little-endian C order expected")
    need = dtype.itemsize
    for n in shape:
        need *= n
    if need != len(data) - f.tell():
        raise ValueError(f"its header declares {shape} of {dtype} ({need} bytes); it holds {len(data) - f.tell()}")
    f.seek(0)
    return np.load(f, allow_pickle=False)


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


@dataclass(frozen=True, slots=True)
class Sample:
    """One clip with all its modalities. ``events`` is the zstd-compressed canonical JSONL of the raw
    action events in the window (zstd pays ~5x there; it would gain nothing on video)."""

    key: str
    meta: SampleMeta
    video: bytes
    actions: np.ndarray  # float32 [frames, controls]
    telemetry: np.ndarray  # float32 [frames, channels]
    timestamps: np.ndarray  # float64 [frames], seconds from the session's first frame
    events: bytes

    def members(self) -> list[tuple[str, bytes]]:
        """(extension, payload) pairs in canonical order."""
        return [
            ("json", canonical_json(self.meta.to_json())),
            (VIDEO_EXT, self.video),
            ("actions.npy", npy_bytes(self.actions)),
            ("telemetry.npy", npy_bytes(self.telemetry)),
            ("timestamps.npy", npy_bytes(self.timestamps)),
            (EVENTS_MEMBER, self.events),
        ]


LARGE_PAYLOAD = 16 << 10  # hashed by itself (the GIL released); smaller pieces are joined first


def _members_digest(h, members: Iterable[tuple[str, bytes | memoryview]]) -> str:
    """``h`` over a sample's canonical members: extension, NUL, decimal length, NUL and payload of each,
    in order. Small pieces go in as one update: each update holds the GIL, which two loader threads
    hashing every sample queued on (18 updates a sample before)."""
    small: list = []
    for ext, payload in members:
        small.append(b"%s\0%d\0" % (ext.encode(), len(payload)))
        if len(payload) >= LARGE_PAYLOAD:
            h.update(b"".join(small))
            h.update(payload)
            small = []
        else:
            small.append(payload)
    h.update(b"".join(small))
    return h.hexdigest()


def members_sha256(members: Iterable[tuple[str, bytes | memoryview]]) -> str:
    """The sample hash (its identity in the index, the shard framing and the lineage)."""
    return _members_digest(hashlib.sha256(), members)


def members_blake3(members: Iterable[tuple[str, bytes | memoryview]]) -> str:
    """BLAKE3 of the same bytes, recorded beside the sample hash: the loader's per-read check
    (``verify="sample"``) hashes with it, 2.3x faster than sha256 here and as strong against damage."""
    return _members_digest(blake3(), members)


def sample_from_members(key: str, members: dict[str, bytes]) -> Sample:
    """Decode canonical members into a typed Sample; FormatError names what is missing or malformed."""
    from dsbuild.core.jsonio import loads_bounded

    missing = [m for m in MEMBERS if m not in members]
    if missing:
        raise FormatError(f"{key}: missing member(s) {', '.join('.' + m for m in missing)}")
    meta = SampleMeta.from_json(
        loads_bounded(bytes(members["json"]), max_bytes=MAX_META_BYTES, what=f"{key}.json"), f"{key}.json"
    )
    try:
        actions, telemetry, timestamps = (npy_load(bytes(members[m]), native=True) for m in ARRAY_MEMBERS)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"{key}: an array member is not a plain .npy array ({str(e)[:120]})") from None
    return Sample(key, meta, members[VIDEO_EXT], actions, telemetry, timestamps, members[EVENTS_MEMBER])

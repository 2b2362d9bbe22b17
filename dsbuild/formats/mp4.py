"""Writing clips as standalone MP4: every clip of every version is one container, one member name.

Packets are copied, never re-encoded, with two repairs real captures need: Matroska gives packets without
dts (x264 with B-frames in mkv), so dts is rebuilt from the sorted pts (``monotonic_dts``); and sample
entry tags that players rely on survive (``hvc1`` stays ``hvc1``, not FFmpeg's default ``hev1``).
Annex-B H.264/HEVC (MPEG-TS) is converted by the MP4 muxer itself (length-prefixed NAL units, avcC/hvcC
from the parameter sets the demuxer extracted), and ADTS AAC gets ``aac_adtstoasc`` automatically.

``+bitexact`` keeps library version strings and creation times out of the bytes, so the same packets
give the same file on any machine.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from fractions import Fraction

from dsbuild.core.errors import FormatError

# Sample entry tags a source may carry into MP4 unchanged, per codec.
_KEEP_TAGS = {"h264": ("avc1", "avc3"), "hevc": ("hvc1", "hev1")}
# The tag of every other clip. hvc1 for untagged HEVC (Matroska, MPEG-TS): Apple players require it, and
# FFmpeg would pick hev1. The others are what FFmpeg's MP4 muxer writes (listed so metadata can name them).
_DEFAULT_TAGS = {
    "h264": "avc1",
    "hevc": "hvc1",
    "av1": "av01",
    "vp9": "vp09",
    "mpeg4": "mp4v",
    "mpeg2video": "mp4v",
    "mpeg1video": "mp4v",
    "mjpeg": "mp4v",
}
_SET_TAGS = frozenset(_KEEP_TAGS)  # codecs whose tag we set; the muxer picks the rest
MUX_OPTIONS = {"fflags": "+bitexact"}


def demux_only(container, stream) -> None:
    """Have the demuxer skip every stream of ``container`` but ``stream`` (PyAV >= 17.1). Convert opens a
    capture twice, for its video and for its audio; each demuxer used to read, then drop, the other's
    packets as well (all of the video's bytes a second time, for the audio)."""
    from av.stream import Discard

    for s in container.streams:
        if s.index != stream.index:
            s.discard = Discard.all


@dataclass(frozen=True)
class PacketRecord:
    """A demuxed packet detached from its container, so a clip can be muxed more than once."""

    data: bytes
    pts: int
    dts: int | None
    duration: int
    keyframe: bool


def mp4_tag(codec: str, source_tag: str | None) -> str | None:
    """The sample entry tag of a clip: the source's when MP4 defines it for the codec, else the default."""
    tag = (source_tag or "").strip("\0 ")
    if tag in _KEEP_TAGS.get(codec, ()):
        return tag
    return _DEFAULT_TAGS.get(codec)


HEADER_SCAN = 1 << 16  # bytes of a keyframe searched: parameter sets precede its slices
_START_CODE = re.compile(b"\x00\x00\x01")
_SEQUENCE_NALS = {"h264": (lambda b: b & 0x1F, {7}), "hevc": (lambda b: (b >> 1) & 0x3F, {32, 33})}  # SPS (+ VPS)


def in_band_headers(codec: str, extradata: bytes | None) -> bool:
    """Whether a stream's keyframes carry their sequence headers as ``sequence_header`` reads them:
    MPEG-2, and H.264/HEVC in Annex-B (MPEG-TS); not when the extradata is an avcC/hvcC record (MP4,
    Matroska: length-prefixed packets, whose length bytes can pass for a start code)."""
    head = (extradata or b"")[:3]  # (as FFmpeg tells them apart: an hvcC record may start 0x00 too)
    annex_b = not head or (len(head) == 3 and head[0] == 0 and head[1] == 0 and head[2] <= 1)
    return codec == "mpeg2video" or (codec in _SEQUENCE_NALS and annex_b)


def sequence_header(data: bytes, codec: str) -> bytes | None:
    """The sequence-level parameter sets a keyframe packet carries in-band (H.264 SPS, HEVC VPS/SPS in
    Annex-B, as MPEG-TS holds them; an MPEG-2 sequence header), where the picture size is; None when it
    carries none. Compared from clip to clip, a change says the stream's resolution may have changed (a
    capture card whose input switched) without decoding a frame. Only for streams ``in_band_headers``."""
    if codec == "mpeg2video":
        at = data.find(b"\x00\x00\x01\xb3")
        return None if at < 0 else data[at + 4 : at + 8]
    kind = _SEQUENCE_NALS.get(codec)
    if kind is None or not (data.startswith(b"\x00\x00\x01") or data.startswith(b"\x00\x00\x00\x01")):
        return None
    nal_type, wanted = kind
    units = [u.rstrip(b"\x00") for u in _START_CODE.split(data[:HEADER_SCAN])[1:]]
    found = b"".join(u for u in units if u and nal_type(u[0]) in wanted)
    return found or None


def monotonic_dts(packets: list[PacketRecord]) -> list[int]:
    """Decode timestamps for packets in decode order: the container's when they are usable, else rebuilt.

    Usable: present, strictly increasing, never after pts. Rebuilt: dts[i] = sorted_pts[i - delay] with
    ``delay`` the smallest reorder depth that keeps every dts <= pts (the rule FFmpeg's muxers check);
    the first ``delay`` packets step back from the first pts by the smallest frame interval.
    """
    dts = [p.dts for p in packets if p.dts is not None]
    if (
        len(dts) == len(packets)
        and all(a < b for a, b in zip(dts, dts[1:]))
        and all(d <= p.pts for d, p in zip(dts, packets))
    ):
        return dts
    pts = [p.pts for p in packets]
    order = sorted(pts)
    rank = {v: i for i, v in enumerate(order)}
    delay = max(0, max(i - rank[v] for i, v in enumerate(pts)))
    step = max(1, min((b - a for a, b in zip(order, order[1:])), default=1))
    return [order[i - delay] if i >= delay else order[0] - (delay - i) * step for i in range(len(pts))]


class Mp4Writer:
    """One clip being written: add streams, write packets, ``close()`` returns the file's bytes."""

    def __init__(self):
        import av

        self._buf = io.BytesIO()
        self._out = av.open(self._buf, "w", format="mp4", options=dict(MUX_OPTIONS))
        self._closed = False

    def copy_stream(self, template, tag: str | None = None):
        """An output stream carrying ``template``'s packets as they are."""
        stream = self._out.add_stream_from_template(template, opaque=True)
        codec = template.codec_context.codec.canonical_name
        stream.codec_tag = tag if tag and codec in _SET_TAGS else "\0\0\0\0"
        return stream

    def add_stream(self, codec: str, **kwargs):
        """An output stream fed by an encoder (transcoded video, re-encoded audio)."""
        return self._out.add_stream(codec, **kwargs)

    def write(self, stream, packets: list[PacketRecord], dts: list[int], time_base: Fraction, shift: int) -> None:
        """Mux ``packets`` (decode order; ``dts`` from ``monotonic_dts``) into ``stream``, timestamps moved
        back by ``shift`` ticks."""
        import av

        for rec, d in zip(packets, dts, strict=True):
            pkt = av.Packet(rec.data)
            pkt.pts, pkt.dts = rec.pts - shift, d - shift
            pkt.duration, pkt.time_base, pkt.is_keyframe = rec.duration, time_base, rec.keyframe
            pkt.stream = stream
            self._out.mux(pkt)

    def start(self) -> None:
        """Write the header now: fails here when MP4 cannot hold a stream's codec."""
        self._out.start_encoding()

    def mux(self, packet) -> None:
        self._out.mux(packet)

    def close(self) -> bytes:
        if not self._closed:
            self._closed = True
            self._out.close()
        return self._buf.getvalue()

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._out.close()
            except Exception:
                pass


def check_mp4_video(template, codec: str, container: str, tag: str | None) -> None:
    """Raise FormatError when MP4 cannot hold this video stream without re-encoding (ProRes, VP8, ...)."""
    import av

    w = Mp4Writer()
    try:
        w.copy_stream(template, tag)
        w.start()
    except (av.error.FFmpegError, ValueError) as e:
        raise FormatError(
            f"video codec {codec} (from {container}) cannot be stored in MP4 without re-encoding "
            f"({why(e)}); convert with a transcode spec such as 'h264' to keep it"
        ) from None
    finally:
        w.abort()


def why(e: BaseException) -> str:
    """The first line of an FFmpeg/OS error, bounded: for one-line reasons."""
    msg = getattr(e, "strerror", None) or str(e)
    return msg.strip().splitlines()[0][:200] if msg and msg.strip() else type(e).__name__

"""Content measurements and their per-sample judgements (level full): pure functions over one sample.

Decoding is the cost, so each clip is decoded exactly once, strictly (a concealed bitstream error is a
decode failure): every frame is decoded (that is what proves it decodes and gives the frame count), but
only a strided subset of about ``SAMPLED_FRAMES`` frames is converted, to 64 px wide gray, for the black /
frozen statistics and the perceptual hash. ``analyse_video`` measures; ``video_problems`` compares the
measurement with what the sample itself says (its metadata, and its timestamps the way convert computes
rates and spans: ``formats.probe.frame_rate``) under the spec's tolerances.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import loads_bounded
from dsbuild.formats.audio import SYNC_SLACK
from dsbuild.formats.probe import SWSCALE_THREADS, frame_rate
from dsbuild.formats.sample import GAP_SECONDS, SampleMeta, decompress_events

SAMPLED_FRAMES = 16  # frames converted per clip: enough for a motion statistic, cheap next to decoding
GRAY_WIDTH = 64  # px; motion and darkness survive this downscale, and swscale at this size is ~free
HASH_FRAMES = 4  # frames in the perceptual hash (4 x 64-bit dHash = 256 bits)
TIME_EPS = 1e-6  # seconds; window edges are compared with float tolerance


def span(frame_t: np.ndarray) -> float | None:
    """Time covered by frames at ``frame_t``: frames / frame_rate (each frame lasts one mean interval)."""
    rate = frame_rate(frame_t)
    return len(frame_t) / rate if rate else None


def median(x: np.ndarray):
    """``np.median`` of a 1-D vector without NaN, in the same arithmetic: np.median (like np.unique)
    imports numpy.ma, 12 ms in every validate worker."""
    s = np.sort(x)
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def dhash(gray: np.ndarray) -> int:
    """64-bit difference hash of a gray image: 9x8 block means, one bit per horizontal neighbour pair."""
    h, w = gray.shape
    rows = np.linspace(0, h, 9).astype(int)[:-1]
    cols = np.linspace(0, w, 10).astype(int)[:-1]
    small = np.add.reduceat(np.add.reduceat(gray.astype(np.float64), rows, axis=0), cols, axis=1)
    bits = (small[:, 1:] > small[:, :-1]).reshape(-1)
    return int(np.packbits(bits).view(">u8")[0])


def analyse_video(data: bytes, frames_hint: int) -> dict:
    """Decode one clip (``formats.probe``): frame count, sizes, frame rate and span from timestamps, audio
    placement, darkness, motion, hash.

    Never raises for bad data; ``error`` says why decoding stopped (None when every frame decoded).
    ``audio`` is False without an audio track, else where its packets lie (seconds from the first frame).
    """
    from av.video.reformatter import VideoReformatter

    from dsbuild.formats.probe import probe_clip

    stride = max(1, int(frames_hint) // SAMPLED_FRAMES)
    grays: list[np.ndarray] = []
    size: list[int] = []
    gray = VideoReformatter()  # one per clip: its scaler context is built once, not per frame (3x cheaper)

    def sample(i: int, frame) -> None:
        if i % stride or frame.width <= 0 or frame.height <= 0:
            return
        if not size:
            gw = min(GRAY_WIDTH, frame.width)
            size[:] = [gw, max(8, round(gw * frame.height / frame.width))]
        grays.append(
            gray.reformat(frame, width=size[0], height=size[1], format="gray", threads=SWSCALE_THREADS).to_ndarray()
        )

    p = probe_clip(data, sample)
    readable = p.codec is not None
    out: dict[str, Any] = {  # a ClipMeasure's JSON
        "decoded": p.frames,
        "error": p.error,
        "sizes": list(p.sizes),
        "fps": frame_rate(p.frame_t),
        "span": span(p.frame_t) if len(p.frame_t) >= 2 else None,
        "audio": (p.audio.to_json() if p.audio else False) if readable else None,
        "luma_max": None,
        "motion": None,
        "phash": None,
    }
    if grays:
        g = np.stack(grays).astype(np.float32)
        out["luma_max"] = float(g.mean(axis=(1, 2)).max())
        if len(g) >= 2:
            # Largest change anywhere between consecutive sampled frames (median over pairs): a game with a
            # still background and one small moving sprite moves; a stuck capture does not.
            out["motion"] = float(median(np.abs(np.diff(g, axis=0)).max(axis=(1, 2))))
        picks = sorted(set(np.linspace(0, len(g) - 1, HASH_FRAMES).round().astype(int).tolist()))
        if len(picks) == HASH_FRAMES:
            out["phash"] = [dhash(g[i]) for i in picks]
    return out


def video_problems(v: dict, expect: dict, spec, audio_expected: bool) -> list[tuple[str, str]]:
    """Measurements of one clip against the sample and the spec's tolerances.

    ``expect["fps"]`` and ``expect["duration"]`` come from the sample's timestamps (``frame_rate`` and
    ``span``, as convert computes them), so variable-rate clips and clips whose undecodable leading frames
    convert dropped (and counted) compare like for like. ``expect["audio"]`` is the metadata's audio
    placement (start from the first frame, duration), when the clip carries audio.
    """
    out = []
    if v["error"]:
        out.append(("decode", v["error"]))
    frames = expect["frames"]
    if v["decoded"] != frames:
        out.append(("frame_count", f"{v['decoded']} frames decode, metadata says {frames}"))
    fps = expect["fps"]
    if fps and v["fps"] is not None and abs(v["fps"] - fps) > spec["fps_tolerance"] * fps:
        out.append(("fps", f"decoded {v['fps']:.3f} fps, the sample's timestamps give {fps:.3f}"))
    want = (expect["width"], expect["height"])
    if v["sizes"] and [tuple(s) for s in v["sizes"]] != [want]:
        got = ", ".join(f"{w}x{h}" for w, h in v["sizes"])
        out.append(("resolution", f"decoded {got}, metadata says {want[0]}x{want[1]}"))
    if fps and v["span"] is not None and expect["duration"] is not None:
        tol = spec["duration_tolerance_frames"] / fps
        if abs(v["span"] - expect["duration"]) > tol:
            out.append(
                ("duration", f"decoded span {v['span']:.3f} s, the sample's frames span {expect['duration']:.3f} s")
            )
    window = expect.get("window_end")
    if window is not None and expect["duration"] is not None and window - expect["duration"] > GAP_SECONDS:
        # a window stretched over a gap in the recording (convert ends it at its last frame since
        # 2026-12-01): the events in it are held against frames that do not exist
        out.append(
            (
                "duration",
                f"the clip's window runs {window - expect['duration']:.3f} s past its last "
                "frame (a gap in the recording inside the window)",
            )
        )
    if v["luma_max"] is not None and v["luma_max"] < spec["black_luma"]:
        out.append(("black_clips", f"brightest sampled frame has mean gray {v['luma_max']:.1f}"))
    if v["motion"] is not None and v["motion"] < spec["frozen_motion"]:
        out.append(("frozen_clips", f"largest gray change between sampled frames {v['motion']:.3f}"))
    if v["audio"] is not None and bool(v["audio"]) != audio_expected:
        out.append(
            (
                "audio",
                "clip has an audio stream the metadata does not announce"
                if v["audio"]
                else "metadata announces audio, the clip has none",
            )
        )
    elif v["audio"] and audio_expected:
        out += [("audio", p) for p in _audio_problems(v["audio"], expect)]
    return out


def _audio_problems(a: dict, expect: dict) -> list[str]:
    """The clip's audio starts with its first video frame and ends with its window (where the next clip
    starts: with variable frame rate the last frame may end earlier), and lies where the metadata says,
    within one audio frame (convert cuts copied audio at packet boundaries)."""
    if a["error"]:
        return [a["error"]]
    if a["start"] is None:
        return ["audio track has no packets"]
    tol = a["frame_seconds"] + SYNC_SLACK
    out = []
    meta = expect.get("audio")
    if meta is not None and abs(a["start"] - meta["start"]) > tol:
        out.append(f"audio starts {a['start']:+.4f} s from the first frame, metadata says {meta['start']:+.4f} s")
    if meta is not None and abs((a["end"] - a["start"]) - meta["duration"]) > tol:
        out.append(f"audio lasts {a['end'] - a['start']:.4f} s, metadata says {meta['duration']:.4f} s")
    end = expect.get("window_end")
    if abs(a["start"]) > tol or (end is not None and abs(a["end"] - end) > tol):
        out.append(
            f"audio [{a['start']:+.4f}, {a['end']:.4f}] s is out of sync with the clip "
            f"[0, {end or 0:.4f}] s by more than one audio frame ({tol:.4f} s)"
        )
    return out


def action_problems(meta: SampleMeta, actions: np.ndarray) -> list[str]:
    want = (meta.clip.frames, len(meta.controls))
    if actions.dtype != np.float32 or actions.shape != want:
        return [f"{actions.dtype} {list(actions.shape)}, expected float32 {list(want)}"]
    if not np.isfinite(actions).all():
        return [f"{int((~np.isfinite(actions)).sum())} non-finite values"]
    held = actions[:, [c not in (meta.continuous or {}) for c in meta.controls]]  # continuous ones: any float32
    if held.size and (held.min() < -1 or held.max() > 1):
        return [f"values span [{held.min():g}, {held.max():g}], outside [-1, 1]"]
    return []


def telemetry_problems(meta: SampleMeta, telemetry: np.ndarray) -> list[str]:
    want = (meta.clip.frames, len(meta.telemetry_channels))
    if telemetry.dtype != np.float32 or telemetry.shape != want:
        return [f"{telemetry.dtype} {list(telemetry.shape)}, expected float32 {list(want)}"]
    if not np.isfinite(telemetry).all():
        return [f"{int((~np.isfinite(telemetry)).sum())} non-finite values"]
    return []


def timestamp_problems(meta: SampleMeta, ts: np.ndarray) -> list[str]:
    frames, t0, t1 = meta.clip.frames, meta.clip.t_start, meta.clip.t_end
    if ts.dtype != np.float64 or ts.shape != (frames,):
        return [f"{ts.dtype} {list(ts.shape)}, expected float64 [{frames}]"]
    if not np.isfinite(ts).all():
        return ["non-finite timestamps"]
    if len(ts) > 1 and not (np.diff(ts) > 0).all():
        i = int(np.argmin(np.diff(ts) > 0))
        return [f"not strictly increasing at frame {i + 1} ({ts[i]:.6f} -> {ts[i + 1]:.6f})"]
    if len(ts) and (ts[0] < t0 - TIME_EPS or ts[-1] >= t1 + TIME_EPS):
        return [f"[{ts[0]:.6f}, {ts[-1]:.6f}] outside the window [{t0:.6f}, {t1:.6f})"]
    if abs(meta.clip.duration - (t1 - t0)) > TIME_EPS:
        return [f"metadata duration {meta.clip.duration:.6f} s, its window [{t0:.6f}, {t1:.6f}) spans {t1 - t0:.6f} s"]
    return []


MAX_EVENT_LINES = 1 << 22  # raw action events of one clip: 4M (a 10-kHz device over 7 minutes)
_LINE = re.compile(rb"[^\n]+")


def events_problems(meta: SampleMeta, blob: bytes) -> list[str]:
    """Raw action events: bounded zstd JSONL (``formats.sample.MAX_EVENTS_BYTES``, the loader's bound),
    each inside the window, a known control, a value in [-1, 1] (any for a continuous control), in time order;
    as many as the metadata says."""
    try:
        data = decompress_events(blob)
    except FormatError as e:
        return [str(e)]
    t0, t1 = meta.clip.t_start, meta.clip.t_end
    controls, continuous = set(meta.controls), meta.continuous or {}
    bad, first, last_t, n = 0, None, -math.inf, 0
    for n, match in enumerate(_LINE.finditer(data), 1):  # one line at a time (250 MiB of "{}" lines: 5.8 GB)
        if n > MAX_EVENT_LINES:
            return [f"events hold more than {MAX_EVENT_LINES} lines (over the limit)"]
        line = match.group()
        why = None
        try:
            ev = loads_bounded(line, max_bytes=1 << 16, what=f"event {n}")
        except FormatError as err:
            why, ev = str(err), None
        if why is None and not (
            isinstance(ev, dict)
            and isinstance(ev.get("t"), (int, float))
            and isinstance(ev.get("value"), (int, float))
            and isinstance(ev.get("control"), str)
        ):
            why = f"event {n} is not {{t, control, value}}"
        elif why is None and not (t0 - TIME_EPS <= ev["t"] < t1 + TIME_EPS):
            why = f"event {n} at t={ev['t']} is outside the window [{t0}, {t1})"
        elif why is None and ev["control"] not in controls:
            why = f"event {n} names unknown control {ev['control'][:80]!r}"
        elif why is None and ev["control"] not in continuous and not -1 <= ev["value"] <= 1:
            why = f"event {n} value {ev['value']} is outside [-1, 1]"
        elif why is None and ev["t"] < last_t:
            why = f"event {n} is out of time order"
        if why is None:
            last_t = ev["t"]
        else:
            bad += 1
            first = first or why
    out = []
    if bad and first is not None:  # (the first bad event set it)
        out.append(first + (f" (and {bad - 1} more)" if bad > 1 else ""))
    if n != meta.action_events:
        out.append(f"{n} events, metadata says {meta.action_events}")
    return out


def text_problems(meta: SampleMeta) -> list[tuple[str, str]]:
    """Text events lie inside the clip window. ``speaker`` is optional (system lines, narration); types and
    UTF-8 are already proven by ``SampleMeta`` when the metadata is read."""
    t0, t1 = meta.clip.t_start, meta.clip.t_end
    for n, e in enumerate(meta.text, 1):
        if not (t0 - TIME_EPS <= e.t < t1 + TIME_EPS):
            return [("text", f"text event {n} at t={e.t!r} is outside the window [{t0}, {t1})")]
    return []

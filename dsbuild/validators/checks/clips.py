"""Content checks (level full): every clip decoded once, every array and event read; and clip_memory,
which needs only the index (every level).

Each check's ``sample`` function runs in the worker that holds the sample; the clip is decoded on the
first check that asks (``SampleView.findings``). The measurements behind black, frozen, fps and duration
are also plotted against their thresholds in the reports.
"""

from __future__ import annotations

from dsbuild.validators.base import Check, Judge, Threshold
from dsbuild.validators.checks.content import (
    action_problems,
    events_problems,
    telemetry_problems,
    text_problems,
    timestamp_problems,
)
from dsbuild.validators.checks.structural import ZERO
from dsbuild.validators.facts import VersionFacts
from dsbuild.validators.model import CheckResult, Distribution, per_sample
from dsbuild.validators.view import SampleView, video_finding

GRAY = (0, 255)  # the gray levels black_luma and frozen_motion are measured in (8-bit luma)


def _distribution(label: str, values: list[float], key: str, limit: float, bad: str, unit: str = "") -> Distribution:
    return per_sample(label, values, unit, threshold=float(limit), threshold_key=key, bad=bad)


def _fps(j: Judge, d: VersionFacts) -> CheckResult:
    errors = [abs(m.fps / m.fps_expected - 1) for _, m in d.clips() if m.fps and m.fps_expected]
    return j.count(
        d.offenders("fps"),
        distribution=_distribution(
            "relative frame-rate error per clip (decoded vs the sample's timestamps)",
            errors,
            "fps_tolerance",
            j["fps_tolerance"],
            "above",
        ),
    )


def _duration(j: Judge, d: VersionFacts) -> CheckResult:
    errors = [
        abs(m.span - m.span_expected) / m.frame_seconds
        for _, m in d.clips()
        if m.span is not None and m.span_expected is not None and m.frame_seconds
    ]
    return j.count(
        d.offenders("duration"),
        distribution=_distribution(
            "|decoded span - the sample's frames' span| per clip, in frames",
            errors,
            "duration_tolerance_frames",
            j["duration_tolerance_frames"],
            "above",
            "frames",
        ),
    )


def _clip_memory(j: Judge, d: VersionFacts) -> CheckResult:
    """Clips whose frames, decoded at native size, take more than the loader's frames-batch bound (one
    clip in a batch of one: the least a loader without a crop, stride or resize allocates), worst first.
    A long single-GOP clip (one keyframe: convert keeps it whole) is the usual one."""
    from dsbuild.loader.decode import default_max_batch_bytes

    key = "max_clip_frames_bytes"
    limit = j[key] or default_max_batch_bytes()
    said = key if j[key] else "the loader's default max_batch_bytes: half the memory this process may use"
    need = sorted(((r.frames or 0) * r.height * r.width * 3, r.key, r) for r in d.rows)
    over = [(n, r) for n, _, r in reversed(need) if n > limit]
    offenders = [
        (
            r.key,
            f"needs {n:,} bytes decoded at native size ({r.frames} frames of {r.height}x{r.width}x3), over "
            f"{limit:,} ({said}); load it with max_frames= or clip_frames= (a crop), frame_stride= or "
            f"resize=(height, width), or record with a keyframe every few seconds (convert cuts clips there)",
        )
        for n, r in over
    ]
    most = need[-1][0] if need else 0
    return j.result(
        measured=most,
        breaches=[f"{len(over)} clip(s) over {limit:,} bytes"] if over else [],
        message=f"largest clip {most:,} bytes decoded at native size",
        offenders=offenders,
    )


def _decode_sample(v: SampleView) -> list[str]:
    """A clip that cannot even be read out of its sample was not decoded: a failure, with the reason."""
    if v.sample is None:
        return [f"not decoded: the sample cannot be read ({v.error})"]
    return v.findings().get("decode", [])


def _decode(j: Judge, d: VersionFacts) -> CheckResult:
    """Every clip of the index that did not decode fails: those that failed in the per-sample pass, and
    those it never reached (their shard is missing or unreadable, or not in the manifest)."""
    found = dict(d.offenders("decode"))
    reached = {s.key for s in d.samples}
    lost = dict(d.lost)
    for r in d.rows:
        if r.key not in reached:
            found.setdefault(r.key, f"not decoded: {lost.get(r.key, f'never read from its shard {r.shard}')}")
    return j.count(sorted(found.items()))


def _fraction(name: str, key: str, limit: str, field: str, what: str, label: str):
    """A fraction check over the decoded clips, plotting each clip's ``field`` against ``limit``."""

    def run(j: Judge, d: VersionFacts) -> CheckResult:
        clips = d.clips()
        values = [getattr(m, field) for _, m in clips]
        return j.fraction(
            key,
            d.offenders(name),
            len(clips),
            what,
            _distribution(label, [x for x in values if x is not None], limit, j[limit], "below"),
        )

    run.__name__ = f"run_{name}"
    return run


def _arrays(field: str, problems):
    def sample(v: SampleView) -> list[str]:
        return problems(v.typed().meta, getattr(v.typed(), field)) if v.content else []

    sample.__name__ = f"sample_{field}"
    return sample


def _events(v: SampleView) -> list[str]:
    return events_problems(v.typed().meta, v.typed().events) if v.content else []


def _text(v: SampleView) -> list[str]:
    return [d for _, d in text_problems(v.typed().meta)] if v.content else []


def _c(name: str, doc: str, key: str, counts: str, **kw) -> Check:
    return Check(
        name,
        "content",
        doc,
        (Threshold(key, 0, "count", ZERO), *kw.pop("extra", ())),
        level="full",
        counts=counts,
        **kw,
    )


CHECKS = (
    Check(
        "clip_memory",
        "content",
        "Clips whose frames decoded at native size (frames x height x width x 3, from the index) exceed "
        "the loader's frames-batch bound, which refuses them: a long single-GOP clip needs a crop, a "
        "stride or a resize to load.",
        (
            Threshold(
                "max_clip_frames_bytes",
                0,
                "count",
                "bytes; 0: the loader's default max_batch_bytes (half the memory this process may use); "
                "set the training machine's bound when validating elsewhere",
            ),
        ),
        severity="warn",
        run=_clip_memory,
    ),
    _c(
        "decode",
        "Every clip of the index opens and decodes with PyAV to its last frame, strictly (a concealed "
        "bitstream error is a failure); a clip that cannot be read (its sample or shard is unreadable) fails too.",
        "max_decode_failures",
        "clip(s) fail to decode",
        sample=_decode_sample,
        run=_decode,
    ),
    _c(
        "frame_count",
        "Decoded frames = metadata frames = timestamps length.",
        "max_frame_count_mismatches",
        "clip(s) with a wrong frame count",
        sample=video_finding("frame_count"),
    ),
    _c(
        "fps",
        "The decoded clip's frame rate (formats.probe.frame_rate of its frame times) matches the rate of "
        "the sample's timestamps, computed the same way: variable-rate clips compare like for like.",
        "max_fps_mismatches",
        "clip(s) with a wrong frame rate",
        sample=video_finding("fps"),
        run=_fps,
        extra=(
            Threshold(
                "fps_tolerance",
                0.02,
                "fraction",
                "relative; both rates come from the same frame times, so only a broken clock differs",
            ),
        ),
    ),
    _c(
        "resolution",
        "Decoded frames have the metadata's width and height.",
        "max_resolution_mismatches",
        "clip(s) with a wrong resolution",
        sample=video_finding("resolution"),
    ),
    _c(
        "duration",
        "The decoded span (frames / frame rate) matches the span of the sample's timestamps, the "
        "frames convert carried after dropping (and counting) undecodable ones; timestamps must lie in the "
        "window (timestamps), and the window may not run more than 1 s past its last frame (a gap in the "
        "recording).",
        "max_duration_mismatches",
        "clip(s) with a wrong duration",
        sample=video_finding("duration"),
        run=_duration,
        extra=(
            Threshold(
                "duration_tolerance_frames",
                1.5,
                "number",
                "frames; the last frame's length is an estimate, plus jitter",
            ),
        ),
    ),
    Check(
        "black_clips",
        "content",
        "Clips whose every sampled frame is darker than black_luma (0-255 gray, sampled frames at 64 px wide).",
        (
            Threshold(
                "max_black_fraction", 0.01, "fraction", "a few loading screens are normal; more is a broken capture"
            ),
            Threshold("black_luma", 16.0, "number", "mean gray level of a black frame", GRAY),
        ),
        level="full",
        sample=video_finding("black_clips"),
        run=_fraction(
            "black_clips",
            "max_black_fraction",
            "black_luma",
            "luma_max",
            "decoded clips are black",
            "mean gray of the brightest sampled frame per clip",
        ),
    ),
    Check(
        "frozen_clips",
        "content",
        "Clips whose largest gray difference anywhere between consecutive sampled "
        "frames (a strided subset at 64 px wide; median over pairs) stays below frozen_motion: a stuck "
        "capture. A black clip is also frozen.",
        (
            Threshold("max_frozen_fraction", 0.01, "fraction", "pauses happen; a stuck encoder is rare"),
            Threshold(
                "frozen_motion",
                8.0,
                "number",
                "gray levels; a still image re-encoded changes by a few levels, one small moving sprite by tens",
                GRAY,
            ),
        ),
        level="full",
        sample=video_finding("frozen_clips"),
        run=_fraction(
            "frozen_clips",
            "max_frozen_fraction",
            "frozen_motion",
            "motion",
            "decoded clips are frozen",
            "largest gray change between sampled frames per clip",
        ),
    ),
    _c(
        "audio",
        "A clip carries an audio track exactly when its metadata says so; the track starts and ends "
        "with the video and where the metadata places it, within one audio frame.",
        "max_audio_mismatches",
        "clip(s) with wrong audio",
        sample=video_finding("audio"),
    ),
    _c(
        "actions",
        "The action array is float32 [frames, controls], finite, in [-1, 1] (a continuous control: any float32).",
        "max_action_errors",
        "bad action array(s)",
        sample=_arrays("actions", action_problems),
    ),
    _c(
        "telemetry",
        "The telemetry array is float32 [frames, channels] and finite.",
        "max_telemetry_errors",
        "bad telemetry array(s)",
        sample=_arrays("telemetry", telemetry_problems),
    ),
    _c(
        "timestamps",
        "Timestamps are float64, one per frame, strictly increasing, inside the clip window, which "
        "the metadata's duration spans.",
        "max_timestamp_errors",
        "bad timestamp array(s)",
        sample=_arrays("timestamps", timestamp_problems),
    ),
    _c(
        "action_events",
        "Raw action events decompress (bounded like the loader), parse, lie inside the clip "
        "window, name known controls, stay in [-1, 1] and match the metadata's count.",
        "max_action_event_errors",
        "sample(s) with bad action events",
        sample=_events,
    ),
    _c(
        "text",
        "Text events lie inside the clip window; speaker is optional (system lines, narration).",
        "max_text_errors",
        "sample(s) with bad text events",
        sample=_text,
    ),
)

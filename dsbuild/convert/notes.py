"""What a convert warns about, from the session records of the version it built (docs/capture-format.md):
streams that lost more than ``MAX_DROPPED_FRACTION`` of their lines, and clips far longer than asked for
because the video's keyframes are sparse. Pure functions of the records: a rerun that finds the version
already built warns the same way."""

from __future__ import annotations

from dataclasses import dataclass

from dsbuild.core.records import Record
from dsbuild.formats.streams import StreamReport
from dsbuild.lineage.manifest import SessionRecord

# A stream that loses more than 1 line in 100 is damaged, not noisy: a crash cuts one line at the end of a
# stream, and a logger with a wrong field name or scale loses all of them. `validate`'s default
# (max_dropped_fraction) is the same, so what convert warned about is what the CI gate rejects.
MAX_DROPPED_FRACTION = 0.01
LONG_CLIP_FACTOR = 1.5  # a clip over 1.5x --clip-seconds is "long" (formats.video counts them so)


@dataclass(frozen=True, slots=True)
class LossyStream(Record):
    """A stream of one session that lost more than ``MAX_DROPPED_FRACTION`` of its lines."""

    session: str
    stream: str
    lines: int
    dropped: int
    examples: tuple[str, ...]  # the first reasons, with their line numbers

    def message(self) -> str:
        first = f"; first: {self.examples[0]}" if self.examples else ""
        return (
            f"{self.session}: {self.stream} lost {self.dropped} of {self.lines} lines "
            f"({self.dropped / self.lines:.1%}, over {MAX_DROPPED_FRACTION:.0%}){first} (see docs/capture-format.md)"
        )


def lossy_streams(sessions: list[SessionRecord], limit: float = MAX_DROPPED_FRACTION) -> tuple[LossyStream, ...]:
    """Every (session, stream) whose dropped lines are more than ``limit`` of its lines, in session order."""
    out = []
    for rec in sessions:
        for kind, (lines, dropped, examples) in StreamReport.recorded_drops(rec.repairs).items():
            if lines and dropped / lines > limit:
                out.append(LossyStream(rec.session_id, kind, lines, dropped, examples))
    return tuple(out)


def keyframe_hint(sessions: list[SessionRecord], clip_seconds: float) -> str | None:
    """One line when clips came out longer than ``LONG_CLIP_FACTOR`` x ``clip_seconds`` because keyframes
    are further apart: how many, the widest keyframe interval found, and what gives clips of the length
    asked for. Clips are cut at the source's keyframes (``formats.video``), also with ``--transcode``,
    whose ``gop<N>`` spaces the keyframes inside each clip only: the recordings need a keyframe every
    ``clip_seconds``."""
    long_clips, widest = 0, None
    for rec in sessions:
        video = rec.repairs.get("video") if isinstance(rec.repairs, dict) else None
        if not isinstance(video, dict) or not video.get("long_clips"):
            continue
        long_clips += video["long_clips"]
        seconds, frames = video.get("keyframe_gap_seconds"), video.get("keyframe_gap_frames")
        if seconds and frames and (widest is None or seconds > widest[0]):
            widest = (seconds, frames, rec.session_id)
    if not long_clips:
        return None
    text = f"{long_clips} clip(s) came out over {LONG_CLIP_FACTOR:g}x --clip-seconds {clip_seconds:g}"
    fix = "--transcode ...:gop<N> only spaces the keyframes inside each clip (see docs/capture-format.md)"
    if widest is None:  # (sessions reused from a version built before the interval was recorded)
        return (
            f"{text}: clips are cut at the videos' keyframes, which are further apart; record or re-encode "
            f"with a keyframe every {clip_seconds:g} s; {fix}"
        )
    seconds, frames, session = widest
    gop = max(1, int(frames * clip_seconds / seconds))  # frames in clip_seconds at the video's rate
    return (
        f"{text}: clips are cut at the video's keyframes, up to {seconds:g} s ({frames} frames) apart in "
        f"session {session}; record or re-encode with a keyframe every {gop} frames (ffmpeg -g {gop}); {fix}"
    )

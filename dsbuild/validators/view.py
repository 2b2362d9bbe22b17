"""One sample as the per-sample checks see it, in the worker that reads it.

The sample is read once through its shard format's reader (``members`` proves the framing and the
canonical member names; ``sample_from_members`` gives the typed ``Sample``, validating ``SampleMeta``).
At level full its clip is decoded once, lazily, the first time a check asks for the video findings; the
expectations it is compared with come from the sample itself (its timestamps, as convert recorded them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.formats.base import Members, ShardReader
from dsbuild.formats.probe import frame_rate
from dsbuild.formats.sample import Sample, sample_from_members
from dsbuild.lineage.index import IndexRow
from dsbuild.validators.checks.content import analyse_video, span, video_problems
from dsbuild.validators.facts import ClipMeasure


class SampleView:
    def __init__(
        self,
        row: IndexRow,
        spec,
        level: str,
        shard_damaged: bool,
        members: Members | None,
        sample: Sample | None,
        error: str | None,
    ):
        self.row = row
        self.spec = spec
        self.level = level
        self.shard_damaged = shard_damaged  # lineage.verify found the shard's bytes changed
        self.members = members  # (ext, payload) as stored, or None when the sample could not be framed
        self.sample = sample  # typed, or None when a member or the metadata is malformed
        self.error = error  # why ``sample`` is None
        self._video: dict | None = None
        self._findings: dict[str, list[str]] | None = None

    @classmethod
    def read(cls, reader: ShardReader, row: IndexRow, spec, level: str, shard_damaged: bool = False) -> SampleView:
        try:
            members = reader.member_views(row.entry())
        except FormatError as e:
            return cls(row, spec, level, shard_damaged, None, None, str(e))
        except OSError as e:
            return cls(
                row,
                spec,
                level,
                shard_damaged,
                None,
                None,
                f"shard {Path(reader.path).name} unreadable ({e.strerror or e})",
            )
        try:
            sample = sample_from_members(row.key, dict(members))
        except FormatError as e:
            return cls(row, spec, level, shard_damaged, members, None, str(e))
        return cls(row, spec, level, shard_damaged, members, sample, None)

    @property
    def content(self) -> bool:
        """The sample's content is checked: level full and every member parsed."""
        return self.level == "full" and self.sample is not None

    def typed(self) -> Sample:
        """``sample``, for a check that runs only where it parsed (``content``, or ``sample`` checked)."""
        if self.sample is None:
            raise FormatError(f"sample {self.row.key}: read as typed, but it did not parse ({self.error})")
        return self.sample

    def stored(self) -> Members:
        """``members``, for a check that runs only where the sample could be framed."""
        if self.members is None:
            raise FormatError(f"sample {self.row.key}: read as framed, but it could not be ({self.error})")
        return self.members

    def expect(self) -> dict:
        """What the decoded clip must show, from the sample's own metadata and timestamps (no rate or span
        from timestamps that are not finite numbers in one row: the ``timestamps`` check names those)."""
        meta, ts = self.typed().meta, self.typed().timestamps
        usable = ts.ndim == 1 and ts.dtype.kind in "fiu" and bool(np.isfinite(ts).all())
        audio = meta.video.audio
        return {
            "frames": meta.clip.frames,
            "fps": frame_rate(ts) if usable else None,
            "width": meta.video.width,
            "height": meta.video.height,
            "duration": span(ts) if usable else None,
            "t_start": meta.clip.t_start,
            "window_end": float(meta.clip.t_end - ts[0]) if usable and len(ts) else None,
            "audio": None if audio is None else {"start": audio.start, "duration": audio.duration},
        }

    def findings(self) -> dict[str, list[str]]:
        """check name -> problems of the decoded clip (``video_problems``); decodes on the first call."""
        if self._findings is None:
            self._findings = {}
            if self.content:
                sample = self.typed()
                self._video = analyse_video(sample.video, sample.meta.clip.frames)
                for check, detail in video_problems(self._video, self.expect(), self.spec, sample.meta.video.has_audio):
                    self._findings.setdefault(check, []).append(detail)
        return self._findings

    def measure(self) -> ClipMeasure | None:
        """The decoded clip's measurements, when a check decoded it."""
        v = self._video
        if v is None:
            return None
        e = self.expect()
        return ClipMeasure(
            v["decoded"],
            v["luma_max"],
            v["motion"],
            tuple(v["phash"]) if v["phash"] else None,
            v["fps"],
            e["fps"],
            v["span"],
            e["duration"],
            1 / e["fps"] if e["fps"] else None,
        )


def video_finding(check: str):
    """The ``sample`` function of a check whose findings come from decoding the clip."""

    def sample(view: SampleView) -> list[str]:
        return view.findings().get(check, [])

    sample.__name__ = f"video_{check}"
    return sample

"""The sample type of a dsbuild Energon export: ``.nv-meta/dataset.yaml`` names it, and Energon's default
decoder fills it from the clip's members, so ``get_train_dataset(DEST, ...)`` yields it with no cooker.

    from dsbuild.export.energon_sample import ClipSample

Importing this module imports Energon (and torch); importing ``dsbuild`` or ``dsbuild.export`` does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from megatron.energon import Sample, edataclass
from megatron.energon.av import AVDecoder


@edataclass
class ClipSample(Sample):
    """One clip (field -> member, as dataset.yaml's ``field_map`` says)."""

    #: ``mp4``: the clip's video (and audio), decoded when asked (``video.get_clip(...)``, ``get_frames``)
    video: AVDecoder
    #: ``json``: the sample's metadata (session fields and conditions, clip window, video facts, sources)
    meta: dict[str, Any]
    #: ``actions.npy``: float32 [frames, controls], one column per name in ``controls``
    actions: np.ndarray
    #: ``telemetry.npy``: float32 [frames, channels], resampled per frame, columns as ``telemetry_channels``
    telemetry: np.ndarray
    #: ``timestamps.npy``: float64 [frames], seconds from the session's first frame
    timestamps: np.ndarray
    #: ``events.jsonl.zst``: the raw action events of the window (zstd-compressed JSON Lines)
    events: bytes
    #: ``json[controls]``: the action columns' names
    controls: list[str]
    #: ``json[telemetry_channels]``: the telemetry columns' names
    telemetry_channels: list[str]
    #: ``json[text]``: the text events in the window, each ``{"t", "text", "speaker"?}``
    text: list[dict[str, Any]]

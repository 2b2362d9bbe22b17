"""The clip's audio as float32 PCM at a fixed rate and channel count (deterministic: FFmpeg's decoder
and resampler with fixed settings). One small module on purpose: when the video layer ships its own
``decode_audio`` helper, this is the one place to swap.

Audio sample 0 is taken to align with the clip's first video frame (convert cuts audio to the clip's
window, within one audio frame); a crop of the frames cuts the audio to the same span of time.
"""

from __future__ import annotations

import numpy as np

from dsbuild.core.errors import FormatError
from dsbuild.formats.probe import open_clip

LAYOUTS = {1: "mono", 2: "stereo"}


def decode_audio(data, rate: int, channels: int | None) -> np.ndarray:
    """float32 [channels, samples] of the clip's first audio stream at ``rate`` Hz (``channels`` None:
    the stream's own count). A clip without audio gives [channels, 0]."""
    import av

    try:
        with open_clip(data) as container:
            if not container.streams.audio:
                return np.zeros((channels or 1, 0), np.float32)
            stream = container.streams.audio[0]
            n = channels or stream.codec_context.channels
            layout = LAYOUTS.get(n)
            if layout is None:
                raise FormatError(f"audio_channels={n}: only 1 (mono) or 2 (stereo) are supported")
            resampler = av.AudioResampler(format="flt", layout=layout, rate=rate)
            chunks = []
            for frame in container.decode(stream):
                chunks += [f.to_ndarray() for f in resampler.resample(frame)]
            chunks += [f.to_ndarray() for f in resampler.resample(None)]
    except (av.error.FFmpegError, ValueError) as e:
        raise FormatError(f"audio does not decode ({e})") from None
    if not chunks:
        return np.zeros((n, 0), np.float32)
    packed = np.concatenate([c.reshape(-1) for c in chunks])  # "flt" is interleaved
    return np.ascontiguousarray(packed.reshape(-1, n).T)


def cut(audio: np.ndarray, rate: int, start_s: float, end_s: float) -> np.ndarray:
    """The samples of ``audio`` (sample 0 = the clip's first frame) in [start_s, end_s) seconds."""
    a, b = max(0, round(start_s * rate)), max(0, round(end_s * rate))
    return audio[:, a:b]

"""Pure functions that put event streams on the video's frame clock.

Both use a zero-order hold (the last value at or before each frame time) because a frame must only see
what had happened when it was shown: interpolation would leak the future into the past.
"""

from __future__ import annotations

import numpy as np

from dsbuild.formats.streams import Actions, Telemetry


def hold(event_t: np.ndarray, event_v: np.ndarray, frame_t: np.ndarray, before: float) -> np.ndarray:
    """Value of a sorted event series at each frame time; ``before`` where no event has happened yet."""
    idx = np.searchsorted(event_t, frame_t, side="right") - 1
    out = np.full(len(frame_t), before, dtype=np.float32)
    seen = idx >= 0
    out[seen] = event_v[idx[seen]]
    return out


def dense_actions(actions: Actions, frame_t: np.ndarray) -> np.ndarray:
    """float32 [frames, controls]: each control's last value at or before the frame (0 = released)."""
    out = np.zeros((len(frame_t), len(actions.controls)), dtype=np.float32)
    for c in range(len(actions.controls)):
        mask = actions.control == c
        out[:, c] = hold(actions.t[mask], actions.value[mask], frame_t, 0.0)
    return out


def resample_telemetry(telemetry: Telemetry, frame_t: np.ndarray) -> np.ndarray:
    """float32 [frames, channels]: last reading at or before the frame; before the first reading, the first.

    Back-filling the first reading keeps arrays finite (no NaN for the model to trip on); it is the
    only place a value is used before its time, and only for frames before the channel's first sample.
    """
    out = np.zeros((len(frame_t), len(telemetry.channels)), dtype=np.float32)
    for c, (t, v) in enumerate(zip(telemetry.t, telemetry.v)):
        out[:, c] = hold(t, v, frame_t, float(v[0]) if len(v) else 0.0)
    return out


def window(event_t: np.ndarray, start: float, end: float) -> slice:
    """The slice of a sorted time array with start <= t < end."""
    lo = int(np.searchsorted(event_t, start, side="left"))
    hi = int(np.searchsorted(event_t, end, side="left"))
    return slice(lo, hi)

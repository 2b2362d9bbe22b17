"""Putting events on the frame clock: zero-order hold, property-tested, plus the clip cut rule."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from dsbuild.convert.resample import dense_actions, hold, resample_telemetry, window
from dsbuild.formats.streams import Actions, Telemetry
from dsbuild.formats.video import should_cut

times = st.lists(st.floats(0, 100, allow_nan=False), min_size=0, max_size=30).map(sorted)


@settings(max_examples=300, deadline=None)
@given(times, st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30))
def test_hold_is_the_last_value_at_or_before_each_frame(event_t, frame_t):
    event_t = np.array(event_t)
    values = np.arange(len(event_t), dtype=np.float32) + 1
    out = hold(event_t, values, np.array(frame_t), before=-1.0)
    for f, v in zip(frame_t, out):
        past = [values[i] for i, t in enumerate(event_t) if t <= f]
        assert v == (past[-1] if past else -1.0)


def test_dense_actions_press_release_and_axes():
    a = Actions(("btn", "x"), np.array([0.1, 0.2, 0.3]), np.array([0, 1, 0], np.int32),
                np.array([1.0, -0.5, 0.0], np.float32))
    out = dense_actions(a, np.array([0.0, 0.1, 0.25, 0.3]))
    assert out.tolist() == [[0, 0], [1, 0], [1, -0.5], [0, -0.5]]


def test_telemetry_holds_and_backfills_only_before_the_first_reading():
    tel = Telemetry(("speed",), (np.array([1.0, 2.0]),), (np.array([5.0, 7.0], np.float32),))
    assert resample_telemetry(tel, np.array([0.0, 1.0, 1.5, 2.0, 9.0]))[:, 0].tolist() == [5, 5, 5, 7, 7]


@given(times, st.floats(0, 100), st.floats(0, 100))
def test_window_selects_half_open_interval(event_t, a, b):
    lo, hi = min(a, b), max(a, b)
    sl = window(np.array(event_t), lo, hi)
    assert [t for t in event_t if lo <= t < hi] == event_t[sl]


@given(st.lists(st.floats(0.1, 5), min_size=1, max_size=50), st.floats(0.5, 10))
def test_cuts_never_make_a_clip_shorter_than_the_target_except_the_last(gaps, clip_seconds):
    keyframes = np.cumsum([0.0] + gaps)
    starts = [keyframes[0]]
    for k in keyframes[1:]:
        if should_cut(starts[-1], k, clip_seconds):
            starts.append(k)
    assert all(b - a >= clip_seconds - 1e-3 for a, b in zip(starts, starts[1:]))
    assert set(starts) <= set(keyframes)

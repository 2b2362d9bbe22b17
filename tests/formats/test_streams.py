"""Capture streams: validated events, counted repairs, and per-clip arrays from a bounded window.

The property tests compare the windowed, streaming tracks with a reference computed from the whole,
sorted stream at once: clip by clip they must agree exactly, whatever the order events arrive in.
"""

from __future__ import annotations

import json
import resource

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.formats.streams import (
    RUN_LINES,
    ActionTrack,
    EventStream,
    StreamReport,
    TelemetryTrack,
    TextTrack,
    _parse,
    _telemetry,
    events,
    hold,
    scan,
)
from dsbuild.formats.video import should_cut


def _write(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _hold_reference(evs, frame_t, before):
    """The last value at or before each frame over the whole sorted (stable) event list."""
    out = []
    for f in frame_t:
        past = [v for t, v in evs if t <= f]
        out.append(past[-1] if past else before)
    return out


actions_st = st.lists(
    st.tuples(st.integers(0, 400).map(lambda x: x / 40), st.sampled_from("abc"), st.sampled_from([0.0, 1.0, -0.5])),
    max_size=40,
)
cuts_st = st.lists(st.integers(1, 400).map(lambda x: x / 40), max_size=5).map(lambda c: sorted(set(c)))


@settings(max_examples=150, deadline=None)
@given(actions_st, cuts_st)
def test_action_track_clip_by_clip_equals_the_whole_stream_reference(tmp_path_factory, evs, cuts):
    p = tmp_path_factory.mktemp("a") / "actions.jsonl"
    _write(p, [{"t": t, "control": c, "value": v} for t, c, v in evs])
    s = scan(p, "actions")
    track = ActionTrack(s)
    ordered = sorted(enumerate(evs), key=lambda x: (x[1][0], x[0]))  # by time, ties in file order
    bounds = [0.0] + cuts + [11.0]
    for lo, hi in zip(bounds, bounds[1:]):
        frame_t = np.linspace(lo, hi, 5, endpoint=False)
        dense, raw = track.clip(frame_t, lo, hi)
        for j, control in enumerate(s.names):
            ref = _hold_reference([(t, v) for _, (t, c, v) in ordered if c == control], frame_t, 0.0)
            assert dense[:, j].tolist() == ref
        assert raw == [e for _, e in ordered if lo <= e[0] < hi]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 200).map(lambda x: x / 20), st.sampled_from(["speed", "rpm"]), st.integers(-5, 5)),
        min_size=1,
        max_size=30,
    ),
    cuts_st,
)
def test_telemetry_track_holds_and_backfills_only_before_the_first_reading(tmp_path_factory, evs, cuts):
    p = tmp_path_factory.mktemp("t") / "telemetry.jsonl"
    _write(p, [{"t": t, ch: v} for t, ch, v in evs])
    s = scan(p, "telemetry")
    track = TelemetryTrack(s)
    ordered = sorted(enumerate(evs), key=lambda x: (x[1][0], x[0]))
    bounds = [0.0] + [c for c in cuts if c < 10] + [11.0]
    for lo, hi in zip(bounds, bounds[1:]):
        frame_t = np.linspace(lo, hi, 4, endpoint=False)
        out = track.clip(frame_t, lo, hi)
        for j, ch in enumerate(s.names):
            series = [(t, v) for _, (t, c, v) in ordered if c == ch]
            ref = _hold_reference(series, frame_t, series[0][1])
            assert out[:, j].tolist() == ref


# Telemetry values that ``_telemetry`` keeps, changes or drops: the run conversion must tell them apart.
_value_st = st.one_of(
    st.integers(-3, 3),
    st.floats(-2.5, 2.5),
    st.sampled_from(
        [True, False, None, "7", 1e39, -1e39, 2**53 + 1, 2**63, 2**64 + 3, -(2**63) - 1, 10**400, [1, 2], {}]
    ),
)
_layout_st = st.lists(
    st.tuples(
        st.sampled_from(["ram", "pos", "pos.0", "pos.1", "lives", "a" * 129, "", "is_true"]),
        st.one_of(st.integers(0, 4), st.none()),
    ),
    min_size=0,
    max_size=4,
)


def _line_st(layout: list, dirty: bool):
    """The values of one line of ``layout``, in its order: anything ``_value_st`` holds when dirty, else
    plain numbers."""
    scalar = _value_st if dirty else st.integers(-3, 3)
    element = _value_st if dirty else st.floats(-9, 9)
    return st.tuples(*[scalar if n is None else st.lists(element, min_size=n, max_size=n) for _, n in layout])


# Runs of up to 12 lines: a run of two or more lines of one layout is what is converted at once (cutting
# at RUN_LINES is test_long_telemetry_runs_...); each run's lines are drawn in one draw, not a draw per
# value, which was most of this test's time.
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.booleans()), min_size=1, max_size=6),
    st.lists(_layout_st, min_size=1, max_size=4),
    st.data(),
)
def test_telemetry_converted_a_run_at_a_time_equals_line_by_line(tmp_path_factory, runs, layouts, data):
    """Lines of one layout are converted together; whatever their values (bools, strings, null, NaN and
    huge or float32-overflowing numbers, nested lists, colliding or invalid names), the events and the
    report are those of ``_telemetry`` applied line by line."""
    lines, t = [], 0.0
    for which, count, dirty in runs:
        layout = layouts[which % len(layouts)]
        for row in data.draw(st.lists(_line_st(layout, dirty), min_size=count, max_size=count)):
            t += 0.05
            obj = {name: value for (name, _), value in zip(layout, row)}  # (a repeated name: the last wins)
            obj["t"] = t
            lines.append(json.dumps(obj).replace("Infinity", "1e999"))
    p = tmp_path_factory.getbasetemp() / "telemetry-runs.jsonl"  # (one file, rewritten by each example)
    p.write_text("".join(line + "\n" for line in lines))
    ref_report, got_report = StreamReport(), StreamReport()
    ref = []
    for i, line in enumerate(lines, 1):
        obj = _parse(line.encode(), i, ref_report)
        if obj is not None:
            ref.append(_telemetry(obj, ref_report))
    got = list(events(p, "telemetry", report=got_report))
    assert [(t, names, values.tolist()) for t, names, values in got] == [
        (t, names, values.tolist()) for t, names, values in ref
    ]
    assert all(values.dtype == np.float64 for _, _, values in got)
    got_report.lines = ref_report.lines = 0  # (counted by the line reader, which the reference skips)
    assert got_report == ref_report


def test_long_telemetry_runs_are_cut_and_keep_file_order(tmp_path):
    p = tmp_path / "telemetry.jsonl"
    n = 2 * RUN_LINES + 7
    _write(p, [{"t": i / 60, "ram": [i % 256] * 128, "lives": 3} for i in range(n)])
    got = list(events(p, "telemetry"))
    assert [e[0] for e in got] == [i / 60 for i in range(n)]
    assert all(e[2].tolist() == [float(i % 256)] * 128 + [3.0] for i, e in enumerate(got))
    assert got[0][1] == tuple(f"ram.{i}" for i in range(128)) + ("lives",)


def test_a_sorted_stream_is_handed_out_without_buffering_the_session(tmp_path):
    p = tmp_path / "t.jsonl"
    _write(p, [{"t": i / 60, "speed": i} for i in range(6000)])
    s = scan(p, "telemetry")
    assert s.lag == 0 and s.report.out_of_order == 0
    stream = EventStream(s)
    got = stream.until(1.0)
    assert len(got) == 60 and len(stream._heap) <= 1  # one read-ahead event, never the session


def test_out_of_order_events_are_sorted_stably_and_counted(tmp_path):
    p = tmp_path / "a.jsonl"
    _write(
        p,
        [
            {"t": 1.0, "control": "b", "value": 1},
            {"t": 0.5, "control": "a", "value": 1},
            {"t": 0.5, "control": "a", "value": 0},
            {"t": 0.7, "control": "a", "value": 3},
            {"t": 0.8, "control": "a", "value": True},
        ],
    )
    s = scan(p, "actions")
    assert s.names == ("a", "b") and s.report.out_of_order == 2 and s.report.malformed == 2 and s.lag == 0.5
    _, raw = ActionTrack(s).clip(np.array([0.0]), 0.0, 2.0)
    assert [(t, c, v) for t, c, v in raw] == [(0.5, "a", 1.0), (0.5, "a", 0.0), (1.0, "b", 1.0)]


def test_a_256_mib_line_costs_the_bound_not_the_line(tmp_path):
    """256 times the 1 MiB bound and 4 times the growth allowed: a reader that held the line would fail
    (it was a 1 GiB line: 4 s of writing and reading that prove no more)."""
    p = tmp_path / "actions.jsonl"
    chunk = b"x" * (8 << 20)
    with open(p, "wb") as f:
        f.write(b'{"t": 0.0, "control": "a", "value": 1}\n{"t": 1, "pad": "')
        for _ in range(32):
            f.write(chunk)
        f.write(b'"}\n{"t": 2.0, "control": "a", "value": 0}\n')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = scan(p, "actions")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert s.report.malformed == 1 and s.report.events == 2 and "longer than" in s.report.examples[0]
    assert grown_mib < 64


def test_telemetry_lists_become_indexed_channels_and_bad_fields_are_counted(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"t":0,"pos":[1,2],"speed":1,"name":"x"}\n{"t":1,"pos":[3,4],"speed":NaN}\n')
    s = scan(p, "telemetry")
    assert s.names == ("pos.0", "pos.1", "speed")
    assert s.report.dropped_fields == 2  # "name" is not numeric; NaN is dropped, not the line


def test_numbers_beyond_the_float_range_bools_and_infinities_are_dropped_fields_not_crashes(tmp_path):
    huge = "1" + "0" * 400  # valid JSON; float() of it raises OverflowError
    p = tmp_path / "t.jsonl"
    p.write_text(
        f'{{"t":0,"x":{huge},"l":[1,2]}}\n{{"t":1,"x":2,"l":[{huge},2]}}\n'
        '{"t":2,"x":3,"l":[true,2]}\n{"t":3,"x":4,"l":[1e999,2]}\n'
    )
    s = scan(p, "telemetry")
    assert s.report.dropped_fields == 4 and s.report.events == 4  # x, a list, a list, one element
    assert [dict(zip(e[1], e[2].tolist())) for e in events(p, "telemetry")] == [
        {"l.0": 1.0, "l.1": 2.0},
        {"x": 2.0},
        {"x": 3.0},
        {"l.1": 2.0, "x": 4.0},
    ]
    a = tmp_path / "a.jsonl"
    a.write_text(f'{{"t":0,"control":"fire","value":{huge}}}\n{{"t":{huge},"control":"fire","value":1}}\n')
    assert scan(a, "actions").report.malformed == 2


def test_telemetry_beyond_the_float32_range_it_is_stored_in_is_a_dropped_field_not_inf(tmp_path):
    """DBL_MAX is a common "none in range" sentinel: stored as float32 it became inf (a numpy overflow
    warning on stderr, no count), and validate then rejected the version for non-finite values."""
    from dsbuild.formats.streams import TelemetryTrack

    p = tmp_path / "t.jsonl"
    p.write_text('{"t":0,"dist":1.7976931348623157e308,"l":[3.5e38,-1e39,2],"ok":3.4e38}\n{"t":0.5,"dist":7}\n')
    s = scan(p, "telemetry")
    assert s.report.dropped_fields == 3
    track = TelemetryTrack(s, tmp_path)
    values = track.clip(np.array([0.0, 0.5]), 0.0, 1.0)
    assert np.isfinite(values).all()


def test_duplicate_keys_and_list_flat_collisions_are_counted_repairs(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"t":0,"speed":1,"speed":2}\n{"t":1,"pos":[1,2],"pos.0":9}\n{"t":2,"text":"a \\":b"}\n'
        '{"t":3,"pos":[NaN,2],"pos.0":9}\n'
    )
    s = scan(p, "telemetry")
    assert s.report.duplicate_keys == 1 and s.report.collisions == 1 and s.report.dropped_fields == 2
    got = [dict(zip(names, values.tolist())) for _, names, values in events(p, "telemetry")]
    assert got[0] == {"speed": 2.0}  # the last value wins, as in JSON parsers; the repair is counted
    assert got[1] == {"pos.0": 1.0, "pos.1": 2.0}  # the list wins over the flat `pos.0`
    assert got[3] == {"pos.1": 2.0, "pos.0": 9.0}  # a dropped NaN element leaves its name to the flat field
    assert s.report.repaired


def test_text_keeps_unicode_optional_speakers_and_drops_invalid_utf8(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(
        '{"t":1,"text":"ünï"}\n'.encode() + b'{"t":2,"text":"\xff"}\n' + b'{"t":3,"speaker":"p1","text":"gg"}\n'
    )
    s = scan(p, "text")
    assert s.report.malformed == 1 and s.report.events == 2
    assert TextTrack(s).clip(0.0, 5.0) == [
        {"t": 1.0, "speaker": None, "text": "ünï"},
        {"t": 3.0, "speaker": "p1", "text": "gg"},
    ]


def test_a_lone_surrogate_escape_is_a_malformed_line_not_a_quarantined_session(tmp_path):
    """JSON accepts "\\ud800" alone, but no text holds it: the line used to pass and the sample's
    canonical JSON then failed, quarantining the whole session (blaming its video)."""
    p = tmp_path / "x.jsonl"
    p.write_text(
        '{"t":1,"text":"bad \\ud800 x"}\n{"t":2,"text":"pair \\ud83d\\ude00 ok"}\n'
        '{"t":3,"text":"nan beside a pair \\ud83d\\ude00","n":NaN}\n'
    )
    s = scan(p, "text")
    assert s.report.malformed == 1 and "lone surrogate" in s.report.examples[0] and s.report.events == 2
    assert [e["text"] for e in TextTrack(s).clip(0.0, 5.0)] == ["pair \U0001f600 ok", "nan beside a pair \U0001f600"]


def test_a_missing_stream_is_reported_not_fatal(tmp_path):
    s = scan(tmp_path / "nope.jsonl", "actions")
    assert s.report.missing and s.report.repaired and ActionTrack(s).clip(np.zeros(3), 0, 1)[0].shape == (3, 0)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_stream_readers_never_crash_on_arbitrary_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fuzz") / "s.jsonl"
    p.write_bytes(data)
    for kind in ("actions", "telemetry", "text"):
        rep = scan(p, kind).report
        assert rep.events + rep.malformed <= rep.lines + 1


@given(st.lists(st.floats(0.1, 5), min_size=1, max_size=50), st.floats(0.5, 10))
def test_cuts_never_make_a_clip_shorter_than_the_target_except_the_last(gaps, clip_seconds):
    keyframes = np.cumsum([0.0] + gaps)
    starts = [keyframes[0]]
    for k in keyframes[1:]:
        if should_cut(starts[-1], k, clip_seconds):
            starts.append(k)
    assert all(b - a >= clip_seconds - 1e-3 for a, b in zip(starts, starts[1:]))
    assert set(starts) <= set(keyframes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 100, allow_nan=False), max_size=30).map(sorted),
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30),
)
def test_hold_is_the_last_value_at_or_before_each_frame(event_t, frame_t):
    values = np.arange(len(event_t), dtype=np.float32) + 1
    out = hold(np.array(event_t), values, np.array(frame_t), before=-1.0)
    for f, v in zip(frame_t, out):
        past = [values[i] for i, t in enumerate(event_t) if t <= f]
        assert v == (past[-1] if past else -1.0)

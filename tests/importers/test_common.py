"""The importers' pure parts: session ids, flattening messages, times and values from logs."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from dsbuild.importers.common import SessionReport, session_id
from dsbuild.importers.mcap import flatten
from dsbuild.importers.video import _Fit, _time, _value

ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@given(st.lists(st.text(max_size=100), max_size=20))
def test_session_ids_are_valid_unique_and_the_same_for_the_same_names(names):
    taken: set[str] = set()
    ids = [session_id(n, taken) for n in names]
    assert all(ID.fullmatch(i) for i, _ in ids)
    assert len({i for i, _ in ids}) == len(ids)
    assert all(changed == (i != n) for (i, changed), n in zip(ids, names))
    again: set[str] = set()
    assert [session_id(n, again) for n in names] == ids


def test_flatten_names_every_number_by_its_path_and_leaves_out_the_rest():
    report = SessionReport("s", "f")
    msg = {"a": {"b": [1, 2.5]}, "ok": True, "name": "x", "raw": b"\x00", "big": 1e39, "long": list(range(5000))}
    assert list(flatten(msg, "topic/", report, "f: topic message 1")) == [("topic/a.b.0", 1.0), ("topic/a.b.1", 2.5)]
    assert report.dropped == {"fields": 2}
    assert report.problems == [
        "f: topic message 1: topic/big: 1e+39 is not a finite float32",
        "f: topic message 1: topic/long: a list of 5000 values (over 4096)",
    ]


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9))
def test_a_logged_time_reads_back_as_written(t):
    assert _time(repr(t), None) == t and _time(t, None) == t
    assert _time(repr(1_793_527_200 + t), 1_793_527_200.0) == round(1_793_527_200 + t - 1_793_527_200, 6)


def test_values_and_the_fit_of_a_log():
    assert [_value(v) for v in ("down", " UP ", "0.5", 1, True, "nan", None)] == [1.0, 0.0, 0.5, 1.0, None, None, None]
    fit = _Fit(2.0)
    assert fit.problem(0.5, 2) is None and fit.problem(0.5, 3) is None
    assert fit.problem(0.4, 4) == "t=0.4 s is earlier than line 3 (t=0.5 s): the log is not in time order"
    assert fit.problem(2.5, 5) == "t=2.5 s is after the video's end at 2.000 s"

"""The validate report's charts keep every label inside the chart: long values, units, thresholds and edge
labels once ran past the SVG's edge and were clipped."""

from __future__ import annotations

import html
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.validators.charts import bar_chart, histogram, text_extent

TEXT = re.compile(r'<text x="(?P<x>[-\d.]+)"(?P<attrs>[^>]*)>(?P<body>[^<]*)')
ANCHOR = re.compile(r'text-anchor="(\w+)"')
WIDTH = re.compile(r'<svg class="chart" width="(\d+)" height="(\d+)"')

values = st.floats(min_value=0, max_value=1e9, allow_nan=False)
units = st.sampled_from(["", "s", "frames", "samples/s", "seconds per clip"])
labels = st.text(alphabet="abcdefghij_-0123456789", min_size=1, max_size=60)
thresholds = st.none() | st.floats(min_value=0, max_value=1e10, allow_nan=False)
keys = st.none() | st.sampled_from(["min_fps", "max_dropped_fraction", "clip_seconds_max"])


def labels_inside(svg: str) -> None:
    width, height = map(int, WIDTH.search(svg).groups())
    for m in TEXT.finditer(svg):
        body = html.unescape(m.group("body"))
        anchor = ANCHOR.search(m.group("attrs"))
        left, right = text_extent(float(m.group("x")), body, anchor.group(1) if anchor else "start")
        assert left >= -0.5 and right <= width + 0.5, (body, left, right, width)
    ys = [float(y) for y in re.findall(r' y="([-\d.]+)"', svg)]
    assert max(ys) <= height, (max(ys), height)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(labels, values), max_size=40), units, thresholds, keys, st.sampled_from(["below", "above"]))
def test_bar_chart_labels_stay_inside_the_chart(items, unit, threshold, key, bad):
    labels_inside(bar_chart("clips per session", items, unit, threshold=threshold, threshold_key=key, bad=bad))


@settings(max_examples=60, deadline=None)
@given(st.lists(values, max_size=200), units, thresholds, keys, st.sampled_from(["below", "above"]))
def test_histogram_labels_stay_inside_the_chart(xs, unit, threshold, key, bad):
    labels_inside(histogram("frames per second", xs, unit, threshold=threshold, threshold_key=key, bad=bad))


def test_a_long_legend_wraps_and_the_chart_grows_to_hold_it():
    short = bar_chart("t", [("a", 1.0)], "s", what="v", threshold=0.5, threshold_key="k")
    long = bar_chart(
        "t",
        [("a", 1.0)],
        "seconds per clip",
        what="value of a long name",
        threshold=123456.5,
        threshold_key="max_dropped_fraction",
    )
    assert int(WIDTH.search(long).group(2)) > int(WIDTH.search(short).group(2))
    labels_inside(long)

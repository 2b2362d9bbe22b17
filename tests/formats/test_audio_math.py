"""The per-packet audio arithmetic in integers equals its exact rational definition (it runs for every
copied audio packet, so it avoids Fraction; a rounding slip would move audio by a tick or miss a hole)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from dsbuild.formats.audio import SYNC_SLACK, _hole, _scaler
from dsbuild.formats.mp4 import PacketRecord

fractions = st.builds(Fraction, st.integers(-(10**9), 10**9), st.integers(1, 10**6))
time_bases = st.builds(Fraction, st.integers(1, 1000), st.sampled_from([1, 1000, 44100, 48000, 90000, 10**7]))


@given(fractions.filter(lambda f: f > 0), fractions, st.integers(-(10**12), 10**12))
def test_scaler_is_exact_rounding_half_to_even(scale, offset, ticks):
    assert _scaler(scale, offset)(ticks) == round(ticks * scale - offset)


@given(time_bases, st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 3000)), min_size=1, max_size=30))
def test_hole_is_the_rational_comparison(tb, steps):
    packets, pts = [], 0
    for gap, duration in steps:
        pts += gap
        packets.append(PacketRecord(b"", pts, None, duration, True))
    exact = any(
        (b.pts - a.pts - a.duration) * tb > a.duration * tb + Fraction(SYNC_SLACK) for a, b in zip(packets, packets[1:])
    )
    assert _hole(packets, tb) == exact

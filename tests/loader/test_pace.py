"""Who builds a GIL-bound batch: a worker ahead of time while the consumer stays away at least as long as
a build takes, the consumer itself otherwise (and until it has been seen away); anything that decodes or
hashes always goes ahead."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dsbuild.loader.pace import Pace, ema

seconds = st.floats(0, 10, allow_nan=False)


@given(st.lists(seconds, min_size=1, max_size=30))
def test_the_running_average_stays_within_what_it_saw(values):
    average = None
    for v in values:
        average = ema(average, v)
    assert min(values) - 1e-9 <= average <= max(values) + 1e-9
    assert ema(None, values[0]) == values[0]


@given(st.booleans(), st.lists(seconds, max_size=5), st.lists(seconds, max_size=5))
def test_gil_bound_batches_go_ahead_only_once_the_consumer_is_seen_away_as_long_as_a_build(gil, builds, aways):
    pace = Pace(gil_bound=gil)
    for b in builds:
        pace.built(b)
    for a in aways:
        pace.returned(a)
    if not gil:
        assert pace.ahead()
    elif not builds or not aways:  # (the first batch is asked for at once: its consumer builds it)
        assert not pace.ahead()
    else:
        assert pace.ahead() == (pace.away >= pace.build)

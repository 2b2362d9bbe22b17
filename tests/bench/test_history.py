"""The history's regression rule: a one-sided Mann-Whitney U test on the rounds against the trailing runs
of the same configuration, with an effect floor; exit 1 from `dsbuild bench history DIR` on a regression."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.bench.train.history import ALPHA, MIN_TRAILING, judge, mann_whitney_greater

values = st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=12)


@given(values, values)
@settings(max_examples=60, deadline=None)
def test_the_exact_p_value_is_scipys(x, y):
    stats = pytest.importorskip("scipy.stats")
    if len(set(x) | set(y)) < len(x) + len(y):
        method = "asymptotic"
    else:
        method = "exact"
    want = stats.mannwhitneyu(x, y, alternative="greater", method=method).pvalue
    assert mann_whitney_greater(x, y) == pytest.approx(want, rel=1e-6, abs=1e-12)


def row(run: int, rounds: list[float], figure: str = "step_s", config: str = "c1") -> dict:
    import statistics

    return {
        "run_id": f"r{run:03d}",
        "started_at": f"2026-12-06T00:{run:02d}",
        "config": config,
        "description": "tiny ddp",
        "figure": figure,
        "rounds": rounds,
        "median": statistics.median(rounds),
    }


def steady(n: int, seed: int = 0, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [scale * rng.gauss(0.1, 0.005) for _ in range(n)]


def test_a_slower_run_is_flagged_and_an_unchanged_one_passes():
    history = [row(i, steady(5, i)) for i in range(5)]
    (same,) = judge([*history, row(9, steady(5, 99))])
    assert not same.regressed and same.trailing_runs == 5
    (slow,) = judge([*history, row(9, steady(5, 99, scale=1.3))])
    assert slow.regressed and slow.p_value < ALPHA and slow.change > 0.2


def test_the_direction_follows_the_figure():
    history = [row(i, steady(5, i), figure="mfu") for i in range(5)]
    (higher,) = judge([*history, row(9, steady(5, 99, scale=1.3), figure="mfu")])  # a higher MFU is better
    assert not higher.regressed and higher.change < 0
    (lower,) = judge([*history, row(9, steady(5, 99, scale=0.7), figure="mfu")])
    assert lower.regressed


def test_too_few_trailing_runs_are_not_judged_and_configurations_are_apart():
    history = [row(i, steady(5, i)) for i in range(MIN_TRAILING - 1)] + [row(5, steady(5, 5, scale=2))]
    (j,) = judge(history)
    assert not j.regressed and "needed" in j.note
    other = [row(i, steady(5, i, scale=3), config="c2") for i in range(4)]
    judged = judge([*[row(i, steady(5, i)) for i in range(4)], *other])
    assert [x.regressed for x in judged] == [False, False]


def test_the_false_alarm_rate_on_unchanged_runs_is_near_alpha():
    """Simulated unchanged runs with run-to-run drift (each run's mean moves ~3%, as these machines do):
    the effect floor keeps the rate of false calls at or below the test's alpha."""
    rng = random.Random(7)
    alarms = trials = 0
    for _ in range(300):
        runs = [row(i, steady(5, rng.random() * 1e9, scale=rng.gauss(1, 0.03))) for i in range(6)]
        (j,) = judge(runs)
        alarms += j.regressed
        trials += 1
    assert alarms / trials <= 0.05


def test_a_part_of_the_step_is_judged_in_shares_of_the_step():
    """A data wait of ~2 ms that becomes ~5 ms in a 100 ms step is no regression; one of 30 ms is."""
    steps = [row(i, steady(5, i)) for i in range(5)]
    waits = [row(i, [0.002 + 0.0001 * k for k in range(5)], figure="data_wait_s") for i in range(5)]
    small = judge([*steps, *waits, row(9, steady(5, 9)), row(9, [0.005 + 0.0001 * k for k in range(5)], "data_wait_s")])
    assert not any(j.regressed for j in small)
    large = judge([*steps, *waits, row(9, steady(5, 9)), row(9, [0.03 + 0.0001 * k for k in range(5)], "data_wait_s")])
    assert [j.figure for j in large if j.regressed] == ["data_wait_s"]

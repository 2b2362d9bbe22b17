"""The arithmetic of bench: summaries over rounds, per-round ratios, percentiles, per-second rates, the
rotation of measurements, and the wall budget (driven by an injected clock)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.bench.budget import Budget
from dsbuild.bench.stats import paired_ratios, percentiles, rotate, sampled_rates, summarise

values = st.lists(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), min_size=1, max_size=30)


@given(values)
def test_a_summary_orders_its_figures_and_matches_the_median(xs):
    s = summarise(xs)
    assert s.min <= s.q1 <= s.median <= s.q3 <= s.max and s.rounds == len(xs)
    assert s.median == pytest.approx(statistics.median(xs)) and s.iqr >= 0


@given(values, st.randoms(use_true_random=False), st.floats(min_value=1e-3, max_value=1e3))
def test_a_summary_ignores_order_and_scales_with_its_values(xs, rnd, k):
    shuffled = xs[:]
    rnd.shuffle(shuffled)
    assert summarise(shuffled) == summarise(xs)
    scaled = summarise([x * k for x in xs])
    assert scaled.median == pytest.approx(summarise(xs).median * k) and scaled.iqr == pytest.approx(summarise(xs).iqr * k)


def test_a_summary_skips_what_was_not_measured():
    assert summarise([None, float("nan")]) is None
    one = summarise([2.0, None])
    assert (one.median, one.q1, one.q3, one.rounds) == (2.0, 2.0, 2.0, 1)
    assert summarise([1.0, 2.0, 3.0, 4.0, 100.0]).iqr == 2.0  # inclusive quartiles: x[1] .. x[3]


def test_ratios_pair_rounds_and_skip_missing_or_zero_divisors():
    assert paired_ratios([2.0, 3.0, None, 8.0], [4.0, 0.0, 1.0, 4.0]) == [0.5, 2.0]


def test_percentiles_are_nearest_rank():
    assert percentiles([float(i) for i in range(1, 101)]) == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert percentiles([]) is None


@given(st.lists(st.tuples(st.floats(0.01, 5), st.floats(0, 1000)), min_size=1, max_size=20))
def test_rates_sampled_every_second_integrate_back_to_the_total(steps):
    points, t, n = [], 0.0, 0.0
    for dt, dn in steps:
        t, n = t + dt, n + dn
        points.append((t, n))
    rates = sampled_rates(points, offset=10.0)
    widths = [b - a for a, b in zip([0.0] + [p[0] for p in points], [p[0] for p in points])]
    assert sum(r * w for (_, r), w in zip(rates, widths)) == pytest.approx(n, rel=1e-9, abs=1e-6)
    assert all(10.0 < x <= 10.0 + t for x, _ in rates)


@given(st.lists(st.text(min_size=1), min_size=1, max_size=6, unique=True), st.integers(0, 50))
def test_rotation_is_a_permutation_that_moves_the_first_slot(names, r):
    order = rotate(names, r)
    assert sorted(order) == sorted(names) and order[0] == names[r % len(names)]


# -- the wall budget ------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def simulate(duration: float, rounds: int, per_round: int, unit: float) -> tuple[float, int]:
    """Run measurements that take their slice or ``unit`` (the smallest piece of work), whichever is longer,
    as bench does; return (seconds measured, rounds finished)."""
    clock = Clock()
    budget = Budget(duration, rounds, per_round, clock)
    done = 0
    while budget.can_start_round(done):
        for _ in range(per_round):
            clock.t += max(budget.slice(), unit)
            budget.spend()
        done += 1
    return budget.elapsed(), done


@given(st.floats(1, 600), st.integers(1, 10), st.integers(1, 6), st.floats(0, 5))
def test_the_budget_ends_within_half_a_round_of_duration(duration, rounds, per_round, unit):
    measured, done = simulate(duration, rounds, per_round, unit)
    mean_round = measured / done
    assert done >= 1
    assert measured <= duration + 0.5 * mean_round + per_round * unit + 1e-6
    if done < rounds:  # stopped early: less than half a round was left
        assert measured >= duration - 0.5 * mean_round - 1e-6


@given(st.floats(10, 600), st.integers(1, 10), st.integers(1, 6))
def test_when_work_is_fine_grained_every_round_runs_and_the_budget_is_spent(duration, rounds, per_round):
    measured, done = simulate(duration, rounds, per_round, unit=duration / (100 * rounds * per_round))
    assert done == rounds and measured == pytest.approx(duration, rel=0.02)


def test_overruns_are_paid_by_the_later_slices():
    clock = Clock()
    budget = Budget(10.0, 2, 2, clock)
    assert budget.slice() == 2.5
    clock.t += 4.0  # the first measurement overran its 2.5 s
    budget.spend()
    assert budget.slice() == pytest.approx(2.0)  # 6 s left for 3 measurements

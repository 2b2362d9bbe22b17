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
    assert scaled.median == pytest.approx(summarise(xs).median * k) and scaled.iqr == pytest.approx(
        summarise(xs).iqr * k
    )


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
    assert measured <= duration + 0.5 * mean_round + per_round * (unit + duration / (rounds * per_round)) + 1e-6
    if done < rounds:  # stopped early: less than half a round was left
        assert measured >= duration - 0.5 * mean_round - 1e-6


@given(st.floats(10, 600), st.integers(1, 10), st.integers(1, 6))
def test_when_work_is_fine_grained_every_round_runs_and_the_budget_is_spent(duration, rounds, per_round):
    measured, done = simulate(duration, rounds, per_round, unit=duration / (100 * rounds * per_round))
    assert done == rounds and measured == pytest.approx(duration, rel=0.02)


def test_overruns_are_paid_by_the_later_slices_down_to_the_planned_share():
    clock = Clock()
    budget = Budget(10.0, 2, 2, clock)
    assert budget.slice() == 2.5
    clock.t += 1.0  # the first measurement ended early (a reader that ran out of data)
    budget.spend()
    assert budget.slice() == pytest.approx(3.0)  # 9 s left for 3 measurements
    clock.t += 4.0  # the second overran its 3 s
    budget.spend()
    assert budget.slice() == pytest.approx(2.5)  # 5 s left for 2
    clock.t += 5.5  # the third overran by far more
    budget.spend()
    assert budget.slice() == 2.5  # the last still gets its planned share, not 0 s


@given(st.floats(1, 600), st.integers(1, 10), st.integers(1, 6), st.floats(0, 50))
def test_no_slice_is_shorter_than_its_planned_share(duration, rounds, per_round, overrun):
    clock = Clock()
    budget = Budget(duration, rounds, per_round, clock)
    for _ in range(rounds * per_round):
        assert budget.slice() >= duration / (rounds * per_round)
        clock.t += budget.slice() + overrun
        budget.spend()


def _round(seconds: float, waits_ms: tuple[float, ...]):
    from dsbuild.bench.harness import OursRound
    from dsbuild.bench.measure import Measured
    from dsbuild.bench.stages import Stages

    m = Measured("ours", 0, 0.0, seconds, 10.0, 100.0, 1e6, ((seconds, 10.0, 100.0, 1e6),))
    stages = Stages(wall=seconds, wait=0.0, h2d=0.0, step=0.0, read=0.0, decode=0.0, collate=0.0, workers={})
    return OursRound(
        throughput=m,
        training=m,
        open_s=0.1,
        first_batch_s=0.2,
        resume_s=0.2,
        waits_ms=(),
        step_waits_ms=waits_ms,
        gpu_busy_s=None,
        corrupt=0,
        throughput_stages=stages,
        training_stages=stages,
        notes=(),
    )


def test_the_wait_share_of_ranks_run_together_is_over_all_their_time():
    from dsbuild.bench.ranks import combine
    from dsbuild.bench.step import StepInfo
    from dsbuild.bench.summary import training

    # each of two ranks waited 1 s of its 4 s: the loop waited 25% of the time, not 50%
    both = combine([_round(4.0, (500.0, 500.0)), _round(4.0, (250.0, 750.0))])
    assert both.ranks == 2
    assert training([both], StepInfo("sleep", 50.0)).wait_fraction.median == pytest.approx(0.25)
    assert training([_round(4.0, (500.0, 500.0))], StepInfo("sleep", 50.0)).wait_fraction.median == pytest.approx(0.25)


def test_a_meter_rates_over_the_time_it_counted_and_ends_by_the_clock():
    """A baseline's per-epoch set-up is left out of its rate (``Meter.exclude``), not out of the run's
    budget: the slice still ends when its wall time is spent (a tiny epoch made slices overrun 20x)."""
    from dsbuild.bench.measure import Meter

    now = [0.0]
    m = Meter("peer", 0, 0.0, 1.0, decodes=False, clock=lambda: now[0])
    now[0] = 0.6
    m.exclude(0.5)  # an epoch's set-up
    m.add(samples=100)
    assert not m.over
    now[0] = 1.0
    assert m.over
    r = m.result()
    assert r.seconds == pytest.approx(0.5) and r.samples == 100 and r.points[-1][0] == pytest.approx(0.5)

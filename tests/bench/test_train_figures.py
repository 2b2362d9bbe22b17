"""The figures of ``bench --model`` from measured parts: stragglers, scaling efficiency, verdict, cost, sizes."""

from __future__ import annotations

import pytest

from dsbuild.bench import models
from dsbuild.bench.train.decompose import Parts
from dsbuild.bench.train.options import Inject, TrainOptions, parse_inject, parse_ranks
from dsbuild.bench.train.peaks import datasheet
from dsbuild.bench.train.report import efficiency, paired_efficiency, straggler
from dsbuild.bench.train.run import plan
from dsbuild.bench.train.worker import round_steps
from dsbuild.core.errors import UsageError


def parts(compute=0.1, comm_wait=0.0, data=0.0, other=0.01) -> Parts:
    step = compute + comm_wait + data + other
    return Parts(step, compute, comm_wait, data, 0.0, other, comm_wait + 0.02)


def test_the_rank_the_others_wait_for_is_named_with_its_component():
    slow = parts(data=0.3)
    fast = parts(comm_wait=0.3)
    s = straggler([fast, slow, parts(comm_wait=0.29)])
    assert (s.rank, s.component, s.flagged) == (1, "data_wait", True)
    assert s.excess_s == pytest.approx(0.3)


def test_a_slow_device_is_named_as_compute_and_even_ranks_are_not_flagged():
    s = straggler([parts(compute=0.4), parts(comm_wait=0.3)])
    assert (s.rank, s.component, s.flagged) == (0, "compute", True)
    assert not straggler([parts(), parts(compute=0.101)]).flagged
    assert straggler([parts()]) is None


def test_scaling_efficiency_weak_and_strong():
    assert efficiency("weak", 1.0, 1.0, 2) == 1.0  # the step did not grow with the ranks
    assert efficiency("strong", 1.0, 0.5, 2) == 1.0  # half the batch each, half the time
    assert efficiency("strong", 1.0, 1.0, 2) == 0.5


def test_steps_are_cut_into_even_rounds_and_rounds_are_paired():
    assert round_steps(5, 3) == [2, 2, 1] and round_steps(2, 5) == [1, 1] and round_steps(4, 1) == [4]

    class P:  # the two fields paired_efficiency reads of a Point
        def __init__(self, world, step_s, rounds):
            self.world, self.step_s, self.round_step_s = world, step_s, rounds

    base, weak = P(1, 1.0, (1.0, 2.0, 1.0)), P(2, 2.0, (2.0, 2.0, 4.0))
    assert paired_efficiency("weak", base, weak) == 0.5  # median of 0.5, 1.0, 0.25: each round under one load
    assert paired_efficiency("weak", P(1, 1.0, None), P(2, 2.0, None)) == 0.5  # (no rounds: the windows)


def test_the_sweep_plans_weak_and_strong_points_when_the_batch_divides():
    o = TrainOptions(ref="c", model="tiny", ranks=(2, 1), batch_size=2)
    assert plan(o) == ([("base", 1, 2), ("weak", 2, 2), ("strong", 2, 1)], [])
    jobs, notes = plan(TrainOptions(ref="c", model="tiny", ranks=(1, 2), batch_size=3))
    assert jobs == [("base", 1, 3), ("weak", 2, 3)] and "does not divide" in notes[0]


def test_parameter_counts_are_the_modules_own():
    torch = pytest.importorskip("torch")
    for name, s in models.SIZES.items():
        with torch.device("meta"):
            m = models.build(name, 8, 64, 64, 5)
        assert sum(p.numel() for p in m.parameters()) == models.parameters(s, 8, 64, 64, 5)
    counts = [models.parameters(s, *models.LIST_SHAPE) for s in models.SIZES.values()]
    assert counts == sorted(counts) and 0.5e6 < counts[0] < 2e6 and 80e6 < counts[-1] < 120e6


def test_datasheet_peaks_by_device_name_and_dtype():
    assert datasheet("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert datasheet("NVIDIA H100 PCIe", "fp32") == pytest.approx(51.2e12)
    assert datasheet("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(312e12)
    assert datasheet("Intel Xeon", "bf16") is None


def test_options_parse_and_refuse():
    assert parse_ranks("1,2,4") == (1, 2, 4)
    assert parse_inject("1:200") == Inject(1, "compute", 200.0)
    assert parse_inject("0:data:50") == Inject(0, "data", 50.0)
    for bad in ("1", "x:1", "1:disk:5", "1:data"):
        with pytest.raises(UsageError, match="--inject-delay"):
            parse_inject(bad)
    with pytest.raises(UsageError, match="rank 2"):
        TrainOptions(ref="c", model="tiny", ranks=(1, 2), inject=Inject(2, "data", 5))
    with pytest.raises(UsageError, match="known: tiny, small, medium, base"):
        models.size("huge")

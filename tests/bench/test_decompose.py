"""The step decomposition's interval arithmetic: the parts partition the step window, whatever overlaps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dsbuild.bench.train.decompose import PARTS, length, mean, minus, split_step, union
from dsbuild.bench.train.profile import is_comm

spans = st.lists(
    st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 3, allow_nan=False)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=8,
)


@given(spans)
def test_union_is_disjoint_sorted_and_covers_the_same_instants(xs):
    u = union(xs)
    assert all(a < b for a, b in u)
    assert all(u[i][1] < u[i + 1][0] for i in range(len(u) - 1))
    for a, b in xs:
        if b > a:
            mid = (a + b) / 2
            assert any(lo <= mid <= hi for lo, hi in u)


@given(spans, spans)
def test_minus_and_intersection_add_up(xs, ys):
    a, b = union(xs), union(ys)
    assert abs(length(minus(a, b)) + length(minus(a, minus(a, b))) - length(a)) < 1e-9


@given(spans, spans, spans, spans, st.floats(0, 5), st.floats(0.1, 8))
def test_parts_partition_the_step_window(data, h2d, compute, comm, start, size):
    p = split_step((start, start + size), data, h2d, compute, comm)
    assert all(getattr(p, k) >= 0 for k in PARTS)
    assert abs(sum(getattr(p, k) for k in PARTS) - p.step) < 1e-9
    assert p.exposed_comm <= p.comm + 1e-9


def test_precedence_data_then_h2d_then_compute_then_exposed_communication():
    p = split_step((0.0, 10.0), data=[(0, 2)], h2d=[(1, 3)], compute=[(2, 6)], comm=[(5, 8)])
    assert (p.data_wait, p.h2d, p.compute, p.exposed_comm, p.other, p.comm) == (2, 1, 3, 2, 2, 3)


def test_the_mean_step_still_adds_up():
    a = split_step((0.0, 4.0), [(0, 1)], [], [(1, 3)], [(2, 4)])
    b = split_step((0.0, 6.0), [(0, 3)], [], [(3, 4)], [])
    m = mean([a, b])
    assert m.step == 5 and abs(sum(getattr(m, k) for k in PARTS) - 5) < 1e-12


def test_collectives_are_named_as_torch_names_them():
    for name in (
        "gloo:all_reduce",
        "c10d::allreduce_",
        "FSDP::all_gather (blocks.1)",
        "ncclDevKernel_AllReduce",
        "FSDP::post_backward_rs_wait (blocks.0)",
        "record_param_comms",
    ):
        assert is_comm(name), name
    for name in ("aten::mm", "fsdp::all_gather_copy_in", "FSDP::all_gather_copy_out (blocks.3)", "dsbuild.step"):
        assert not is_comm(name), name

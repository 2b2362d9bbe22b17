"""The epoch order is pure arithmetic: a keyed bijection with random access, pinned by golden vectors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.permutation import block_order, derive_key, global_order


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**63))
def test_global_order_is_a_permutation(n, key):
    order = global_order(n, key, 0, n)
    assert sorted(order.tolist()) == list(range(n))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**63), st.integers(0, 3000), st.integers(0, 500))
def test_any_window_of_the_order_is_computed_alone(n, key, start, count):
    full = global_order(n, key, 0, n)
    assert global_order(n, key, start, count).tolist() == full[start : start + count].tolist()


# n up to 1,000: with blocks of 1 that is still 1,000 windows (cost grows with the window count, a
# permutation per window), and every case the order has (many windows, a short tail block, a short last
# window, a start past the end) occurs far below it
@settings(max_examples=100, deadline=None)
@given(st.integers(1, 1000), st.integers(0, 2**63), st.integers(1, 64), st.integers(1, 8), st.integers(0, 1100))
def test_block_order_is_a_permutation_with_random_access(n, key, block, window, start):
    full = block_order(n, key, 0, n, block, window)
    assert sorted(full.tolist()) == list(range(n))
    assert block_order(n, key, start, 100, block, window).tolist() == full[start : start + 100].tolist()


def test_block_order_keeps_reads_local():
    order = block_order(10_000, 7, 0, 10_000, block=100, window=4)
    span_blocks = [len(set((order[i : i + 400] // 100).tolist())) for i in range(0, 10_000, 400)]
    assert max(span_blocks) <= 4


def test_golden_vector_pins_the_order():
    """A change of this vector is a change of every user's epoch order: bump the state format."""
    assert global_order(10, 12345, 0, 10).tolist() == [6, 0, 3, 2, 1, 7, 9, 5, 4, 8]
    assert block_order(10, 12345, 0, 10, block=3, window=2).tolist() == [3, 4, 8, 5, 6, 7, 9, 2, 1, 0]


def test_different_epochs_give_different_orders():
    a = global_order(1000, derive_key(1, 0), 0, 1000)
    b = global_order(1000, derive_key(1, 1), 0, 1000)
    assert (a != b).mean() > 0.9

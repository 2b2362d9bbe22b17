"""How the worker processes of a DataLoader pass agree where it starts (``loader.passes``): a simulation of
passes whose workers start and finish in any interleaving, some broken off, some after the main process
moved its loader."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dsbuild.loader.passes import PassFile, _parse, decode, encode, pass_done, pass_start
from dsbuild.loader.walk import Position

# a pass: its workers, whether all of them finish, whether the main process moved its loader before it, and
# the order its workers' start/done events come in (a worker's done always after its start)
passes = st.lists(
    st.tuples(st.integers(1, 4), st.booleans(), st.booleans(), st.randoms(use_true_random=False)),
    min_size=1,
    max_size=8,
)


def _events(workers: int, finish: bool, rnd) -> list[tuple[str, int]]:
    starts = list(range(workers))
    rnd.shuffle(starts)
    events, started = [], []
    for w in starts:
        events.append(("start", w))
        started.append(w)
        if finish and rnd.random() < 0.5:  # a fast worker finishes before a sibling has started
            events.append(("done", w))
            started.remove(w)
    if finish:
        rnd.shuffle(started)
        events += [("done", w) for w in started]
    return events


@given(passes)
def test_siblings_agree_and_each_pass_starts_where_the_last_whole_one_ended(plan):
    record, own, expected, epoch_length = None, [0, [[0, 0]], 0], [0, [[0, 0]], 0], 5
    for n, (workers, finish, moved, rnd) in enumerate(plan):
        if moved:  # load_state_dict in the main process: the next pass starts there
            own = expected = [7 * n + 3, [[n, 1]], 0]
        name, starts = [1234, n + 1], set()
        end = [expected[0] + epoch_length, [[expected[1][0][0] + 1, 0]], 0]
        for what, _ in _events(workers, finish, rnd):
            if what == "start":
                start, record = pass_start(record, name, workers, own)
                starts.add(str(start))
            else:
                record = pass_done(record, name, end)
        assert starts == {str(expected)}  # every worker of the pass started at the same place, the right one
        if finish:
            expected = end  # a whole pass: the next starts where it ended; a broken one is taken again


def test_a_pass_named_like_a_finished_one_is_a_new_pass():
    """A DataLoader made anew each epoch with a seeded generator draws the same base seed every time."""
    own = [0, [[0, 0]], 0]
    _start, record = pass_start(None, [5, 1], 1, own)
    record = pass_done(record, [5, 1], [9, [[1, 0]], 0])
    assert pass_start(record, [5, 1], 1, own)[0] == [9, [[1, 0]], 0]


def test_the_record_file_survives_only_whole_records_and_positions_round_trip(tmp_path):
    p = Position(12, ((3, 4), (0, 9)), 2)
    assert decode(encode(p)) == p
    for bad in (
        b"",
        b"{",
        b"[]",
        b'{"record": {"pass": [1, 1]}}',
        b'{"record": {"pass": [1, 1], "workers": -1, '
        b'"base": [0, [], 0], "start": [0, [], 0], "end": null, "done": 0}, "main": [0, [[-1, 0]], 0]}',
    ):
        assert _parse(bad) == (None, None)
    passes = PassFile()
    assert passes.start([1, 1], 2, p) == p
    passes.done([1, 1], Position(20, ((4, 0), (1, 0)), 0))
    assert passes.start([1, 1], 2, p) == p  # the sibling still to finish
    passes.done([1, 1], Position(20, ((4, 0), (1, 0)), 0))
    assert passes.start([2, 1], 2, p) == Position(20, ((4, 0), (1, 0)), 0)
    moved = Position(3, ((1, 0), (0, 2)), 0)
    passes.moved(moved)  # load_state_dict in the main process: a worker's own copy no longer counts
    assert passes.start([3, 1], 2, p) == moved
    passes.remove()
    passes.moved(p)  # (the dataset gone: nothing to tell)

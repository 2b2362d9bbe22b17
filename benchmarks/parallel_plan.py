"""Time for one rank to plan its batches, and to restore, at W = 4,096 ranks (issue 40; goal < 50 ms a rank).

An index-only source of 10^6 samples (an ``EpochPlan``: the loader's own planning, no I/O), batch 8. For
each layout, one rank (the last reading one: the most global batches walked before its own):

- ``step``: its batch of one global step from a position mid-epoch (``walk_batches`` + ``rank_steps``,
  what ``Loader.steps`` runs), as sample indices;
- ``restore``: a checkpoint saved under the layout read back (``LoaderState.from_json``, the order check)
  and the first batch planned under the other layout (W = 3,072), as ``load_state_dict`` + the first step;
- ``epoch``: every batch of its epoch from the start (all its steps).

With ``--balance`` the global step's samples are dealt with ``balance="frames"`` (lengths drawn 30..600).
Each figure is a median of ``--repeats`` runs, in wall time and in this process's CPU time (what a loaded,
shared machine inflates least).

    .venv/bin/python benchmarks/parallel_plan.py [--repeats 5] [--balance]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from dsbuild.loader.epoch import EpochPlan
from dsbuild.loader.parallel import Parallel
from dsbuild.loader.plan import PlanSpec
from dsbuild.loader.state import Cursor, LoaderState, SourceId
from dsbuild.loader.walk import Position, balance_steps, rank_keep, rank_steps, step_items, walk_batches

N, BATCH, SEED = 1_000_000, 8, 17
T = TypeVar("T")
LAYOUTS = [((1, 1, 1), (1, 1, 1)), ((8, 4, 4), (4, 2, 3)), ((8, 1, 1), (8, 4, 4)), ((2, 4, 2), (3, 1, 2))]


def rank_plan(plan: EpochPlan, layout: tuple, world: int, rank: int, start: int, steps: int | None, balance: bool):
    """Sample indices of ``rank``'s next ``steps`` batches (None: to the end of the epoch) from global batch
    ``start``."""
    at = Parallel(*layout).coords(rank, world)
    keep = None if balance else rank_keep(start, at.dp_size, at.dp)
    walk = walk_batches(Position(start, ((0, start),)), [plan], np.ones(1), SEED, True, keep)
    regroup = (lambda group, k: balance_steps(group, [plan], None, k)[0]) if balance else None
    mine = rank_steps(walk, start, at.dp_size, at.dp, regroup=regroup)
    out = []
    for step, _ in itertools.islice(mine, steps):
        if step is None:
            break
        out.append([r.index for item in step_items(step, [plan]) for r in item])
    return out


def last_reader(layout: tuple, world: int) -> int:
    p = Parallel(*layout)
    return max(r for r in range(world) if p.coords(r, world).reads)


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, float, T]:
    """Median wall and CPU seconds of ``repeats`` calls (CPU: this process's, what a loaded shared
    machine inflates least), and the last call's result."""
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out  # (repeats >= 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--balance", action="store_true")
    args = ap.parse_args()
    lengths = np.random.default_rng(0).integers(30, 600, N) if args.balance else None
    t0 = time.perf_counter()
    plan = EpochPlan(N, SEED, "index-only/", PlanSpec(BATCH), lengths=lengths)
    total = plan.batches_in_epoch(0)
    print(
        f"index-only source: {N:,} samples, batch {BATCH}, {total:,} global batches an epoch "
        f"(plan object {1000 * (time.perf_counter() - t0):.1f} ms); python {platform.python_version()}, "
        f"balance={'frames' if args.balance else None}"
    )
    print(
        f"{'layout (tp,cp,pp) W=4096':<26} {'dp':>5} {'step ms':>8} {'(cpu)':>6} {'restore ms':>11} {'(cpu)':>6} "
        f"{'-> layout W=3072':<18} {'epoch ms':>9} {'batches':>8}"
    )
    state = LoaderState(
        sources=(SourceId("0" * 64, None, None, 1.0),),
        order={"seed": SEED, "batch_size": BATCH, "balance": "frames" if args.balance else None},
        position=0,
        cursors=(Cursor(0, 0),),
        inner=0,
    )
    for layout, other in LAYOUTS:
        print(row(plan, state, layout, other, args.repeats, args.balance))


def row(plan: EpochPlan, state: LoaderState, layout: tuple, other: tuple, repeats: int, balance: bool) -> str:
    """One layout's line: a step's plan, a restore into ``other`` at W = 3,072, the whole epoch's plan."""
    p = Parallel(*layout)
    dp = p.data_parallel(4096)
    rank = last_reader(layout, 4096)
    mid = (plan.batches_in_epoch(0) // 2) // dp * dp  # a checkpoint after a whole global step, mid-epoch
    step_s, step_cpu, _ = timed(lambda: rank_plan(plan, layout, 4096, rank, mid, 1, balance), repeats)
    saved = json.dumps(
        {**state.to_json(), "position": mid, "cursors": [{"epoch": 0, "at": mid}], "layout": p.to_json(4096)}
    )
    new_rank = last_reader(other, 3072)

    def restore():
        theirs = LoaderState.from_json(json.loads(saved), "loader checkpoint")
        state.check_compatible(theirs)
        return rank_plan(plan, other, 3072, new_rank, theirs.position, 1, balance)

    restore_s, restore_cpu, _ = timed(restore, repeats)
    epoch_s, _, batches = timed(lambda: rank_plan(plan, layout, 4096, rank, 0, None, balance), 1)
    return (
        f"{layout!s:<26} {dp:>5} {1000 * step_s:>8.1f} {1000 * step_cpu:>6.1f} {1000 * restore_s:>11.1f} "
        f"{1000 * restore_cpu:>6.1f} {other!s:<18} "
        f"{1000 * epoch_s:>9.0f} {len(batches):>8}"
    )


if __name__ == "__main__":
    main()

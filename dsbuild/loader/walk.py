"""The global stream as pure functions: which batch is global batch j, and which rank gets it.

A *walk* starts at a ``Position`` (global batches consumed, one cursor per source) and yields one
``Step`` per global batch, each carrying the ``Position`` after it, and ends with ``End`` where a
source runs out under ``stop``. Walks read only the epoch plans (pure functions of the index), so a
walk restored from any step's ``after`` continues exactly as the uninterrupted walk did.

- ``walk_batches`` (mix="batch"): the mixing schedule picks a source per global batch; the source's
  cursor names (epoch, batch) in its own epoch plan (bucketing and packing are per source).
- ``walk_samples`` (mix="sample"): the schedule picks a source per *sample slot*; slots are cut into
  planning chunks of ``CHUNK_BATCHES * batch_size`` and each chunk is planned like one source's
  chunk, so batches mix sources while bucketing (by resolution, length or shape, which compare
  across sources) and packing still hold within every batch. A source's cursor counts samples of its
  epoch order, so each source still delivers each of its samples once per epoch of it.
- ``rank_steps``: rank r of W takes j = p + r, p + r + W, ... from the restored position p (and a
  DataLoader worker k of K every K-th of those), each with the position after the whole global step,
  so every rank that checkpoints after the same step writes the same state. Under a model-parallel
  layout W and r are the data-parallel size and index (``dsbuild.loader.parallel``); ``balance_steps``
  deals a global step's samples anew among them (an order option: a pure function of the step).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from dsbuild.core.errors import UsageError
from dsbuild.loader.mixture import schedule
from dsbuild.loader.parallel import balance
from dsbuild.loader.plan import Batch, PlanSpec, plan_chunk, rank_batch_ids

SCHEDULE_BLOCK = 1024  # mixing decisions computed per vectorised call


class SampleRef(NamedTuple):
    source: int
    epoch: int
    index: int  # type: ignore[assignment]  # sample index in the source (shadows tuple.index; read by that name)


Item = tuple[SampleRef, ...]  # one sample, or several packed together


@dataclass(frozen=True, slots=True)
class Position:
    """``step`` global batches consumed; per source (epoch, next batch or sample); for mix="sample",
    ``inner`` batches of the current planning chunk consumed (the cursors are at the chunk's start)."""

    step: int
    cursors: tuple[tuple[int, int], ...]
    inner: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    """Global batch ``j``: batch ``batch`` of ``source``'s epoch ``epoch`` (mix="batch"), or its planned
    ``items`` (mix="sample"). ``after`` is the position once it is consumed."""

    j: int
    after: Position
    source: int | None = None
    epoch: int | None = None
    batch: int | None = None
    items: tuple[Item, ...] | None = None


@dataclass(frozen=True, slots=True)
class End:
    """The walk ends (a source ran out under ``stop``); ``at`` is where every rank moves to; ``last``, the
    position after the walk's last step (given by a walk that leaves steps out: ``walk_batches(keep=)``)."""

    at: Position
    last: Position | None = None


class Plan(Protocol):
    """What a walk needs of one source's epoch plan (``dsbuild.loader.epoch.EpochPlan``)."""

    n: int
    bucket_keys: np.ndarray | None
    lengths: np.ndarray | None
    spec: PlanSpec

    def batches_in_epoch(self, epoch: int) -> int: ...
    def batch(self, epoch: int, b: int) -> Batch: ...
    def order(self, epoch: int, start: int, count: int) -> np.ndarray: ...


def walk_batches(
    start: Position,
    plans: Sequence[Plan],
    weights: np.ndarray,
    seed: int,
    stop: bool,
    keep: Callable[[int], bool] | None = None,
) -> Iterator[Step | End]:
    """mix="batch": each global batch is one batch of one source's epoch plan. ``keep(j)`` (``rank_keep``):
    only those steps are yielded (the others are walked, not built: at W = 4,096 a rank needs 2 of every
    4,096)."""
    cursors = list(start.cursors)
    j = start.step
    while True:
        for src in schedule(weights, seed, j, SCHEDULE_BLOCK).tolist():
            epoch, b = cursors[src]
            if b >= plans[src].batches_in_epoch(epoch):
                if stop:
                    last = Position(j, tuple(cursors))
                    cursors[src] = (epoch + 1, 0)
                    yield End(Position(j, tuple(cursors)), last)
                    return
                epoch, b = epoch + 1, 0
            cursors[src] = (epoch, b + 1)
            if keep is None or keep(j):
                yield Step(j, Position(j + 1, tuple(cursors)), source=src, epoch=epoch, batch=b)
            j += 1


def sample_chunk(
    cursors: Sequence[tuple[int, int]], plans: Sequence[Plan], weights: np.ndarray, seed: int, stop: bool, size: int
) -> tuple[list[SampleRef], tuple[tuple[int, int], ...], int | None]:
    """The next ``size`` sample slots from ``cursors``: (refs, cursors after them, stopper).

    Slot s (counted over the whole stream: the sum of every source's consumed samples) goes to source
    ``schedule(s)``; a source's k-th use is position at + k of its epoch order (rolling into its next
    epoch). Under ``stop`` the chunk ends before the first slot that would start a new epoch of any
    source: ``stopper`` is that source (None if the chunk is whole), and its cursor stays at the end of
    its epoch, so a walk restored after the chunk stops at once, as the uninterrupted one does."""
    slot = sum(e * plans[s].n + a for s, (e, a) in enumerate(cursors))
    srcs = schedule(weights, seed, slot, size)
    end = size
    if stop:
        for s, (_, a) in enumerate(cursors):
            uses = np.flatnonzero(srcs == s)
            left = plans[s].n - a
            if len(uses) > left:
                end = min(end, int(uses[left]))
        srcs = srcs[:end]
    refs: list[SampleRef | None] = [None] * len(srcs)
    after = list(cursors)
    for s, (e, a) in enumerate(cursors):
        uses = np.flatnonzero(srcs == s)
        if not len(uses):
            continue
        n = plans[s].n
        g = e * n + a + np.arange(len(uses))
        epochs, pos = g // n, g % n
        for ep in np.unique(epochs).tolist():
            sel = epochs == ep
            p = pos[sel]
            idx = plans[s].order(ep, int(p[0]), len(p))
            for slot_k, i in zip(uses[sel].tolist(), idx.tolist()):
                refs[slot_k] = SampleRef(s, ep, i)
        total = e * n + a + len(uses)
        after[s] = (e, a + len(uses)) if stop else (total // n, total % n)
    stopper = int(schedule(weights, seed, slot + end, 1)[0]) if end < size else None
    return refs, tuple(after), stopper  # type: ignore[return-value]


def walk_samples(
    start: Position, plans: Sequence[Plan], weights: np.ndarray, seed: int, stop: bool, spec: PlanSpec
) -> Iterator[Step | End]:
    """mix="sample": batches planned over chunks of the interleaved sample stream."""
    cursors, j, inner = start.cursors, start.step, start.inner
    while True:
        refs, after, stopper, batches = sample_chunk_batches(cursors, plans, weights, seed, stop, spec)
        for k in range(inner, len(batches)):
            last = k == len(batches) - 1
            pos = Position(j + 1, after) if last else Position(j + 1, cursors, k + 1)
            yield Step(j, pos, items=tuple(tuple(refs[p] for p in item) for item in batches[k]))
            j += 1
        if stopper is not None:  # every rank moves past the end: that source's next epoch
            rolled = list(after)
            rolled[stopper] = (after[stopper][0] + 1, 0)
            yield End(Position(j, tuple(rolled)))
            return
        cursors, inner = after, 0


def sample_chunk_batches(
    cursors: tuple[tuple[int, int], ...],
    plans: Sequence[Plan],
    weights: np.ndarray,
    seed: int,
    stop: bool,
    spec: PlanSpec,
) -> tuple[list[SampleRef], tuple, int | None, list]:
    """mix="sample": the planning chunk at ``cursors`` (``sample_chunk``: its samples, the cursors after
    it, the source that ended in it) and its batches."""
    refs, after, stopper = sample_chunk(cursors, plans, weights, seed, stop, spec.chunk)
    keys = _column(refs, plans, "bucket_keys")
    lengths = _column(refs, plans, "lengths")
    return refs, after, stopper, plan_chunk(np.arange(len(refs)), spec, keys, lengths) if refs else []


def _column(refs: list[SampleRef], plans: Sequence[Plan], name: str) -> np.ndarray | None:
    cols = [getattr(p, name) for p in plans]
    if any(c is None for c in cols) or not refs:
        return None
    return np.array([cols[r.source][r.index] for r in refs], dtype=np.int64)


def step_items(step: Step, plans: Sequence[Plan]) -> tuple[Item, ...]:
    """The samples of a step's batch, item by item."""
    if step.items is not None:
        return step.items
    if step.source is None or step.epoch is None or step.batch is None:
        raise UsageError(f"step {step.j} names neither its items nor a source's batch")
    return tuple(
        tuple(SampleRef(step.source, step.epoch, i) for i in item)
        for item in plans[step.source].batch(step.epoch, step.batch)
    )


def rank_keep(start: int, world: int, rank: int, worker: int = 0, workers: int = 1) -> Callable[[int], bool]:
    """The steps ``rank_steps`` needs of a walk without ``regroup``: this rank's (and worker's), and the last
    of every global step (its position after)."""
    mine = rank_batch_ids(start, sys.maxsize, world, rank, worker, workers)
    return lambda j: j in mine or (j - start) % world == world - 1


def rank_steps(
    walk: Iterator[Step | End],
    start: int,
    world: int,
    rank: int,
    worker: int = 0,
    workers: int = 1,
    regroup: Callable[[list[Step], int], Step] | None = None,
) -> Iterator[tuple[Step | None, Position]]:
    """This rank's (and worker's) steps of ``walk`` (which starts at global batch ``start``), each with
    the position after its whole global step. If the walk ends, a last ``(None, end position)`` follows.
    A walk that ends mid-step gives its steps there the position after the walk's last step: the same
    position the last batch of an epoch has at any world size (the end position would have moved a
    checkpoint taken after it into the next epoch only where the epoch's batches are not a multiple of
    the world size). ``regroup(group, r)`` (``balance_steps``) deals each global step's samples to its
    ranks anew and gives rank r's batch of them (it needs every step of the walk; without it the walk
    may hold only the steps ``rank_keep`` names)."""
    mine = rank_batch_ids(start, sys.maxsize, world, rank, worker, workers)
    held: Step | None = None
    after: Position | None = None
    group: list[Step] = []
    for item in walk:
        if isinstance(item, End):
            if regroup is not None and len(group) > rank and group[rank].j in mine:
                held = regroup(group, rank)
            if held is not None:
                yield held, item.last or after  # type: ignore[misc]
            yield None, item.at
            return
        after = item.after
        if regroup is not None:
            group.append(item)
        elif item.j in mine:
            held = item
        if (item.j - start) % world == world - 1:
            if regroup is not None and group[rank].j in mine:
                held = regroup(group, rank)
            group = []
            if held is not None:
                yield held, item.after
            held = None


def _group_work(group: list[Step], plans: Sequence[Plan]) -> tuple[list, np.ndarray]:
    """Each step's items as the plan holds them (tuples of sample indices of ``step.source``, rows of an
    index array for a plain plan, or tuples of SampleRefs for mix="sample") and every item's work, in
    step order: its samples' delivered frames (``Plan.lengths``; none: 1 a sample). Made in numpy,
    without a SampleRef per sample: a balanced step weighs every DP rank's items, and a plain plan's run
    of consecutive batches is one ``Plan.order`` call, not a planned chunk per 64 batches."""
    per: list = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (source, index) a sample; samples an item
    k = 0
    while k < len(group):
        step, e = group[k], k + 1
        if step.items is not None:
            per.append(list(step.items))
            refs = np.array([(r.source, r.index) for item in step.items for r in item], np.int64).reshape(-1, 2)
            parts.append((refs[:, 0], refs[:, 1], np.array([len(item) for item in step.items], np.int64)))
            k = e
            continue
        source, epoch, b = int(step.source), int(step.epoch), int(step.batch)  # type: ignore[arg-type]  # (mix="batch")
        plan = plans[source]
        if plan.spec.simple:  # a run of consecutive batches of the source's epoch, one sample an item
            while e < len(group) and (group[e].source, group[e].epoch, group[e].batch) == (source, epoch, b + e - k):
                e += 1
            size = plan.spec.batch_size
            idx = plan.order(epoch, b * size, (e - k) * size)
            per.extend(idx[i : i + size, None] for i in range(0, len(idx), size))
            counts = np.ones(len(idx), np.int64)
        else:
            per.append(plan.batch(epoch, b))
            idx = np.array([i for item in per[-1] for i in item], np.int64)
            counts = np.array([len(item) for item in per[-1]], np.int64)
        parts.append((np.full(len(idx), source), idx, counts))
        k = e
    src, idx, sizes = (np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(3))
    frames = np.ones(len(idx), np.int64)
    for s, plan in enumerate(plans):
        mine = src == s
        if plan.lengths is not None and mine.any():
            frames[mine] = plan.lengths[idx[mine]]
    return per, np.bincount(np.repeat(np.arange(len(sizes)), sizes), frames, len(sizes)).astype(np.int64)


def balance_steps(
    group: list[Step], plans: Sequence[Plan], pack_frames: int | None, rank: int
) -> tuple[Step, np.ndarray, np.ndarray]:
    """Batch ``rank`` of one global step once the step's items are dealt anew (``parallel.balance``): each
    batch keeps its item count, the work per batch (frames, at most ``pack_frames`` an item) as even as
    the greedy deal makes it; items keep their order in the step. Also every batch's work as drawn and as
    dealt (the same on every rank)."""
    per, work = _group_work(group, plans)
    sizes = [len(items) for items in per]
    if pack_frames is not None:
        work = np.minimum(work, pack_frames)
    owner = balance(work, sizes)
    ends = np.cumsum(sizes)
    mine = []
    for p in np.flatnonzero(owner == rank).tolist():
        k = int(np.searchsorted(ends, p, side="right"))
        item = per[k][p - (int(ends[k - 1]) if k else 0)]
        step = group[k]
        mine.append(item if step.items is not None else tuple(SampleRef(step.source, step.epoch, int(i)) for i in item))  # type: ignore[arg-type]
    drawn = np.repeat(np.arange(len(per)), sizes)
    dealt = Step(group[rank].j, group[rank].after, items=tuple(mine))
    return dealt, np.bincount(drawn, work, len(per)), np.bincount(owner, work, len(per))

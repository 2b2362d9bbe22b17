"""Pure batch planning over the epoch order, chunk by chunk.

The epoch order is cut into chunks of ``CHUNK_BATCHES * batch_size`` samples. Each chunk is planned on
its own, so the plan of any chunk is a pure function of (order, bucket keys, lengths) and resuming
never replays the epoch. Within a chunk:
  - plain: consecutive samples form batches (the last batch of the epoch may be short);
  - bucketing: samples are grouped by bucket key (e.g. resolution) so no batch mixes shapes; a
    bucket's leftover samples form a smaller batch rather than being dropped or mixed;
  - packing: samples are packed first-fit into items of at most ``pack_frames`` frames, within bucket;
    a batch holds ``batch_size`` packed items.
Batches keep the order of their first sample, so the shuffle's randomness survives bucketing.
A batch is a list of items; an item is a tuple of sample indices (one sample unless packing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsbuild.core.errors import UsageError

CHUNK_BATCHES = 64  # planning window: bounds the memory of a plan and the cost of a resume

Batch = list[tuple[int, ...]]


@dataclass(frozen=True)
class PlanSpec:
    batch_size: int
    bucketed: bool = False
    pack_frames: int | None = None

    @property
    def chunk(self) -> int:
        return CHUNK_BATCHES * self.batch_size

    @property
    def simple(self) -> bool:
        return not self.bucketed and self.pack_frames is None


def first_fit(lengths: list[int], budget: int) -> list[list[int]]:
    """Positions packed into bins of at most ``budget`` (first fit, in order). An item longer than the
    budget gets a bin of its own (the caller truncates it and counts it)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for pos, n in enumerate(lengths):
        n = min(n, budget)
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(pos)
                room[b] -= n
                break
        else:
            bins.append([pos])
            room.append(budget - n)
    return bins


def plan_chunk(
    indices: np.ndarray, spec: PlanSpec, keys: np.ndarray | None = None, lengths: np.ndarray | None = None
) -> list[Batch]:
    """Batches of one chunk of the epoch order (``indices``), following ``spec``."""
    if spec.simple:
        return [[(int(i),) for i in indices[s : s + spec.batch_size]] for s in range(0, len(indices), spec.batch_size)]
    keys = np.zeros(len(indices), np.int64) if keys is None or not spec.bucketed else keys
    groups: list[tuple[int, Batch]] = []  # (position of first sample in chunk, batch)
    for k in np.unique(keys):
        pos = np.flatnonzero(keys == k)
        if spec.pack_frames:
            if lengths is None:
                raise UsageError("packing a chunk needs its samples' frame counts (lengths)")
            bins = first_fit([int(lengths[p]) for p in pos], spec.pack_frames)
            items = [(int(pos[b[0]]), tuple(int(indices[pos[j]]) for j in b)) for b in bins]
        else:
            items = [(int(p), (int(indices[p]),)) for p in pos]
        for s in range(0, len(items), spec.batch_size):
            part = items[s : s + spec.batch_size]
            groups.append((min(first for first, _ in part), [item for _, item in part]))
    groups.sort(key=lambda g: g[0])
    return [batch for _, batch in groups]


def chunk_batch_count(
    n_in_chunk: int,
    spec: PlanSpec,
    keys: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    indices: np.ndarray | None = None,
) -> int:
    """How many batches a chunk plans into (closed form unless packing)."""
    if spec.simple:
        return -(-n_in_chunk // spec.batch_size)
    if spec.pack_frames:
        if indices is None:
            raise UsageError("counting a packed chunk's batches needs its samples (indices)")
        return len(plan_chunk(indices, spec, keys, lengths))
    if not spec.bucketed:
        keys = np.zeros(n_in_chunk)
    elif keys is None:
        raise UsageError("counting a bucketed chunk's batches needs its samples' bucket keys")
    _, counts = np.unique(keys, return_counts=True)
    return int(np.sum(-(-counts // spec.batch_size)))


def rank_batch_ids(start: int, stop: int, world: int, rank: int, worker: int = 0, workers: int = 1) -> range:
    """Global batch ids that rank ``rank`` (and, within it, DataLoader worker ``worker``) handles in
    [start, stop): rank r takes start+r, start+r+W, ...; its workers take every K-th of those, so the
    rank's stream, read back round-robin over workers, does not depend on K."""
    first = start + rank + worker * world
    return range(first, stop, world * workers)

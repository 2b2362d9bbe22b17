"""One source's epochs as a sequence of planned batches, addressable by (epoch, batch index)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dsbuild.loader.permutation import block_order, derive_key, global_order
from dsbuild.loader.plan import CHUNK_BATCHES, Batch, PlanSpec, chunk_batch_count, plan_chunk


class EpochPlan:
    """Pure function of (seed, epoch, version, split, options) -> batches. Holds no per-sample table
    beyond the source's index columns; chunk plans are computed on demand and cached briefly."""

    def __init__(
        self,
        n: int,
        seed: int,
        identity: str,
        spec: PlanSpec,
        *,
        shuffle: str = "global",
        block: int = 256,
        window: int = 4,
        bucket_keys: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
    ):
        self.n, self.seed, self.identity, self.spec = n, seed, identity, spec
        self.shuffle, self.block, self.window = shuffle, block, window
        self.bucket_keys, self.lengths = bucket_keys, lengths
        self._chunk = lru_cache(maxsize=4)(self._plan_chunk)
        self._counts = lru_cache(maxsize=4)(self._chunk_counts)
        self._total = lru_cache(maxsize=4)(lambda epoch: int(self._counts(epoch).sum()))  # asked every batch

    def key(self, epoch: int) -> int:
        return derive_key(self.seed, epoch, self.identity)

    def order(self, epoch: int, start: int, count: int) -> np.ndarray:
        if self.shuffle == "none":
            return np.arange(start, min(self.n, start + count), dtype=np.int64)
        if self.shuffle == "blocks":
            return block_order(self.n, self.key(epoch), start, count, self.block, self.window)
        return global_order(self.n, self.key(epoch), start, count)

    def _indices(self, epoch: int, c: int) -> np.ndarray:
        return self.order(epoch, c * self.spec.chunk, self.spec.chunk)

    def _plan_chunk(self, epoch: int, c: int) -> list[Batch]:
        idx = self._indices(epoch, c)
        keys = self.bucket_keys[idx] if self.bucket_keys is not None else None
        lengths = self.lengths[idx] if self.lengths is not None else None
        return plan_chunk(idx, self.spec, keys, lengths)

    def _chunk_counts(self, epoch: int) -> np.ndarray:
        """Batches per chunk of an epoch (closed form for plain plans; one pass otherwise)."""
        n_chunks = -(-self.n // self.spec.chunk)
        if self.spec.simple:
            counts = np.full(n_chunks, CHUNK_BATCHES, dtype=np.int64)
            counts[-1] = -(-(self.n - (n_chunks - 1) * self.spec.chunk) // self.spec.batch_size)
            return counts
        out = []
        for c in range(n_chunks):
            idx = self._indices(epoch, c)
            keys = self.bucket_keys[idx] if self.bucket_keys is not None else None
            lengths = self.lengths[idx] if self.lengths is not None else None
            out.append(chunk_batch_count(len(idx), self.spec, keys, lengths, idx))
        return np.asarray(out, dtype=np.int64)

    def batches_in_epoch(self, epoch: int) -> int:
        return self._total(epoch)

    def batches_before(self, epoch: int, sample: int) -> int:
        """Batches of the epoch's chunks that end at or before epoch-order position ``sample`` (a chunk
        boundary: where mix="sample" keeps its cursor; the epoch's end closes its last, partial chunk)."""
        counts = self._counts(epoch)
        return int(counts.sum() if sample >= self.n else counts[: sample // self.spec.chunk].sum())

    def locate(self, epoch: int, b: int) -> tuple[int, int]:
        """(chunk, batch within chunk) of batch ``b`` of ``epoch``."""
        if self.spec.simple:
            return divmod(b, CHUNK_BATCHES)
        ends = np.cumsum(self._counts(epoch))
        c = int(np.searchsorted(ends, b, side="right"))
        return c, b - (int(ends[c - 1]) if c else 0)

    def batch(self, epoch: int, b: int) -> Batch:
        c, j = self.locate(epoch, b)
        return self._chunk(epoch, c)[j]

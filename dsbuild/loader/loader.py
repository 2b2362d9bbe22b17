"""The loader: deterministic, checkpointable, elastic delivery of batches from one or more sources.

Global batch j (counted across all ranks) is a pure function of (seed, version, split, options, j):
the mixing schedule names its source, the source's cursor names (epoch, batch), and the epoch plan
names its samples. Rank r of W takes j = g + r, g + r + W, ... from the restored position g, so a
checkpoint is just g and one cursor per source, and it restores under any world size or worker count.
Workers are threads: PyAV decoding, swscale and positional reads release the GIL, and batches need no
pickling between processes. (Inside a torch ``DataLoader``, see ``as_torch_dataset``.)
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dsbuild.core.errors import DsbuildError, FormatError, UsageError
from dsbuild.loader.collate import collate
from dsbuild.loader.decode import sample_arrays
from dsbuild.loader.device import Transfer, resolve_device
from dsbuild.loader.epoch import SHUFFLES, EpochPlan
from dsbuild.loader.mixture import POLICIES, normalise, schedule
from dsbuild.loader.permutation import derive_key, permute
from dsbuild.loader.plan import PlanSpec, rank_batch_ids
from dsbuild.loader.source import Source
from dsbuild.loader.state import LoaderState

BUCKETS = (None, "resolution", "length", "shape")
MAX_KEYS = 100  # offending keys kept in stats


@dataclass(frozen=True)
class LoaderOptions:
    seed: int = 0
    batch_size: int = 8
    shuffle: str = "global"  # global (keyed bijection), blocks (I/O locality), none
    block_size: int = 256  # blocks mode: consecutive samples per block (they share shards)
    block_window: int = 4  # blocks mode: blocks shuffled together
    rank: int = 0
    world_size: int = 1
    num_workers: int = 2  # decode threads
    prefetch: int = 4  # batches in flight: bounds memory
    decode: str = "frames"  # frames (uint8 arrays) or bytes (encoded video, for GPU decoders)
    frame_stride: int = 1
    resize: tuple[int, int] | None = None  # (height, width), via PyAV's swscale
    max_frames: int | None = None  # after stride; longer clips are cut (counted)
    bucket_by: str | None = None  # resolution, length or shape: a batch never mixes them
    pack_frames: int | None = None  # pack clips first-fit into this many frames per item
    device: str | None = None  # None: numpy; "cpu", "cuda", "auto": torch tensors
    verify: bool = True  # check each sample's sha256 (catches bit flips; costs one hash pass)
    policy: str = "reepoch"  # a mixture source that runs out: start its next epoch, or stop
    max_replacements: int = 16  # corrupt-sample replacements tried before failing loudly

    def __post_init__(self) -> None:
        if self.shuffle not in SHUFFLES:
            raise UsageError(f"shuffle must be one of {SHUFFLES}, not {self.shuffle!r}")
        if self.bucket_by not in BUCKETS:
            raise UsageError(f"bucket_by must be one of {BUCKETS}, not {self.bucket_by!r}")
        if self.decode not in ("frames", "bytes"):
            raise UsageError(f"decode must be 'frames' or 'bytes', not {self.decode!r}")
        if self.policy not in POLICIES:
            raise UsageError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside world_size {self.world_size}")
        if self.batch_size < 1 or self.frame_stride < 1 or self.num_workers < 0 or self.prefetch < 1:
            raise UsageError("batch_size, frame_stride and prefetch must be >= 1, num_workers >= 0")
        if self.pack_frames is not None and self.decode != "frames":
            raise UsageError("pack_frames needs decode='frames'")


class Stats:
    """Counters and per-stage seconds (thread-safe). ``wait`` is time the consumer waited for data.

    ``threads`` attributes the same seconds (and batches) to the thread that recorded them: the loader's
    workers (``dsbuild-load_0``...) for read/decode/collate, the consumer's thread for wait/h2d."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"batches": 0, "samples": 0, "frames": 0, "padding_frames": 0, "truncated": 0,
                       "corrupt": 0, "bytes": 0}
        self.seconds = {"read": 0.0, "decode": 0.0, "collate": 0.0, "h2d": 0.0, "wait": 0.0}
        self.corrupt_keys: list[str] = []
        self.threads: dict[str, dict[str, float]] = {}

    def add(self, counts: dict | None = None, seconds: dict | None = None, corrupt: str | None = None) -> None:
        name = threading.current_thread().name
        with self._lock:
            for k, v in (counts or {}).items():
                self.counts[k] += v
            for k, v in (seconds or {}).items():
                self.seconds[k] += v
            if seconds or (counts and "batches" in counts):
                mine = self.threads.setdefault(name, {})
                for k, v in (seconds or {}).items():
                    mine[k] = mine.get(k, 0.0) + v
                if counts and "batches" in counts:
                    mine["batches"] = mine.get("batches", 0) + counts["batches"]
            if corrupt is not None:
                self.counts["corrupt"] += 1
                if len(self.corrupt_keys) < MAX_KEYS:
                    self.corrupt_keys.append(corrupt)

    def to_json(self) -> dict:
        with self._lock:
            total = self.counts["frames"] + self.counts["padding_frames"]
            return {**self.counts, "seconds": dict(self.seconds), "corrupt_keys": list(self.corrupt_keys),
                    "padding_fraction": self.counts["padding_frames"] / total if total else 0.0,
                    "threads": {name: dict(v) for name, v in sorted(self.threads.items())}}


def _bucket_keys(src: Source, bucket_by: str | None) -> np.ndarray | None:
    if bucket_by is None:
        return None
    if bucket_by == "resolution":
        return src.width.astype(np.int64) * 100_000 + src.height
    if bucket_by == "length":
        return src.frames.astype(np.int64)
    return (src.width.astype(np.int64) * 100_000 + src.height) * 1_000_000 + src.frames


class Mixture:
    """Batches from several sources by weight: ``Mixture([(ref, split, weight), ...], **options)``.

    Each batch comes from one source (so shapes and buckets stay consistent); which one is a
    deterministic low-discrepancy schedule of the weights. A source that runs out starts its next
    epoch (``policy="reepoch"``, iteration is then endless) or ends the mixture (``policy="stop"``).
    """

    def __init__(self, sources: list[tuple[str, str | None, float]], **options):
        self.options = LoaderOptions(**options)
        self._specs = [(ref, split) for ref, split, _ in sources]
        self.weights = normalise([w for _, _, w in sources])
        self._opened = False
        self._stats = Stats()

    # -- setup -----------------------------------------------------------------------------------
    def _open(self) -> None:
        if self._opened:
            return
        o = self.options
        self.sources = [Source(ref, split, verify=o.verify).open() for ref, split in self._specs]
        spec = PlanSpec(o.batch_size, bucketed=o.bucket_by is not None, pack_frames=o.pack_frames)
        self.plans = [
            EpochPlan(len(s), o.seed, f"{s.version_id}/{s.split or ''}", spec, shuffle=o.shuffle,
                      block=o.block_size, window=o.block_window, bucket_keys=_bucket_keys(s, o.bucket_by),
                      lengths=-(-s.frames // o.frame_stride))
            for s in self.sources
        ]
        if o.decode == "frames" and o.resize is None and o.bucket_by not in ("resolution", "shape"):
            shapes = {(int(w), int(h)) for s in self.sources for w, h in set(zip(s.width, s.height))}
            if len(shapes) > 1:
                raise UsageError(f"the data has {len(shapes)} resolutions; batches of frames need "
                                 "bucket_by='resolution' or resize=(height, width)")
        self.position = 0
        self.cursors = [[0, 0] for _ in self.sources]
        self._device = resolve_device(o.device)
        self._transfer = Transfer(self._device) if self._device else None
        self._opened = True

    # -- checkpoints -----------------------------------------------------------------------------
    def _state(self, position: int, cursors: list[list[int]]) -> LoaderState:
        o = self.options
        return LoaderState(
            sources=[{**s.identity(), "weight": round(float(w), 12)} for s, w in zip(self.sources, self.weights)],
            seed=o.seed, shuffle=o.shuffle, batch_size=o.batch_size, bucket_by=o.bucket_by,
            pack_frames=o.pack_frames, policy=o.policy, position=position, cursors=[list(c) for c in cursors])

    def state_dict(self) -> dict:
        """Small, JSON-safe, O(sources): where the next global step starts."""
        self._open()
        return self._state(self.position, self.cursors).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume at exactly the next batch (any world size or worker count); refuses other settings."""
        self._open()
        theirs = LoaderState.from_dict(state)
        mine = self._state(theirs.position, theirs.cursors)
        mine.check_compatible(theirs)
        for plan, (epoch, b) in zip(self.plans, theirs.cursors):
            if b > plan.batches_in_epoch(epoch):
                raise UsageError(f"checkpoint cursor {b} is past the end of epoch {epoch}")
        self.position, self.cursors = theirs.position, [list(c) for c in theirs.cursors]

    # -- the global schedule -----------------------------------------------------------------------
    def _walk(self) -> Iterator[tuple[int, int, int, int, list[list[int]]]]:
        """(global batch j, source, epoch, batch in epoch, cursors after j) from the current position.

        Ends only where a source runs out and the policy says stop; ``self._end`` then holds the state
        every rank moves to (position at the boundary, that source rolled to its next epoch)."""
        cursors = [list(c) for c in self.cursors]
        j = self.position
        while True:
            for src in schedule(self.weights, self.options.seed, j, 1024):
                src = int(src)
                epoch, b = cursors[src]
                if b >= self.plans[src].batches_in_epoch(epoch):
                    if self._stops_at_rollover():
                        cursors[src] = [epoch + 1, 0]
                        self._end = (j, cursors)
                        return
                    epoch, b = epoch + 1, 0
                cursors[src] = [epoch, b + 1]
                yield j, src, epoch, b, cursors
                j += 1

    def _stops_at_rollover(self) -> bool:
        return self.options.policy == "stop"

    def my_batches(self, worker: int = 0, workers: int = 1) -> Iterator[tuple]:
        """This rank's (and worker's) batches: (j, source, epoch, batch, state after the step of j).

        The state after j is taken at the end of j's global step (all W ranks' batches), so every rank
        that checkpoints after the same step writes the same state."""
        o = self.options
        mine = rank_batch_ids(self.position, sys.maxsize, o.world_size, o.rank, worker, workers)
        held = None
        for j, src, epoch, b, cursors in self._walk():
            if j in mine:
                held = (j, src, epoch, b, j - o.rank + o.world_size)
            if held is not None and j == held[4] - 1:
                yield (*held[:4], (held[4], [list(c) for c in cursors]))
                held = None
        if held is not None:
            yield (*held[:4], (self._end[0], [list(c) for c in self._end[1]]))

    # -- loading ---------------------------------------------------------------------------------
    def _load_sample(self, src: int, epoch: int, s: int) -> dict:
        o, source, plan = self.options, self.sources[src], self.plans[src]
        tried = 0
        candidates = None
        original = s
        while True:
            t0 = time.perf_counter()
            try:
                raw = source.read(s)
                t1 = time.perf_counter()
                out = sample_arrays(raw, source.controls, source.channels, decode=o.decode, stride=o.frame_stride,
                                    size=o.resize, max_frames=o.max_frames)
                self._stats.add(seconds={"read": t1 - t0, "decode": time.perf_counter() - t1},
                               counts={"bytes": sum(len(v) for v in raw.members.values())})
                return out
            except (FormatError, OSError) as e:
                self._stats.add(corrupt=f"{source.keys[s]}: {e}")
            # Deterministic replacement: the same corrupt sample gets the same substitute on every rank.
            if candidates is None:
                keys = plan.bucket_keys
                candidates = (int(c) for c in permute(np.arange(len(source)), len(source),
                                                      derive_key(plan.key(epoch), "replace", original))
                              if keys is None or keys[c] == keys[original])
            tried += 1
            s = next(candidates, None)
            if s is None or tried > o.max_replacements:
                raise DsbuildError(f"{source.keys[original]}: corrupt, and {tried - 1} replacements failed too")

    def _build(self, src: int, epoch: int, b: int) -> dict:
        items = self.plans[src].batch(epoch, b)
        samples = [[self._load_sample(src, epoch, s) for s in item] for item in items]
        t0 = time.perf_counter()
        batch, counters = collate(samples, self.options.pack_frames)
        self._stats.add(counts={"batches": 1, "samples": sum(len(i) for i in items), "frames": counters["frames"],
                               "padding_frames": counters["padding"], "truncated": counters["truncated"]},
                       seconds={"collate": time.perf_counter() - t0})
        batch["source"] = src
        return batch

    def __iter__(self) -> Iterator[dict]:
        self._open()
        o = self.options
        pool = ThreadPoolExecutor(max_workers=max(1, o.num_workers), thread_name_prefix="dsbuild-load")
        pending: deque = deque()
        work = self.my_batches()
        try:
            while True:
                while len(pending) < o.prefetch:
                    item = next(work, None)
                    if item is None:
                        break
                    _, src, epoch, b, after = item
                    pending.append((pool.submit(self._build, src, epoch, b), after))
                if not pending:
                    break
                fut, (nxt, cursors) = pending.popleft()
                t0 = time.perf_counter()
                batch = fut.result()
                self._stats.add(seconds={"wait": time.perf_counter() - t0})
                if self._transfer is not None:
                    t1 = time.perf_counter()
                    batch = self._transfer(batch)
                    self._stats.add(seconds={"h2d": time.perf_counter() - t1})
                self.position, self.cursors = nxt, cursors
                yield batch
            self.position, self.cursors = self._end[0], [list(c) for c in self._end[1]]
        finally:
            for fut, _ in pending:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def state_after(self, batch: dict) -> dict:
        """The checkpoint to save after consuming ``batch`` from ``as_torch_dataset()`` in a DataLoader."""
        self._open()
        return self._state(int(batch["position"]), [list(c) for c in batch["cursors"]]).to_dict()

    def as_torch_dataset(self):
        """This loader as a torch IterableDataset (use ``DataLoader(ds, batch_size=None, num_workers=K)``)."""
        from dsbuild.loader.torch import TorchDataset

        return TorchDataset(self)

    def __getstate__(self) -> dict:
        """Picklable for DataLoader workers under spawn: settings and position only; reopened lazily."""
        return {"options": self.options, "_specs": self._specs, "weights": self.weights, "_opened": False,
                "_stats": None, "_resume": (getattr(self, "position", 0), getattr(self, "cursors", None))}

    def __setstate__(self, state: dict) -> None:
        resume = state.pop("_resume")
        self.__dict__.update(state)
        self._stats = Stats()
        self._open()
        if resume[1] is not None:
            self.position, self.cursors = resume

    def stats(self) -> dict:
        """Counts (batches, samples, frames, padding, truncated, corrupt + keys) and seconds per stage."""
        return self._stats.to_json()


class Loader(Mixture):
    """One source: ``Loader("catalog@v3", split="main/train", seed=17, batch_size=8, ...)``.

    ``for batch in loader`` delivers the rest of the current epoch; the next loop starts the next epoch.
    """

    def __init__(self, ref: str, split: str | None = None, **options):
        super().__init__([(ref, split, 1.0)], **options)

    def _stops_at_rollover(self) -> bool:
        return True

    @property
    def epoch(self) -> int:
        self._open()
        return self.cursors[0][0]

    def __len__(self) -> int:
        """Batches this rank gets in the current epoch from the current position."""
        self._open()
        epoch, b = self.cursors[0]
        remaining = self.plans[0].batches_in_epoch(epoch) - b
        o = self.options
        return max(0, -(-(remaining - o.rank) // o.world_size))

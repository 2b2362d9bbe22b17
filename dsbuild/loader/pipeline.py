"""The loader: deterministic, checkpointable, elastic delivery of batches from one or more sources.

Global batch j (counted across all ranks) is a pure function of (seed, versions, splits, order
options, j): ``dsbuild.loader.walk`` names its samples, rank r of W takes j = p + r, p + r + W, ...
from the restored position p. A checkpoint is p and one cursor per source, so it restores under any
world size or worker count. Workers are threads up to two (``worker_mode``; more are processes that
build whole batches into shared memory: ``dsbuild.loader.workers``): PyAV decoding, swscale, ``preadv`` and the hashes release
the GIL, and batches need no pickling; a batch that holds the GIL throughout (bytes from mapped shards)
is built by the consumer itself when it comes back sooner than a hand-off pays for (``pace``). Inside a torch ``DataLoader`` with process workers, each batch
crosses in shared memory (``as_torch_dataset``); for JAX, ``as_jax_iterator`` builds global arrays.

A damaged sample (hash mismatch, bad framing, undecodable video) is replaced by a substitute drawn
deterministically from the same source and bucket, so every rank makes the same choice; it is
counted and named in ``stats()``. An OS error (too many open files, permissions, a missing shard) is
never taken for damage: it stops the loader with a ``StorageError`` naming the fix.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from dsbuild.core.errors import CorruptDataError, FormatError, UsageError
from dsbuild.formats.sample import VIDEO_EXT
from dsbuild.loader.backends import choose_backend, probe
from dsbuild.loader.collate import collate, collate_clips, collate_spans
from dsbuild.loader.crop import cut_by_max_frames, kept_frames
from dsbuild.loader.device import Transfer, resolve_device
from dsbuild.loader.epoch import EpochPlan
from dsbuild.loader.files import ShardFiles
from dsbuild.loader.mixture import normalise, schedule_counts
from dsbuild.loader.options import LoaderOptions, order_options, with_overrides
from dsbuild.loader.pace import Pace
from dsbuild.loader.parallel import check_cp_lengths, cp_slice, spread, stage_fields
from dsbuild.loader.permutation import derive_key, permute
from dsbuild.loader.plan import PlanSpec
from dsbuild.loader.prepare import Preparer
from dsbuild.loader.read import VIDEO_SLOT, RawSample, SampleReader
from dsbuild.loader.source import Source
from dsbuild.loader.state import Cursor, LoaderState
from dsbuild.loader.stats import Stats
from dsbuild.loader.walk import (
    Position,
    SampleRef,
    Step,
    balance_steps,
    rank_keep,
    rank_steps,
    sample_chunk_batches,
    step_items,
    walk_batches,
    walk_samples,
)
from dsbuild.loader.workers import Job, ProcessWorkers, choose_mode

DRAWN_CHECK_MAX = 1 << 27  # draws of a restored mixture's schedule recounted (see ``_check_drawn``)


class _Process:
    """Which process this is: ``generation`` is bumped in every forked child, where readers and threads
    must be made anew (``os.getpid`` is a system call each time, and the loader asks several times a
    batch)."""

    generation = 0

    @staticmethod
    def forked() -> None:
        _Process.generation += 1


os.register_at_fork(after_in_child=_Process.forked)


def _bucket_keys(src: Source, bucket_by: str | None) -> np.ndarray | None:
    if bucket_by is None:
        return None
    resolution = src.width * 100_000 + src.height
    if bucket_by == "resolution":
        return resolution
    if bucket_by == "length":
        return src.frames.copy()
    return resolution * 1_000_000 + src.frames


def _union(names: list[tuple[str, ...]]) -> list[str]:
    out: dict[str, None] = {}
    for group in names:
        out.update(dict.fromkeys(group))
    return list(out)


@dataclass
class Ahead:
    """Batches under way for an iteration that starts at ``start``: ``(future, step, position after)`` in
    order, and the steps after them, submitted in process generation ``born`` (``_Process``)."""

    start: Position
    pending: deque
    work: Iterator[tuple[Step | None, Position]]
    born: int = field(default_factory=lambda: _Process.generation)

    def fill(self, submit: Callable, room: int) -> None:
        while len(self.pending) < room:
            # (an Ahead starts at a stream's end, so its work is read: it ends with (None, its end))
            step, after = next(self.work)
            if step is None:  # the stream ends within the read-ahead: keep its end for the iteration
                self.work = iter([(None, after)])
                return
            self.pending.append((submit(step), step, after))

    def cancel(self) -> None:
        cancel(self.pending, self.born)


def cancel(pending: deque, born: int) -> None:
    """Cancel the ``(future, step, position)`` builds, submitted in process generation ``born``, that have
    not started; wait for those in worker threads that have (no build outlives its iteration), except in
    a child forked since (its copies of them never end: the threads that would end them stay the
    parent's). A build in a worker process is not waited for (``workers.Job``): garbage collection may
    finalize a loop inside the collection that alone resolves it. A future of None: a batch left for the
    consumer to build."""
    started = [fut for fut, _, _ in pending if fut is not None and not fut.cancel()]
    if born == _Process.generation:
        wait([fut for fut in started if not isinstance(fut, Job)])
    pending.clear()


class Mixture:
    """Batches from several sources by weight: ``Mixture([(ref, split, weight), ...], per="batch", ...)``.

    ``per="batch"``: each batch comes from one source (shapes and buckets stay per source); which one is
    a deterministic low-discrepancy schedule of the weights. ``per="sample"``: sources mix within
    batches (bucketing and packing then group samples of any source by resolution/length). A source
    that runs out starts its next epoch (``policy="reepoch"``, endless) or ends the mixture
    (``policy="stop"``). Options are ``LoaderOptions`` fields (``options=`` and/or keywords).
    """

    def __init__(
        self,
        sources: list[tuple[str, str | None, float]],
        options: LoaderOptions | None = None,
        *,
        per: str | None = None,
        **overrides: Any,
    ):
        if per is not None:
            overrides["mix"] = per
        self.options = with_overrides(options, overrides)
        self._specs = [(str(ref), split) for ref, split, _ in sources]
        self.weights = normalise([w for _, _, w in sources])
        self._opened = False
        self._fixed_state: bytes | None = None  # (``state_at``)
        self._stats = Stats()
        self._io_process: int | None = None
        self._io_lock = threading.Lock()
        # processes that decode at once beside this one (``probe.decoder_threads``): its worker processes'
        # count, or a torch DataLoader's workers when it runs in one (``torch.Batches``); None: its own
        self._decoding_processes: int | None = None
        self._pool_process: int | None = None
        self._ahead: Ahead | None = None
        self._held = _Held()
        self._generation = 0  # bumped by load_state_dict and by every new loop
        self._moved: list[weakref.WeakMethod] = []  # told where load_state_dict moves it (``on_move``)
        weakref.finalize(self, self._held.release)  # a loader simply dropped releases its files too

    @classmethod
    def from_description(cls, sources: list[tuple[str, str | None, float]], options: LoaderOptions) -> Mixture:
        """The mixture a worker process rebuilds from its JSON description (``description.rebuild``)."""
        mixture = cls(sources, options)
        mixture.weights = np.array([w for _, _, w in sources])  # as given: normalised twice may differ in an ulp
        return mixture

    def _stops(self) -> bool:
        return self.options.policy == "stop"

    # -- setup (not in the constructor: constructors only store) -------------------------------------
    def open(self) -> Mixture:
        """Open the sources (their proven indexes) and plan; idempotent, and done lazily by every method."""
        if self._opened:
            return self
        o = self.options
        self.sources = [Source(ref, split).open() for ref, split in self._specs]
        for s in self.sources:
            self._stats.proof("indexes_known" if s.from_cache else "indexes_read")
        self.controls = _union([s.controls for src in self.sources for s in src.sessions])
        self.channels = _union([s.channels for src in self.sources for s in src.sessions])
        self.spec = PlanSpec(o.batch_size, bucketed=o.bucket_by is not None, pack_frames=o.pack_frames)
        self.plans = [
            EpochPlan(
                len(s),
                o.seed,
                f"{s.version_id}/{s.split or ''}",
                self.spec,
                shuffle=o.shuffle,
                block=o.block_size,
                window=o.block_window,
                bucket_keys=_bucket_keys(s, o.bucket_by),
                lengths=kept_frames(s.frames, o.frame_stride, o.clip_frames, o.max_frames),
            )
            for s in self.sources
        ]
        if o.decode == "frames" and o.resize is None and o.bucket_by not in ("resolution", "shape"):
            shapes = {(int(w), int(h)) for s in self.sources for w, h in set(zip(s.width, s.height))}
            if len(shapes) > 1:
                raise UsageError(
                    f"the data has {len(shapes)} resolutions; batches of frames need one",
                    hint="use bucket_by='resolution' or resize=(height, width)",
                )
        if o.audio and o.pack_frames:
            raise UsageError("audio=True with pack_frames is not supported", hint="drop one of them")
        self.coords = o.layout.coords(o.rank, o.world_size)
        for s in self.sources:
            lengths = kept_frames(s.frames, o.frame_stride, o.clip_frames, o.max_frames)
            check_cp_lengths(lengths, s.keys, self.coords.cp_size, o.pack_frames)
        self._spread: dict[str, float] = {"steps": 0, "drawn": 0.0, "dealt": 0.0}
        self.position = Position(0, tuple((0, 0) for _ in self.sources))
        self._device, note = resolve_device(o.device)
        self._stats.note(note)
        self._transfer = Transfer(self._device) if self._device else None
        self._pace = Pace(gil_bound=o.plain and o.mapped)
        cuda, installed = probe() if o.decode_backend != "pyav" else (False, frozenset())
        self.backend = choose_backend(o.decode_backend, cuda=cuda, installed=installed)
        if o.decode_backend != "pyav":
            self._stats.note(self.backend.note)
        if self.backend.name == "nvdec" and o.worker_mode == "process":
            raise UsageError(
                "worker_mode='process' cannot carry the frames of decode_backend='nvdec': they stay in device "
                "memory, and worker processes hand batches over in host shared memory",
                hint="use worker_mode='thread' or 'auto' (threads with nvdec)",
            )
        self._opened = True
        return self

    def _io(self) -> tuple[list[SampleReader], Preparer]:
        """Per-process readers (open files, buffer pools): a forked worker makes its own. Made once, under a
        lock: worker threads that each made their own would each parse sessions' JSON into a preparer the
        next call no longer returns (a batch's codec tags came out None)."""
        if self._io_process != _Process.generation:
            with self._io_lock:
                if self._io_process != _Process.generation:
                    o = self.options
                    files = [
                        ShardFiles(s.catalog, s.shards, s.format, o.max_open_shards, o.verify == "shard", self._stats)
                        for s in self.sources
                    ]
                    self._held.files = files
                    self._readers = [SampleReader(s, f, o.verify_level, o.mapped) for s, f in zip(self.sources, files)]
                    self._preparer = Preparer(
                        o,
                        self.sources,
                        self.controls,
                        self.channels,
                        self.backend,
                        self._stats,
                        self._readers,
                        self.coords.fields,
                        self._decoding_processes or (o.num_workers if choose_mode(o)[0] == "process" else 1),
                    )
                    self._io_process = _Process.generation
        return self._readers, self._preparer

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_at(self, p: Position) -> dict:
        """The checkpoint of position ``p`` (as ``steps`` gives them), JSON-ready: ``_state(p).to_json()``,
        made from the JSON of its fields that do not move, kept from the first call (a DataLoader worker
        asks for one every batch: the whole record cost 20 us, a tenth of a small batch's build)."""
        self.open()
        if self._fixed_state is None:
            self._fixed_state = orjson.dumps(self._state(Position(0, ((0, 0),) * len(self.sources))).to_json())
        return {
            **orjson.loads(self._fixed_state),  # (a fresh copy: a caller may keep or change what it gets)
            "position": p.step,
            "cursors": [Cursor(e, a).to_json() for e, a in p.cursors],
            "inner": p.inner,
        }

    def _state(self, p: Position) -> LoaderState:
        return LoaderState(
            sources=tuple(s.identity(w) for s, w in zip(self.sources, self.weights)),
            order=order_options(self.options),
            position=p.step,
            cursors=tuple(Cursor(e, a) for e, a in p.cursors),
            inner=p.inner,
            layout=self.options.layout.to_json(self.options.world_size),
        )

    def state_dict(self) -> dict:
        """Small, JSON-safe, O(sources): where the next global step starts."""
        self.open()
        return self._state(self.position).to_json()

    def load_state_dict(self, state: dict) -> None:
        """Resume at exactly the next batch (any world size or worker count); refuses other data or order."""
        self.open()
        theirs = LoaderState.from_json(state, "loader checkpoint")
        mine = self._state(Position(theirs.position, tuple((c.epoch, c.at) for c in theirs.cursors)))
        mine.check_compatible(theirs)
        for k, (plan, c) in enumerate(zip(self.plans, theirs.cursors)):
            limit = plan.n if self.options.mix == "sample" else plan.batches_in_epoch(c.epoch)
            if c.at > limit:
                raise FormatError(
                    f"loader checkpoint: cursors[{k}].at = {c.at} is past the end of epoch {c.epoch} ({limit})"
                )
        self._check_drawn(theirs)
        if theirs.inner:  # batches of the planning chunk at the cursors consumed (mix="sample" only)
            cursors = tuple((c.epoch, c.at) for c in theirs.cursors)
            chunk = (
                []
                if self.options.mix == "batch"
                else sample_chunk_batches(
                    cursors, self.plans, self.weights, self.options.seed, self._stops(), self.spec
                )[3]
            )
            if theirs.inner >= len(chunk):
                raise FormatError(
                    f"loader checkpoint: inner = {theirs.inner}, but the planning chunk there has "
                    f"{len(chunk)} batch(es) (mix={self.options.mix})"
                )
        self.position = Position(theirs.position, tuple((c.epoch, c.at) for c in theirs.cursors), theirs.inner)
        self._generation += 1  # a loop running now goes on from here (see ``__iter__``)
        for tell in [m() for m in self._moved]:
            if tell is not None:
                tell(self.position)

    def on_move(self, tell) -> None:
        """Call the bound method ``tell(position)`` whenever ``load_state_dict`` moves this loader (held
        weakly: a torch dataset's pass file, which persistent workers read where their copies stand still)."""
        self._moved.append(weakref.WeakMethod(tell))

    def _check_drawn(self, theirs: LoaderState) -> None:
        """What the schedule drew must be what the cursors say each source gave (an edited checkpoint would
        deal the next batches or samples to other sources than the run did). mix="sample": the first
        sum(epoch x samples + at) slots, per source. mix="batch": the ``position`` global batches, which
        the cursors must also account for, where an epoch's batch count is closed form (plain batches;
        bucketed or packed epochs would be planned one by one). The schedule is recounted up to
        ``DRAWN_CHECK_MAX`` draws (~5 s)."""
        cursors = theirs.cursors
        if self.options.mix == "sample":
            gave, what = [p.n * c.epoch + c.at for p, c in zip(self.plans, cursors)], "samples"
        elif all(p.spec.simple for p in self.plans):
            gave, what = [p.batches_in_epoch(0) * c.epoch + c.at for p, c in zip(self.plans, cursors)], "batches"
            if sum(gave) != theirs.position:
                raise FormatError(
                    f"loader checkpoint: position = {theirs.position}, but the cursors say the "
                    f"sources gave {sum(gave)} batches ({gave})"
                )
        else:
            return
        if len(gave) < 2 or sum(gave) > DRAWN_CHECK_MAX:
            return
        drawn = schedule_counts(self.weights, self.options.seed, sum(gave))
        if drawn != gave:
            raise FormatError(
                f"loader checkpoint: the mixture's first {sum(gave)} {what} draw {drawn} from the "
                f"sources, but the cursors say they gave {gave}"
            )

    def state_after(self, batch: dict) -> dict:
        """The checkpoint to save after consuming ``batch`` from ``as_torch_dataset()`` or ``as_jax_iterator``."""
        if "state" not in batch:
            raise UsageError(
                "this batch carries no checkpoint: batches of `for batch in loader` are checkpointed "
                "by loader.state_dict() after each",
                hint="state_after is for batches of as_torch_dataset() and as_jax_iterator()",
            )
        return batch["state"]

    # -- the global stream ---------------------------------------------------------------------------
    def steps(
        self, worker: int = 0, workers: int = 1, start: Position | None = None
    ) -> Iterator[tuple[Step | None, Position]]:
        """This rank's (and DataLoader worker's) steps from ``start`` (default: the current position), each
        with the position after its global step; a last ``(None, end)`` if the stream ends (see
        ``walk.rank_steps``). Under a model-parallel layout the ranks are the data-parallel ones; a middle
        pipeline stage has no steps (it reads nothing)."""
        self.open()
        o, start, at = self.options, start or self.position, self.coords
        if not at.reads:
            return iter(())
        if o.mix == "sample":
            walk = walk_samples(start, self.plans, self.weights, o.seed, self._stops(), self.spec)
        else:  # (balance deals every rank's batches: it walks them all)
            keep = rank_keep(start.step, at.dp_size, at.dp, worker, workers) if o.balance is None else None
            walk = walk_batches(start, self.plans, self.weights, o.seed, self._stops(), keep)
        regroup = None if o.balance is None else self._balanced
        return rank_steps(walk, start.step, at.dp_size, at.dp, worker, workers, regroup)

    def _balanced(self, group: list[Step], rank: int) -> Step:
        """``walk.balance_steps``, with the per-rank work spread of each step as drawn and as dealt."""
        step, drawn, dealt = balance_steps(group, self.plans, self.options.pack_frames, rank)
        self._spread["steps"] += 1
        self._spread["drawn"] += spread(drawn)["max_over_mean"]
        self._spread["dealt"] += spread(dealt)["max_over_mean"]
        return step

    # -- loading -------------------------------------------------------------------------------------
    def _read(self, refs: list[SampleRef]) -> list:
        """The samples at ``refs`` read (a damaged one as its FormatError)."""
        readers, _ = self._io()
        sources = {r.source for r in refs}
        if len(sources) == 1:
            return readers[refs[0].source].read([r.index for r in refs])
        raws: list = [None] * len(refs)
        for src in sources:
            pos = [k for k, r in enumerate(refs) if r.source == src]
            for k, raw in zip(pos, readers[src].read([refs[k].index for k in pos])):
                raws[k] = raw
        return raws

    def _load(self, refs: list[SampleRef], raws: list, into: list | None = None) -> list[tuple[SampleRef, dict, tuple]]:
        """The samples at ``refs``, read as ``raws``, prepared; ``into[k]`` (if given) is where sample k's
        frames go."""
        _, prepare = self._io()
        t1 = time.perf_counter()
        out = []
        for k, (ref, raw) in enumerate(zip(refs, raws)):
            row = into[k] if into else None
            if not isinstance(raw, FormatError):
                try:
                    out.append((ref, *prepare(ref.source, raw, ref.epoch, row)))
                    continue
                except FormatError as e:
                    raw = e
            out.append(self._substitute(ref, raw, row))
        self._stats.add(
            seconds={"decode": time.perf_counter() - t1}, counts={"bytes": self._bytes([r for r, _, _ in out])}
        )
        return out

    def _bytes(self, refs: list[SampleRef]) -> int:
        return int(sum(self.sources[r.source].sample_bytes[r.index] for r in refs))

    def _substitute(self, ref: SampleRef, damage: FormatError, into=None) -> tuple[SampleRef, dict, tuple]:
        """The deterministic substitute of the damaged sample at ``ref``, prepared."""
        readers, prepare = self._io()
        o, plan, source = self.options, self.plans[ref.source], self.sources[ref.source]
        candidates = None
        tried = 0
        raw: RawSample | FormatError = damage
        while True:
            if not isinstance(raw, FormatError):
                try:
                    sample, cmap = prepare(ref.source, raw, ref.epoch, into)
                    return ref, sample, cmap
                except FormatError as e:
                    raw = e
            key = source.keys[ref.index]  # (most errors already name the sample: not twice)
            self._stats.add(corrupt=str(raw) if str(raw).startswith(f"{key}: ") else f"{key}: {raw}")
            if candidates is None:  # the same substitutes on every rank: keyed by (epoch key, sample)
                keys = plan.bucket_keys
                original = ref.index
                candidates = (
                    int(c)
                    for c in permute(
                        np.arange(len(source)), len(source), derive_key(plan.key(ref.epoch), "replace", original)
                    )
                    if keys is None or keys[c] == keys[original]
                )
            tried += 1
            nxt = next(candidates, None)
            if nxt is None or tried > o.max_replacements:
                raise CorruptDataError(
                    f"{source.keys[original]}: damaged, and {tried - 1} substitute(s) were damaged too",
                    hint="run `dsbuild verify` on the version",
                )
            ref = SampleRef(ref.source, ref.epoch, nxt)
            raw = readers[ref.source].read([nxt])[0]

    def build(self, step: Step) -> dict:
        """The batch of ``step`` (its arrays in reused memory; see ``collate``), with its samples' metadata."""
        self.open()
        t0 = time.perf_counter()
        batch = self._build(step)
        if self.coords.cp_size > 1:  # this CP rank's chunks of every sequence (``parallel.cp_slice``)
            batch = cp_slice(batch, self.coords.cp_size, self.coords.cp)
        if self.coords.fields is not None:  # pp_data="split": the first stage's inputs, the last's targets
            batch = stage_fields(batch, self.coords.fields)
        if self._io()[1].on_device:  # nvdec: the batch's device work done before another thread reads it
            self._io()[1].settle()
        self._pace.built(time.perf_counter() - t0)
        return batch

    def _build(self, step: Step) -> dict:
        o = self.options
        prepare = self._io()[1]
        alloc, empty = prepare.arrays.zeros, prepare.frames_empty if prepare.on_device else prepare.arrays.empty
        if o.plain and step.items is None:
            batch = self._mapped_batch(step, alloc)
            if batch is not None:
                return batch
        items = step_items(step, self.plans)
        refs = [r for item in items for r in item]
        t0 = time.perf_counter()
        raws = self._read(refs)
        self._stats.add(seconds={"read": time.perf_counter() - t0})
        if o.plain:
            batch = self._plain_batch(refs, raws, alloc)
            if batch is not None:
                return batch
        frames, rows = self._frame_rows(refs, empty)  # (collate zeroes its padding)
        flat = self._load(refs, raws, rows)
        t0 = time.perf_counter()
        nested, k = [], 0
        for item in items:
            nested.append(flat[k : k + len(item)])
            k += len(item)
        batch, counters = collate(
            [[s for _, s, _ in item] for item in nested],
            [[m for _, _, m in item] for item in nested],
            (len(self.controls), len(self.channels)),
            o.pack_frames,
            alloc,
            empty,
            frames,
        )
        if o.max_frames is not None:
            counters["truncated"] += sum(
                cut_by_max_frames(
                    int(self.sources[r.source].frames[r.index]), o.frame_stride, o.clip_frames, o.max_frames
                )
                for r, _, _ in flat
            )
        samples = [s for _, s, _ in flat]
        self._metadata(
            batch,
            [r.source for r, _, _ in flat],
            np.array([r.index for r, _, _ in flat]),
            [s["key"] for s in samples],
            [s["video"] for s in samples] if o.decode == "bytes" else None,
            [s["text"] for s in samples] if o.text else None,
            [len(item) for item in items] if o.pack_frames else None,
        )
        self._count(len(flat), counters, t0)
        return batch

    def _count(
        self, samples: int, counters: dict, t0: float, counts: dict | None = None, seconds: dict | None = None
    ) -> None:
        """A batch's counters and its collation's seconds (since ``t0``), with ``counts`` and ``seconds``
        of the stages before it: one update of the stats a batch."""
        self._stats.add(
            counts={
                "batches": 1,
                "samples": samples,
                "frames": counters["frames"],
                "padding_frames": counters["padding"],
                "truncated": counters["truncated"],
                **(counts or {}),
            },
            seconds={"collate": time.perf_counter() - t0, **(seconds or {})},
        )

    def _mapped_batch(self, step: Step, alloc) -> dict | None:
        """A batch of one source with nothing to run per sample, straight from its shards' mappings
        (``SampleReader.spans``, ``collate_spans``): no per-sample object at all. None when the general
        route must run (the reader copies, a shard is not trusted, or a session's columns need remapping
        or its codec facts are not known yet: the general route learns them)."""
        src, epoch, b = step.source, step.epoch, step.batch
        if src is None or epoch is None or b is None:
            raise UsageError(f"step {step.j} names no batch of a source's epoch (mix='sample' builds its items)")
        readers, prepare = self._io()
        source = self.sources[src]
        t0 = time.perf_counter()
        idx = np.array([i for item in self.plans[src].batch(epoch, b) for i in item], np.int64)
        spans = readers[src].spans(idx)
        if spans is None:
            return None
        codes = source.session_code[idx]
        try:  # sessions met for the first time: their codec facts now
            prepare.learn(src, codes.tolist())
        except FormatError:  # (no sample of a session has JSON that parses: the general route replaces them)
            return None
        if prepare.refuses(src, idx) or not prepare.direct(src, codes):
            return None
        t1 = time.perf_counter()
        batch, counters, videos = collate_spans(
            spans, source.frames[idx], (len(self.controls), len(self.channels)), alloc
        )
        self._metadata(batch, [src] * len(idx), idx, [source.keys[i] for i in idx.tolist()], videos)
        self._count(len(idx), counters, t1, {"bytes": int(source.sample_bytes[idx].sum())}, {"read": t1 - t0})
        return batch

    def _plain_batch(self, refs: list[SampleRef], raws: list, alloc) -> dict | None:
        """A batch with nothing to run per sample (``LoaderOptions.plain``), straight from the read buffers
        into the batch (``collate_clips``). None when a sample of it is damaged: the general route then
        replaces it, from the same reads, the way it always does."""
        _, prepare = self._io()
        t1 = time.perf_counter()
        if any(isinstance(raw, FormatError) for raw in raws):
            return None
        try:
            for ref, raw in zip(refs, raws):
                prepare.video_facts(ref.source, raw)  # the codec tag (its session's JSON, parsed once)
        except FormatError:  # a sample whose JSON the facts were sought in is damaged: the general route replaces it
            return None
        t2 = time.perf_counter()
        try:
            batch, counters = collate_clips(
                raws,
                [prepare.maps[r.source][raw.session] for r, raw in zip(refs, raws)],
                (len(self.controls), len(self.channels)),
                alloc,
            )
        except FormatError:
            return None
        self._metadata(
            batch,
            [r.source for r in refs],
            np.array([r.index for r in refs]),
            [raw.key for raw in raws],
            [raw.members[VIDEO_SLOT] for raw in raws],
        )
        self._count(len(refs), counters, t2, {"bytes": self._bytes(refs)}, {"decode": t2 - t1})
        return batch

    def _frame_rows(self, refs: list[SampleRef], alloc) -> tuple[np.ndarray | None, list | None]:
        """The batch's frames array and each sample's row of it, made before decoding so that a sample
        decodes straight into its row (one copy of every frame less): when the index gives every sample
        the same frame size (on NVDEC's route a torch tensor on the device, ``alloc`` being
        ``Preparer.frames_empty``). Otherwise (and with packing, or a user ``map`` that may reshape frames)
        (None, None), and collation copies."""
        o, (_, prepare) = self.options, self._io()
        if not prepare.frames or o.pack_frames or o.map is not None or not refs:  # (frames: whether decoded)
            return None, None
        shapes = [prepare.frames_shape(r.source, r.index) for r in refs]
        if len({shape[1:] for shape in shapes}) != 1:
            return None, None
        frames = alloc((len(refs), max(shape[0] for shape in shapes), *shapes[0][1:]), np.uint8)
        return frames, [frames[b, : shape[0]] for b, shape in enumerate(shapes)]

    def _metadata(
        self,
        batch: dict,
        src: list[int],
        idx: np.ndarray,
        keys: list[str],
        videos: list | None = None,
        texts: list | None = None,
        item_sizes: list[int] | None = None,
    ) -> None:
        """Per-sample fields of samples ``idx`` of sources ``src``, aligned with ``keys`` (per item; per item
        a list of them when packing: ``item_sizes`` samples each)."""
        o = self.options
        n = len(keys)
        flat: dict[str, list] = {"keys": keys, "source": src}
        _, prepare = self._io()
        kinds = sorted(set(src))
        for k in kinds:
            at = None if len(kinds) == 1 else np.flatnonzero(np.array(src) == k)  # None: one source (mix="batch")
            mine = idx if at is None else idx[at]
            values = self.sources[k].fields(mine)
            if o.decode == "bytes":
                values["codec_tag"] = prepare.codec_tags(k, mine)
            for name, column in values.items():
                if at is None:
                    flat[name] = column
                    continue
                merged = flat.setdefault(name, [None] * n)
                for p, v in zip(at.tolist(), column):
                    merged[p] = v
        if texts is not None:
            flat["text"] = texts
        if videos is not None:
            flat["video"] = videos
            flat["container"] = [VIDEO_EXT] * n
        else:
            for name in ("fps", "has_audio"):
                flat.pop(name)
        if item_sizes is not None:
            bounds = np.cumsum([0] + item_sizes).tolist()
            flat = {name: [v[a:b] for a, b in zip(bounds, bounds[1:])] for name, v in flat.items()}
        batch.update(flat)

    def _build_held(self, step: Step) -> tuple[dict, dict]:
        """``build``, with the counts it recorded held for ``Stats.deliver``."""
        with self._stats.holding() as held:
            return self.build(step), held

    def __iter__(self) -> Iterator[dict]:
        """One epoch (one pass of the stream for a mixture). Batches are built ``prefetch`` ahead by the
        worker threads, across the epoch's end too: once every batch of this epoch is under way, the next
        epoch's first ones are started (``Ahead``), so a training loop over epochs never waits for a cold
        pipeline. A read-ahead is used only by an iteration that starts where it does (a
        ``load_state_dict`` in between discards it); batches are a function of the position alone. A
        ``load_state_dict`` during the loop (a roll-back) takes effect at once: the loop goes on from the
        restored position."""
        self.open()
        o = self.options

        processes = self._worker_mode() == "process"
        depth = o.prefetch * o.num_workers if processes else o.prefetch  # process mode: prefetch per worker

        def submit(step: Step):  # (the pool of now: a ``close()`` during the loop stops the one it began with)
            if processes:
                return self._processes().submit(step)
            return self._workers().submit(self._build_held, step) if self._pace.ahead() else None

        self._generation += 1
        generation = self._generation
        born = _Process.generation
        ahead, self._ahead = self._ahead, None
        # (a load_state_dict moves the position; a forked child's copy of a read-ahead never arrives)
        if ahead is not None and ahead.start == self.position and ahead.born == born:
            pending, work = ahead.pending, ahead.work
        else:
            if ahead is not None:
                ahead.cancel()
            pending, work = deque(), self.steps()
        end = nxt = None
        finished = False
        try:
            while True:
                if born != _Process.generation and any(fut is not None for fut, _, _ in pending):
                    raise UsageError(
                        "a loop over a loader goes on only in the process that began it: its next batches are "
                        "being built by that process's workers",
                        hint="begin a new loop (iter(loader)) in this process: it starts workers of its own",
                    )
                while end is None and len(pending) < depth:
                    step, after = next(work, (None, None))
                    if step is None:
                        end = after
                        break
                    pending.append((submit(step), step, after))
                if end is not None:
                    nxt = nxt or Ahead(end, deque(), self.steps(start=end))
                    nxt.fill(submit, depth - len(pending))
                if not pending:
                    break
                fut, step, after = pending.popleft()
                t0 = time.perf_counter()
                # a batch no worker has started is built here: waiting for one would only add two thread
                # hand-offs (each a wake-up through the kernel) to the same work
                batch, held = self._build_held(step) if fut is None or fut.cancel() else fut.result()
                t1 = time.perf_counter()
                seconds = {"wait": t1 - t0}
                if self._transfer is not None:
                    batch = self._transfer(batch)
                    seconds["h2d"] = time.perf_counter() - t1
                self.position = after
                self._stats.deliver(held, seconds)
                t_yield = time.perf_counter()
                yield batch
                self._pace.returned(time.perf_counter() - t_yield)
                if not processes and self._pace.ahead():  # a consumer seen away: what it was left to build goes ahead
                    pending = deque((submit(step) if f is None else f, step, a) for f, step, a in pending)
                if self._generation != generation:
                    # load_state_dict (or another loop) moved the position while this loop waited: go on
                    # from there, not from where this loop was (which would undo the restore)
                    generation = self._generation
                    cancel(pending, born)
                    if nxt is not None:
                        nxt.cancel()
                    pending, work, end, nxt = deque(), self.steps(), None, None
            if end is not None:
                self.position = end
            finished = True
        finally:  # a consumer that stopped early: nothing builds on after it
            if not finished:
                cancel(pending, born)
                if nxt is not None:
                    nxt.cancel()
            self._ahead = nxt if finished else None

    def _workers(self) -> ThreadPoolExecutor:
        """The worker threads, kept from epoch to epoch (a new thread waits for the GIL from its busy
        siblings before ``start`` returns: about 1 ms each, every epoch, otherwise); made anew in a forked
        process, which inherits no threads."""
        if self._pool_process != _Process.generation:
            self._pool = self._held.pool = ThreadPoolExecutor(
                max_workers=max(1, self.options.num_workers), thread_name_prefix="dsbuild-load"
            )
            self._pool_process = _Process.generation
        return self._pool

    def _worker_mode(self) -> str:
        """ "thread" or "process" (``workers.choose_mode``), noted with the reason in ``stats()``."""
        mode, why = choose_mode(self.options)
        if mode == "process" and self.backend.name == "nvdec":  # (worker_mode='process' is refused at open)
            mode, why = "thread", "auto: decode_backend='nvdec' keeps frames in device memory, threads hand them on"
        self._stats.workers_info(mode=mode, why=why)
        return mode

    def _processes(self) -> ProcessWorkers:
        """The worker processes (``dsbuild.loader.workers``): started on first use, kept from epoch to epoch
        until ``close``; made anew in a forked process, which inherits none, and after an interruption
        cut a hand-over short (``ProcessWorkers.spent``)."""
        held = self._held.processes
        if held is not None and held.spent and held.generation == _Process.generation:
            held.close()
            held = None
        if held is None or held.generation != _Process.generation:
            held = ProcessWorkers(self, self._stats)
            held.generation = _Process.generation
            self._held.processes = held.start()
        return held

    def close(self) -> None:
        """Close its shard files and stop its worker threads now (a loader that is simply dropped does
        so when it is collected). Using it again reopens them; ``with Loader(...) as loader:`` closes."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead = None
        self._held.release()
        preparer = getattr(self, "_preparer", None)
        if preparer is not None and preparer.decoders is not None:
            preparer.decoders.close()  # the NVDEC decoders it kept across clips (made again on reuse)
        self._io_process = self._pool_process = None

    def __enter__(self) -> Mixture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def as_torch_dataset(self):
        """This loader as a torch IterableDataset (use ``DataLoader(ds, batch_size=None, num_workers=K)``)."""
        from dsbuild.loader.torch import TorchDataset

        return TorchDataset(self)

    def as_jax_iterator(self, sharding):
        """Batches as dicts of global ``jax.Array``s laid out by ``sharding`` (see ``dsbuild.loader.jax``)."""
        from dsbuild.loader.jax import jax_batches

        return jax_batches(self, sharding)

    def __getstate__(self) -> dict:
        """Picklable for DataLoader workers under spawn: settings and position only; reopened lazily."""
        self.open()
        return {
            "options": self.options,
            "specs": self._specs,
            "weights": self.weights.tolist(),
            "state": self.state_dict(),
            "cls": type(self).__name__,
        }

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(
            self, [(ref, split, w) for (ref, split), w in zip(state["specs"], state["weights"])], state["options"]
        )
        self.load_state_dict(state["state"])

    def stats(self) -> dict:
        """Counts (batches, samples, frames, padding, truncated, corrupt + keys), seconds per stage, notes;
        ``parallel``: this rank's place in the layout and its role, and with ``balance`` the mean over steps
        of the busiest data-parallel rank's work over the mean rank's, as drawn and as dealt."""
        self.open()
        out = self._stats.to_json()
        out["parallel"] = self.coords.to_json()
        if self.options.balance is not None:
            k = self._spread["steps"]
            out["parallel"]["spread"] = {
                "steps": k,
                "drawn": self._spread["drawn"] / k if k else 1.0,
                "dealt": self._spread["dealt"] / k if k else 1.0,
            }
        return out


class _Held:
    """What a loader holds open in this process: shard files and worker threads. Kept apart from the
    loader so that the finalizer releasing them does not keep the loader alive."""

    def __init__(self) -> None:
        self.files: list[ShardFiles] = []
        self.pool: ThreadPoolExecutor | None = None
        self.processes: ProcessWorkers | None = None

    def release(self) -> None:
        files, self.files = self.files, []
        for f in files:
            f.close()
        processes, self.processes = self.processes, None
        if processes is not None:
            processes.close()
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class Loader(Mixture):
    """One source: ``Loader("catalog@v3", split="main/train", seed=17, batch_size=8, ...)``.

    ``for batch in loader`` delivers the rest of the current epoch; the next loop starts the next epoch.
    """

    def __init__(self, ref: str, split: str | None = None, options: LoaderOptions | None = None, **overrides: Any):
        super().__init__([(ref, split, 1.0)], options, **overrides)

    @classmethod
    def from_description(cls, sources: list[tuple[str, str | None, float]], options: LoaderOptions) -> Loader:
        ((ref, split, _),) = sources
        return cls(ref, split, options)

    def _stops(self) -> bool:
        return True

    def __setstate__(self, state: dict) -> None:
        ((ref, split),) = state["specs"]
        Loader.__init__(self, ref, split, state["options"])
        self.load_state_dict(state["state"])

    @property
    def epoch(self) -> int:
        self.open()
        return self.position.cursors[0][0]

    def __len__(self) -> int:
        """Batches this rank gets in the current epoch from the current position."""
        self.open()
        o = self.options
        epoch, at = self.position.cursors[0]
        plan = self.plans[0]
        # mix="batch": the cursor counts batches; mix="sample": samples up to the current planning chunk
        # (one source: its chunks are the plan's own), plus ``inner`` batches into that chunk
        done = at if o.mix == "batch" else plan.batches_before(epoch, at) + self.position.inner
        remaining = plan.batches_in_epoch(epoch) - done
        me = self.coords
        return max(0, -(-(remaining - me.dp) // me.dp_size)) if me.reads else 0

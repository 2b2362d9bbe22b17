"""The loader as a ``torch.utils.data.IterableDataset`` for a plain ``DataLoader`` (torch is optional).

Each DataLoader worker takes every K-th of this rank's batches; the DataLoader reads workers round-robin
in order, so the stream is the same for any ``num_workers``. Use ``DataLoader(ds, batch_size=None)``:
batches are built inside the workers. In a worker process a built batch is copied into shared memory
(``shared_batch``) and every array crosses as a view of it; encoded clips (decode="bytes") are packed
as one uint8 tensor ``video_data`` with ``video_offsets`` (clip i is
``video_data[video_offsets[i]:video_offsets[i + 1]]``). Each batch carries ``state``: the checkpoint to
save after consuming it (``loader.state_after(batch)``). Under torchdata's ``StatefulDataLoader`` the
iterator of each worker (``Batches``) is itself checkpointed and restored exactly, with no batch read
again; that checkpoint holds the worker count, which ``StatefulDataLoader`` requires to be the same on
restore — the loader's own checkpoint (``state_after``) resumes under any worker count.

What crosses to the main process, and how: torch's worker queue pickles each batch (torch's transport,
not ours). The tensors cross as shared-memory storages, passed by file descriptor, never as their bytes;
everything else in a batch is plain data — lists of str, int, float, bool and None (keys, titles,
conditions, codecs, ``cu_seqlens`` as lists) and ``state``, a dict of those. A DataLoader worker started by
``spawn`` or ``forkserver`` is sent the dataset: ``TorchDataset.__getstate__`` gives torch plain types
only (the loader's JSON description, its map function by import path, its checkpoint, a path).

The payload (frames, the clips, audio: arrays of ``BIG`` bytes or more) is written into a ring of shared
blocks each worker keeps (``Ring``): a block is reused once no batch made from it is left in any process,
so a batch that a training loop keeps never changes; a new block every batch cost 3-5x the copy (the
kernel zeroes and maps every page, in the worker and again in the main process). The small arrays of a
batch (lengths, timestamps, actions...) share one new small block: a tensor keeps its whole block alive,
and a training loop that keeps ``batch["lengths"]`` for its metrics must not keep the batch's frames (or
the ring's block) with it. Each storage costs torch a hand-over of its descriptor through the worker's
``resource_sharer`` thread (a connection and a handshake, which wait for the worker's GIL): two a batch.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.loader.description import WorkerSpec, describe, rebuild
from dsbuild.loader.passes import PassFile
from dsbuild.loader.state import LoaderState
from dsbuild.loader.walk import Position

ALIGN = 64  # bytes: every array's view starts on a cache line (and on its dtype's alignment)
BIG = 1 << 20  # bytes: an array at least this large crosses in the ring's block, not the small one
SLOTS = 8  # a worker's ring: the DataLoader's prefetch_factor in flight, the batch the loop holds, and spare
MIB = 1 << 20
SWITCH_S = 0.0005  # a DataLoader worker's GIL switch interval (see ``TorchDataset.ring``)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _offsets(clips: list) -> np.ndarray:
    """Where each clip starts when they are laid end to end, and (last entry) where they end."""
    return np.concatenate([[0], np.cumsum([len(c) for c in clips], dtype=np.int64)]).astype(np.int64)


def _pack(clips: list, into: np.ndarray) -> None:
    """The clips' bytes end to end into ``into`` (uint8, exactly their total size)."""
    at = 0
    for c in clips:
        into[at : at + len(c)] = np.frombuffer(c, np.uint8)
        at += len(c)


def _finish(out: dict) -> dict:
    if isinstance(out.get("cu_seqlens"), list):
        out["cu_seqlens"] = [x.tolist() for x in out["cu_seqlens"]]
    return out


def _new_block(nbytes: int) -> torch.Tensor:
    """A new shared-memory block as a uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))


def _places(arrays: dict[str, np.ndarray], at: int = 0) -> tuple[dict[str, int], int]:
    """Where each array starts in a block laid out from ``at`` (aligned), and where they end."""
    layout = {}
    for k, a in arrays.items():
        layout[k] = at
        at += -(-a.nbytes // ALIGN) * ALIGN
    return layout, at


def _views(block: torch.Tensor, arrays: dict[str, np.ndarray], layout: dict[str, int]) -> dict[str, torch.Tensor]:
    """Tensor views of ``block`` at ``layout``, shaped and typed as ``arrays``."""
    return {
        k: block[layout[k] : layout[k] + a.nbytes].view(_torch_dtype(a.dtype)).view(a.shape) for k, a in arrays.items()
    }


def _write(raw: np.ndarray, arrays: dict[str, np.ndarray], layout: dict[str, int]) -> None:
    for k, a in arrays.items():
        raw[layout[k] : layout[k] + a.nbytes] = a.reshape(-1).view(np.uint8)


def _in_block(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """``arrays`` copied into one new shared block, each a tensor view of it."""
    layout, total = _places(arrays)
    block = _new_block(total)
    _write(block.numpy(), arrays, layout)
    return _views(block, arrays, layout)


class _Block:
    """One block of a worker's ring: a memfd, opened here once (``fd``) and mapped once (``raw``)."""

    def __init__(self, size: int) -> None:
        made = os.memfd_create("dsbuild-batch", os.MFD_CLOEXEC)
        try:
            # (a file opened by path, unlike the memfd itself, counts as open for writing: see ``released``)
            self.fd = os.open(f"/proc/self/fd/{made}", os.O_RDWR | os.O_CLOEXEC)
        finally:
            os.close(made)
        try:
            os.ftruncate(self.fd, size)
            os.posix_fallocate(self.fd, 0, size)  # memory short: an error here, never a SIGBUS mid-copy
            self.raw = np.frombuffer(mmap.mmap(self.fd, size), np.uint8)
        except OSError:
            os.close(self.fd)
            raise
        self.size, self.used = size, 0

    def released(self) -> bool:
        """No other open of the block is left: no batch made from it lives, in any process. Each batch is
        given a storage over an open of its own (``tensor``), which the DataLoader sends to the main
        process (the same open, by file descriptor) and which closes when the last tensor of it goes; a
        write lease is granted only to the file's one open for writing. Raises OSError where leases are
        not available."""
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except BlockingIOError:  # (EAGAIN)
            return False
        fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True

    def tensor(self) -> torch.Tensor:
        """The block as a uint8 tensor over a new storage of its own open (what a batch holds)."""
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            storage = torch.UntypedStorage._new_shared_fd_cpu(fd, self.size)
        finally:
            os.close(fd)
        return torch.empty(0, dtype=torch.uint8).set_(storage)

    def close(self) -> None:
        """Forget the block here; the batches that hold it keep its memory until they go."""
        os.close(self.fd)
        del self.raw


class Ring:
    """A DataLoader worker's reused shared memory for the payload of its batches (frames, clips, audio):
    up to ``SLOTS`` blocks, each written again only once no batch made from it is left in any process
    (``_Block.released``), so a batch a training loop keeps never changes. Writing into memory already
    mapped and faulted in costs a copy; a new shared block each batch cost 3-5x that (the kernel zeroes
    and maps every page, in the worker and again in the main process). Where memfds or leases are not
    available (not Linux), every batch gets a new block."""

    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.reuse = hasattr(os, "memfd_create") and hasattr(fcntl, "F_SETLEASE")
        self.made = self.tick = 0

    def block(self, need: int) -> tuple[np.ndarray, Callable[[], torch.Tensor]]:
        """(memory to write ``need`` bytes into, and what makes the batch's tensor of it afterwards)."""
        self.tick += 1
        if self.reuse:
            try:
                return self._reused(need)
            except OSError:  # (leases refused, or memfds: new blocks from now on)
                self.reuse = False
                self.close()
        block = _new_block(need)
        return block.numpy(), lambda: block

    def _reused(self, need: int) -> tuple[np.ndarray, Callable[[], torch.Tensor]]:
        free = [b for b in self.blocks if b.released()]
        fits = [b for b in free if b.size >= need]
        if fits:
            b = fits[0]
        else:
            if len(self.blocks) >= SLOTS:  # a free one too small, else the one longest unused
                old = free[0] if free else min(self.blocks, key=lambda x: x.used)
                self.blocks.remove(old)
                old.close()
            b = _Block(-(-need * 5 // 4 // MIB) * MIB)  # a quarter more, whole MiBs: a larger batch fits
            self.blocks.append(b)
            self.made += 1
        b.used = self.tick
        return b.raw, b.tensor

    def close(self) -> None:
        for b in self.blocks:
            b.close()
        self.blocks = []


def shared_batch(batch: dict, ring: Ring) -> dict:
    """``batch`` as torch tensors in shared memory: the arrays under ``BIG`` bytes as views of one new
    small block; the clips (packed as ``video_data`` + ``video_offsets``) and the larger arrays as views
    of one block of ``ring``; the other fields as they are."""
    arrays = {k: np.ascontiguousarray(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
    clips = batch.get("video")
    if clips is not None:
        arrays["video_offsets"] = _offsets(clips)
    out = {k: v for k, v in batch.items() if k not in arrays and k != "video"}
    small = {k: a for k, a in arrays.items() if a.nbytes < BIG}
    big = {k: a for k, a in arrays.items() if k not in small}
    layout, end = _places(big)
    packed = int(arrays["video_offsets"][-1]) if clips is not None else 0
    if big or clips is not None:
        raw, tensor = ring.block(max(1, end + packed))
        _write(raw, big, layout)
        if clips is not None:
            _pack(clips, raw[end : end + packed])
        block = tensor()
        out.update(_views(block, big, layout))
        if clips is not None:
            out["video_data"] = block[end : end + packed]
    if small:
        out.update(_in_block(small))
    return _finish(out)


def local_batch(batch: dict) -> dict:
    """``batch`` as torch tensors sharing its arrays' memory (no worker process: nothing crosses)."""
    out: dict[str, Any] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
    clips = out.pop("video", None)  # a list of encoded clips (not an array: left as it is above)
    if clips is not None:
        offsets = _offsets(clips)
        data = np.empty(int(offsets[-1]), np.uint8)
        _pack(clips, data)
        out["video_data"], out["video_offsets"] = torch.from_numpy(data), torch.from_numpy(offsets)
    return _finish(out)


class TorchDataset(IterableDataset):
    """Each pass over a DataLoader is the loader's next epoch. Without worker processes the loader itself
    moves with every batch handed out (as ``for b in loader``); with them, the workers of each pass agree
    where it starts (``passes``): where the previous pass ended, or where it started if it was broken off.
    The loader in the main process does not move then: save ``loader.state_after(batch)``.

    ``iter(dataset)`` is a ``Batches`` iterator with ``state_dict``/``load_state_dict``: torchdata's
    ``StatefulDataLoader`` snapshots it in each worker and restores it exactly, without reading a
    skipped batch again."""

    def __init__(self, loader) -> None:
        super().__init__()
        self.loader = loader  # a dsbuild.loader.Mixture (or Loader)
        self._passes = PassFile()
        self._begun = 0  # passes this copy began (a persistent worker keeps its copy from pass to pass)
        self._ring: tuple[int, Ring] | None = None  # (pid, ring): a DataLoader worker's, made on its first batch
        weakref.finalize(self, self._passes.remove)
        loader.on_move(self._passes.moved)

    def __getstate__(self) -> dict:
        """What a DataLoader worker started by spawn or forkserver is sent (torch pickles it): plain types
        only — the loader's JSON description (``description.WorkerSpec``, its map function by import path),
        its checkpoint, the pass record's path. (A forked worker copies the object instead.)"""
        return {
            "loader": describe(self.loader).text(),
            "state": json.dumps(self.loader.state_dict()),
            "passes": self._passes.path,
            "owner": self._passes.owner,
            "begun": self._begun,
        }

    def __setstate__(self, state: dict) -> None:
        IterableDataset.__init__(self)
        self.loader = rebuild(WorkerSpec.read(state["loader"]))
        self.loader.load_state_dict(json.loads(state["state"]))
        self._passes = PassFile.__new__(PassFile)  # (the main process's record: this copy never removes it)
        self._passes.path, self._passes.owner = state["passes"], state["owner"]
        self._begun, self._ring = state["begun"], None

    def ring(self) -> Ring:
        """This process's ring (a forked copy of the dataset makes its own). Made on a DataLoader worker's
        first batch, which also shortens the worker's GIL switch interval to ``SWITCH_S``: torch hands each
        tensor's storage to the main process through a thread of the worker (``resource_sharer``: a
        connection and a handshake, a few steps that each need the GIL), which waits a whole interval
        (5 ms by default) for every step while this thread builds the next batch."""
        if self._ring is None or self._ring[0] != os.getpid():
            self._ring = (os.getpid(), Ring())
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_S))
        return self._ring[1]

    def __iter__(self) -> Batches:
        return Batches(self)

    def _batch(self, step, after, convert) -> dict:
        batch = convert(self.loader.build(step))
        batch["state"] = self.loader.state_at(after)
        return batch


class Batches:
    """One pass's batches in this process (the main one, or DataLoader worker k of K). Its state is where
    its next batch comes from: a loader checkpoint P and this worker's place among the K after P (worker k
    of a pass takes the k-th, (k+K)-th, ... of the rank's global steps; after its batch at step g, its next
    is the (K-1)-th after g). A few hundred bytes, restored in O(1): nothing is read again."""

    def __init__(self, dataset: TorchDataset):
        self.ds, self.loader = dataset, dataset.loader
        info = get_worker_info()
        self.info = info
        self.workers = 1 if info is None else info.num_workers
        self._steps: Iterator | None = None  # made on the first batch (a restore may come first)
        self._state: dict | None = None
        self._name: list | None = None

    def __iter__(self) -> Batches:
        return self

    def _begin(self) -> None:
        loader, info = self.loader, self.info
        if info is not None and loader.options.decode_backend == "nvdec":
            raise UsageError(
                "decode_backend='nvdec' in DataLoader worker processes: its frames are CUDA tensors, which a "
                "worker process cannot hand over (and CUDA does not start in a forked process)",
                hint="use num_workers=0 (the loader's own threads decode; NVDEC does the heavy work)",
            )
        loader.open()
        if info is None:
            start, k = loader.position, 0
        else:
            self.ds._begun += 1
            self._name = [info.seed - info.id, self.ds._begun]  # torch draws one base seed a pass, worker i seed + i
            start, k = self.ds._passes.start(self._name, info.num_workers, loader.position), info.id
        self._seat(start, k)

    def _seat(self, start: Position, k: int) -> None:
        self._steps = self.loader.steps(k, self.workers, start)
        self._state = {"loader": self.loader.state_at(start), "worker": k, "workers": self.workers}

    def __next__(self) -> dict:
        if self._steps is None:
            self._begin()
        step, after = next(self._steps or iter(()), (None, None))
        if step is None:
            if after is not None:
                if self.info is None:
                    self.loader.position = after
                elif self._name is not None:
                    self.ds._passes.done(self._name, after)
                self._seat(after, self.workers - 1)
                self._steps = iter(())
            raise StopIteration
        batch = self.ds._batch(
            step, after, local_batch if self.info is None else lambda b: shared_batch(b, self.ds.ring())
        )
        if self.info is None:
            self.loader.position = after
        self._state = {"loader": batch["state"], "worker": self.workers - 1, "workers": self.workers}
        return batch

    def state_dict(self) -> dict:
        """JSON-safe: where this iterator's next batch comes from."""
        if self._state is None:
            self._begin()
        return dict(self._state or {})

    def load_state_dict(self, state: dict) -> None:
        """Go on exactly where ``state`` (of ``state_dict``, under the same number of workers) says."""
        if not isinstance(state, dict) or set(state) != {"loader", "worker", "workers"}:
            raise FormatError("torch iterator checkpoint: not a dict of loader, worker and workers")
        k, workers = state["worker"], state["workers"]
        if type(k) is not int or type(workers) is not int or not 0 <= k < workers:
            raise FormatError(f"torch iterator checkpoint: worker {k!r} of {workers!r}")
        if workers != self.workers:
            raise UsageError(
                f"this checkpoint was saved with {workers} DataLoader worker(s), not {self.workers}",
                hint="resume with the same num_workers, or restore the loader's own checkpoint "
                "(loader.load_state_dict(loader.state_after(batch))), which resumes under any worker count",
            )
        theirs = LoaderState.from_json(state["loader"], "torch iterator checkpoint")
        at = Position(theirs.position, tuple((c.epoch, c.at) for c in theirs.cursors), theirs.inner)
        LoaderState.from_json(self.loader.state_at(at), "loader").check_compatible(theirs)
        if self.info is None:
            self.loader.position = at
        self._seat(at, k)

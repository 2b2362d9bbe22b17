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
not ours), but no tensor crosses it. The arrays are written into blocks of shared memory (memfds) the
worker keeps, and cross as handles (``_Hand``: the worker's pid, the block's descriptor number, its serial
and the batch's token) which the main process resolves while unpickling (``_arrived``): it opens and maps
each block through ``/proc/<pid>/fd`` once, keeps the mapping for the block's next batches, and gives each
batch its own lease of it, which the batch's tensors hold (``torch.from_numpy`` views). torch's own
transport hands each storage's descriptor over through the worker's ``resource_sharer`` thread, a
connection and a handshake that wait for the worker's GIL (about 0.45 ms a storage here, as much as process
mode spends on a whole batch); an open and a map of each block a batch, and their unmap when it went, cost
another 0.04 ms. Everything else in a batch is plain data: lists of str, int, float, bool and None (keys,
titles, conditions, codecs, ``cu_seqlens`` as lists) and ``state``, a dict of those. A DataLoader worker
started by ``spawn`` or ``forkserver`` is sent the dataset: ``TorchDataset.__getstate__`` gives torch plain
types only (the loader's JSON description, its map function by import path, its checkpoint, a path). (A
``collate_fn``, run in the worker, sees the handles; with ``batch_size=None`` none is needed.) The tensors
are not ``is_shared()`` in torch's sense: passed on to another process, torch copies them into memory of
its own (and the lease goes).

Each worker keeps two rings of blocks (``Ring``): one for the payload (frames, the clips, audio: arrays of
``BIG`` bytes or more) and one for the small arrays of a batch (lengths, timestamps, actions...), so a
training loop that keeps ``batch["lengths"]`` for its metrics keeps a small block, not the frames. A block
is written again only once its last batch has arrived (its header's pending byte, cleared by the main
process as it maps it) and that batch's last tensor is gone (its held byte, cleared when the lease is
collected), so a batch a training loop keeps never changes; a new block every batch cost 3-5x the copy
(the kernel zeroes and maps every page, in the worker and again in the main process). Where memfds are not
available (not Linux), every batch gets new blocks of torch's, handed over by torch.
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.loader.description import WorkerSpec, describe, rebuild
from dsbuild.loader.files import map_file
from dsbuild.loader.layout import aligned, copy_in
from dsbuild.loader.passes import PassFile
from dsbuild.loader.state import LoaderState
from dsbuild.loader.walk import Position

BIG = 1 << 20  # bytes: an array at least this large crosses in the ring's block, not the small one
SLOTS = 8  # a worker's ring: the DataLoader's prefetch_factor in flight, the batch the loop holds, and spare
MIB = 1 << 20
PAGE = 4096
HEADER = 64  # bytes at the start of a ring's block: the token of its last batch (16), PENDING, HELD
PENDING = 16  # the header's byte that is 1 from a batch's hand-off until the main process has it mapped
HELD = 17  # the header's byte that is 1 from a batch's hand-off until its last tensor is gone


@functools.cache
def _torch_dtype(dtype: str) -> torch.dtype:
    """torch's dtype for numpy's name of one (``"<f4"``)."""
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


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
    """A new shared-memory block of torch's as a uint8 tensor (handed over by torch)."""
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))


def _places(arrays: dict[str, np.ndarray], at: int = 0) -> tuple[dict[str, int], int]:
    """Where each array starts in a block laid out from ``at`` (aligned), and where they end."""
    layout = {}
    for k, a in arrays.items():
        layout[k] = at
        at += aligned(a.nbytes)
    return layout, at


def _view(
    base: torch.Tensor | np.ndarray | _Hand, at: int, nbytes: int, dtype: str, shape: tuple
) -> torch.Tensor | _Part:
    """``nbytes`` of ``base`` from ``at`` as an array of ``dtype`` (numpy's name) and ``shape``: a tensor
    view, or of a block still in the worker, a ``_Part`` that becomes that view where it arrives (``base``
    is then the batch's lease of the block as numpy: a tensor made from numpy's view costs a third of
    torch's slicing)."""
    if isinstance(base, _Hand):
        return _Part(base, at, nbytes, dtype, shape)
    if isinstance(base, np.ndarray):
        return torch.from_numpy(base[at : at + nbytes].view(dtype).reshape(shape))
    return base[at : at + nbytes].view(_torch_dtype(dtype)).view(shape)


def _views(base: torch.Tensor | _Hand, arrays: dict[str, np.ndarray], layout: dict[str, int]) -> dict:
    return {k: _view(base, layout[k], a.nbytes, a.dtype.str, a.shape) for k, a in arrays.items()}


def _write(raw: np.ndarray, arrays: dict[str, np.ndarray], layout: dict[str, int]) -> None:
    for k, a in arrays.items():
        copy_in(raw, layout[k], a)


class _Mapped:
    """A worker's block as the main process maps it (through ``/proc/<pid>/fd``, read-write, holding no
    descriptor), kept for the block's next batches."""

    def __init__(self, pid: int, fd: int, size: int, serial: bytes) -> None:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            opened = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeError(
                f"DataLoader worker (pid {pid}): its batch's shared memory {path} cannot be opened ({e.strerror})"
            ) from None
        try:
            if os.fstat(opened).st_size != size:
                raise RuntimeError(f"DataLoader worker (pid {pid}): its batch's block {path} is not {size} bytes")
            self.block = map_file(opened, size, writable=True)
        finally:
            os.close(opened)
        self.raw = np.frombuffer(self.block, np.uint8)
        self.serial, self.lease = serial, _lease_type(size)


_MAPPED: OrderedDict[tuple[int, int], _Mapped] = OrderedDict()  # (worker pid, fd) -> its block, newest last
_MAPPED_LOCK = threading.Lock()  # (a pin-memory thread unpickles batches too)


@functools.cache
def _lease_type(size: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    """A weakref-able ctypes array of ``size`` bytes: one over a block is one batch's hold on it."""
    return cast(type[ctypes.Array[ctypes.c_ubyte]], type("BatchLease", (ctypes.c_ubyte * size,), {}))


def _mapped(pid: int, fd: int, size: int, serial: bytes) -> _Mapped:
    """The block ``serial`` of worker ``pid`` (descriptor ``fd`` there), mapped once. Blocks of workers
    that are gone, and a worker's blocks past the two rings it can hold (given up since), are forgotten
    here: their memory goes with the last batch that holds it."""
    with _MAPPED_LOCK:
        m = _MAPPED.get((pid, fd))
        if m is not None and m.serial == serial:
            _MAPPED.move_to_end((pid, fd))
            return m
        m = _MAPPED[(pid, fd)] = _Mapped(pid, fd, size, serial)
        _MAPPED.move_to_end((pid, fd))
        mine = [key for key in _MAPPED if key[0] == pid]
        for key in mine[: max(0, len(mine) - 2 * SLOTS)]:
            del _MAPPED[key]
        for key in [key for key in _MAPPED if key[0] != pid and not _alive(key[0])]:
            del _MAPPED[key]
        return m


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (someone else's process now holds that pid: the worker is gone)
        return False
    return True


def _let_go(raw: np.ndarray, pid: int) -> None:
    """A batch's lease collected: its block may be written again. Only in the process that took the lease:
    a process forked from it (a DataLoader's next workers) holds copies of the batches it had, whose
    collection there says nothing of this process's."""
    if os.getpid() == pid:
        raw[HELD] = 0


def _arrived(pid: int, fd: int, size: int, token: bytes, serial: bytes) -> np.ndarray:
    """Where a batch arrives (the main process, unpickling it): the worker's block, as this batch's lease
    of its mapping (uint8; the batch's tensors are views of it). The block's pending byte is cleared now,
    its held byte once the lease is collected: the worker writes the block again only then."""
    m = _mapped(pid, fd, size, serial)
    if m.raw[:PENDING].tobytes() != token:
        raise RuntimeError(f"DataLoader worker (pid {pid}): a batch's block was written again before it arrived")
    lease = m.lease.from_buffer(m.block)
    weakref.finalize(lease, _let_go, m.raw, os.getpid()).atexit = False  # (at exit nothing is written again)
    m.raw[PENDING] = 0
    return np.frombuffer(memoryview(lease), np.uint8)


class _Hand:
    """A worker's block as the batch that fills it sends it: pickled, it is what ``_arrived`` needs (one
    per block and batch: pickle writes it once however many arrays of the batch refer to it)."""

    def __init__(self, fd: int, size: int, token: bytes, serial: bytes) -> None:
        self.pid, self.fd, self.size, self.token, self.serial = os.getpid(), fd, size, token, serial

    def __reduce__(self) -> tuple:
        return _arrived, (self.pid, self.fd, self.size, self.token, self.serial)


class _Part:
    """An array of a batch in a worker's block: pickled, the view of the block that ``_Hand`` becomes."""

    def __init__(self, hand: _Hand, at: int, nbytes: int, dtype: str, shape: tuple) -> None:
        self.args = (hand, at, nbytes, dtype, shape)

    def __reduce__(self) -> tuple:
        return _view, self.args


class _Sent:
    """A batch as a DataLoader worker yields it: not a mapping, so torch's ``default_convert`` passes it by
    without walking every list (0.12 ms a batch here); pickled, it is the plain dict it holds."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple:
        return dict, (list(self.batch.items()),)


class _Block:
    """One block of a worker's ring: a memfd, opened here once (``fd``) and mapped once (``raw``)."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("dsbuild-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            os.posix_fallocate(self.fd, 0, size)  # memory short: an error here, never a SIGBUS mid-copy
            self.raw = np.frombuffer(mmap.mmap(self.fd, size), np.uint8)
        except OSError:
            os.close(self.fd)
            raise
        self.size, self.used = size, 0
        self.serial = os.urandom(8)  # (tells it from a later block given the same descriptor number)

    @property
    def pending(self) -> bool:
        """A batch of this block is on its way: the main process has not mapped it yet."""
        return bool(self.raw[PENDING])

    def released(self) -> bool:
        """No batch of the block is on its way, and none made from it lives: the main process cleared the
        pending byte when the batch arrived and the held byte when the batch's last tensor went (in this
        process too: a batch handed over within it goes the same way)."""
        return not self.raw[PENDING] and not self.raw[HELD]

    def hand(self, token: bytes) -> _Hand:
        """The block, marked on its way with ``token``, as a batch sends it."""
        self.raw[:PENDING] = np.frombuffer(token, np.uint8)
        self.raw[PENDING] = self.raw[HELD] = 1
        return _Hand(self.fd, self.size, token, self.serial)

    def close(self) -> None:
        """Forget the block here; the batches that hold it keep its memory until they go."""
        os.close(self.fd)
        del self.raw


class Ring:
    """A DataLoader worker's reused shared memory for one kind of array of its batches: up to ``SLOTS``
    blocks of whole ``granule``s, each written again only once ``_Block.released`` (so a batch a training
    loop keeps never changes). A block is given up when a new one is needed and all are taken, the one
    longest unused first, but never while a batch of it is on its way. Where memfds are not available (not
    Linux), every batch gets a new block of torch's."""

    def __init__(self, granule: int = MIB) -> None:
        self.blocks: list[_Block] = []
        self.granule = granule
        self.reuse = hasattr(os, "memfd_create")
        self.made = self.tick = 0
        self.id = os.urandom(8)  # with ``tick``, the token that tells one batch of a block from another

    def block(self, need: int) -> tuple[np.ndarray, torch.Tensor | _Hand]:
        """(memory to write ``HEADER + need`` bytes into, and the block as the batch refers to it)."""
        self.tick += 1
        if self.reuse:
            try:
                b = self._reused(HEADER + need)
                return b.raw, b.hand(self.id + self.tick.to_bytes(8, "little"))
            except OSError:  # (no memfds here: new blocks from now on)
                self.reuse = False
                self.close()
        block = _new_block(HEADER + need)
        return block.numpy(), block

    def _reused(self, need: int) -> _Block:
        by_age = sorted(self.blocks, key=lambda x: x.used)  # the one longest unused is the likeliest free
        b = next((b for b in by_age if b.size >= need and b.released()), None)
        if b is None:
            idle = [b for b in by_age if not b.pending]
            if len(self.blocks) >= SLOTS and idle:  # a free one too small, else the one longest unused
                old = next((b for b in idle if b.released()), idle[0])
                self.blocks.remove(old)
                old.close()
            g = self.granule
            b = _Block(-(-need * 5 // 4 // g) * g)  # a quarter more, whole granules: a larger batch fits
            self.blocks.append(b)
            self.made += 1
        b.used = self.tick
        return b

    def close(self) -> None:
        for b in self.blocks:
            b.close()
        self.blocks = []


def shared_batch(batch: dict, payload: Ring, small: Ring) -> _Sent:
    """``batch`` as it leaves a DataLoader worker (``_Sent``): the arrays under ``BIG`` bytes in one block of
    ``small``; the clips (packed as ``video_data`` + ``video_offsets``) and the larger arrays in one block
    of ``payload``; each array a view of its block (``_Part`` until it arrives); the other fields as they
    are."""
    arrays = {k: np.ascontiguousarray(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
    clips = batch.get("video")
    if clips is not None:
        arrays["video_offsets"] = _offsets(clips)
    out = {k: v for k, v in batch.items() if k not in arrays and k != "video"}
    few = {k: a for k, a in arrays.items() if a.nbytes < BIG}
    big = {k: a for k, a in arrays.items() if k not in few}
    layout, end = _places(big, HEADER)
    packed = int(arrays["video_offsets"][-1]) if clips is not None else 0
    if big or clips is not None:
        raw, base = payload.block(max(1, end + packed - HEADER))
        _write(raw, big, layout)
        if clips is not None:
            _pack(clips, raw[end : end + packed])
            out["video_data"] = _view(base, end, packed, "|u1", (packed,))
        out.update(_views(base, big, layout))
    if few:
        layout, end = _places(few, HEADER)
        raw, base = small.block(end - HEADER)
        _write(raw, few, layout)
        out.update(_views(base, few, layout))
    return _Sent(_finish(out))


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
        self._rings: tuple[int, Ring, Ring] | None = None  # (pid, rings): a DataLoader worker's (``rings``)
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
        self._begun, self._rings = state["begun"], None

    def rings(self) -> tuple[Ring, Ring]:
        """This process's rings (payload, small arrays), made on a DataLoader worker's first batch (a
        forked copy of the dataset makes its own)."""
        if self._rings is None or self._rings[0] != os.getpid():
            self._rings = (os.getpid(), Ring(), Ring(PAGE))
        return self._rings[1], self._rings[2]

    def __iter__(self) -> Batches:
        return Batches(self)


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
        self._joined = False

    def __iter__(self) -> Batches:
        return self

    def _join(self) -> Position:
        """Open the loader and, in a DataLoader worker, join this pass (once per iterator): the start its
        workers agree on (``passes``). A restored iterator joins too, so that the end of its pass is
        recorded and the next pass starts there."""
        loader, info = self.loader, self.info
        if info is not None and loader.options.decode_backend == "nvdec":
            raise UsageError(
                "decode_backend='nvdec' in DataLoader worker processes: its frames are CUDA tensors, which a "
                "worker process cannot hand over (and CUDA does not start in a forked process)",
                hint="use num_workers=0 (the loader's own threads decode; NVDEC does the heavy work)",
            )
        loader.open()
        self._joined = True
        if info is None:
            return loader.position
        loader._decoding_processes = info.num_workers  # its decoders share the cores out with the others'
        self.ds._begun += 1
        self._name = [info.seed - info.id, self.ds._begun]  # torch draws one base seed a pass, worker i seed + i
        return self.ds._passes.start(self._name, info.num_workers, loader.position)

    def _begin(self) -> None:
        self._seat(self._join(), 0 if self.info is None else self.info.id)

    def _seat(self, start: Position, k: int) -> None:
        self._steps = self.loader.steps(k, self.workers, start)
        self._state = {"loader": self.loader.state_at(start), "worker": k, "workers": self.workers}

    def __next__(self) -> dict | _Sent:
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
        batch = self.loader.build(step)
        batch["state"] = state = self.loader.state_at(after)
        self._state = {"loader": state, "worker": self.workers - 1, "workers": self.workers}
        if self.info is None:
            self.loader.position = after
            return local_batch(batch)
        return shared_batch(batch, *self.ds.rings())

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
        if not self._joined:
            self._join()
        if self.info is None:
            self.loader.position = at
        self._seat(at, k)

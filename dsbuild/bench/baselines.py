"""Floors measured in the same run as our loader, doing the same work without our logic.

  raw        : the split's shard files read in 8 MiB ``preadv`` calls, no parsing, no hashing, in as many
               threads as ours has (`dsbuild bench`; benchmarks also run one thread): the I/O floor of bytes mode.
  sha256     : the same reads plus hashlib's sha256 (OpenSSL, releases the GIL) in as many threads as ours
               has, 8 MiB pieces spread over the threads: the floor of any reader that verifies its bytes.
  webdataset : the ``webdataset`` library's own pipeline iterating the same tar shards (bytes mode).
  pyav       : a bare PyAV decode loop over the split's clips (read into memory first, so decode only), in
               as many threads as ours has, ``thread_type="AUTO"``, the same resize, RGB arrays (frames mode).
  pyav-procs : the same loop in as many processes as ours has worker processes, each decoding its share
               of the same clips (frames mode with ``--workers``: the GIL binds neither).
Each reader continues where its previous slice stopped, so rounds walk the data instead of re-reading its
start. Peer loaders (LitData, Mosaic Streaming) are in ``dsbuild.bench.peers``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from dsbuild.bench import pyavproc
from dsbuild.bench.dataset import Dataset
from dsbuild.bench.measure import Meter
from dsbuild.bench.pyavproc import decode_clip
from dsbuild.core.errors import UsageError, WorkerDied
from dsbuild.core.executor import last_words
from dsbuild.formats.sample import MEMBERS, VIDEO_EXT

PIECE = 8 << 20
TICK_S = 0.01  # how often the PyAV processes' runner looks at its meter
STOP_MARGIN_S = 1.0  # a PyAV process stops by itself this long after the slice (see pyavproc)
CLIP_BUDGET = 256 << 20  # bytes of clips the pyav loop holds in memory (the split's first, in key order)


def run_threads(work, threads: int, meter: Meter) -> None:
    """``work(meter)`` in ``threads`` threads until the meter is over; Ctrl-C stops them all promptly."""
    pool = [
        threading.Thread(target=work, args=(meter,), name=f"dsbuild-bench-{i}", daemon=True) for i in range(threads)
    ]
    for t in pool:
        t.start()
    try:
        for t in pool:
            t.join()
    finally:
        meter.stop()
        for t in pool:
            t.join()


class Pieces:
    """(shard, offset) pieces of the split's shard files, handed out in order, round and round."""

    def __init__(self, data: Dataset):
        self.data = data
        self.order = [(s, a) for s in data.shards for a in range(0, s.bytes, PIECE)]
        self._next = itertools.cycle(range(len(self.order)))
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            return self.order[next(self._next)]

    def read(self, buf: memoryview, meter: Meter, hashed: bool) -> None:
        shard, at = self.take()
        fd = os.open(shard.path, os.O_RDONLY)
        try:
            n = os.preadv(fd, [buf], at)
        finally:
            os.close(fd)
        if hashed:
            hashlib.sha256(buf[:n]).digest()
        share = n / shard.bytes if shard.bytes else 0.0
        meter.add(shard.samples * share, 0, shard.payload * share)


class ShardReads:
    """raw (one thread, no hashing) and sha256 (ours' threads, hashing): whole shard files in pieces."""

    def __init__(self, name: str, data: Dataset, threads: int, hashed: bool):
        self.name, self.threads, self.hashed = name, threads, hashed
        self.pieces = Pieces(data)

    def prepare(self) -> None:
        pass

    def run(self, meter: Meter) -> None:
        def work(m: Meter) -> None:
            buf = memoryview(bytearray(PIECE))
            while not m.over:
                self.pieces.read(buf, m, self.hashed)

        run_threads(work, self.threads, meter)

    def close(self) -> None:
        pass


def raw(data: Dataset, threads: int = 1) -> ShardReads:
    return ShardReads("raw" if threads == 1 else f"raw_{threads}t", data, threads, hashed=False)


def sha256(data: Dataset, threads: int) -> ShardReads:
    return ShardReads("sha256", data, threads, hashed=True)


class Baseline(Protocol):
    """What a run asks of every baseline: the ones here and the peers (``peers.Peer``)."""

    name: str

    def prepare(self) -> None: ...

    def run(self, meter: Meter) -> None: ...

    def close(self) -> None: ...


class Epochs:
    """The items of ``epoch()``, epoch after epoch, measured at the iterator's steady rate: the time an
    epoch takes to give its first item (a peer's per-epoch set-up: Mosaic plans its partitions, LitData
    reads its index, 4-30 ms, several times the rest of a small benchmark epoch) is left out of the
    meter, as a real run's long epochs amortise it. Ours reads ahead across epoch ends, so its own
    set-up is hidden the same way; counting the peers' would flatter us."""

    def __init__(self, epoch: Callable[[], Iterable]):
        self.epoch = epoch
        self.it: Iterator | None = None

    def next(self, meter: Meter):
        if self.it is not None:
            item = next(self.it, _END)
            if item is not _END:
                return item
        started = meter.clock()
        self.it = iter(self.epoch())
        item = next(self.it)
        meter.exclude(meter.clock() - started)
        return item

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()
        self.it = None


_END = object()


def prepared(epochs: Epochs | None, name: str) -> Epochs:
    """A baseline's epochs, which its ``prepare`` makes before ``run`` reads them."""
    if epochs is None:
        raise UsageError(f"baseline {name}: run before it was prepared")
    return epochs


class WebDatasetLib:
    name = "webdataset"

    def __init__(self, data: Dataset):
        self.data = data
        self.samples: Epochs | None = None

    def prepare(self) -> None:
        import webdataset as wds

        urls = [str(s.path) for s in self.data.shards]
        self.samples = Epochs(lambda: wds.WebDataset(urls, shardshuffle=False, empty_check=False))

    def run(self, meter: Meter) -> None:
        sizes = self.data.sizes
        while not meter.over:
            sample = prepared(self.samples, self.name).next(meter)
            meter.add(1, 0, sizes.get(sample["__key__"], 0))

    def close(self) -> None:
        if self.samples is not None:
            self.samples.close()


def held_clips(data: Dataset) -> list[tuple[bytes, int]]:
    """(clip bytes, sample payload bytes) of the split's first clips in key order, up to ``CLIP_BUDGET``:
    what the PyAV loops decode, from memory."""
    clips: list[tuple[bytes, int]] = []
    held = 0
    video = MEMBERS.index(VIDEO_EXT)
    for entry, members in data.source.members(data.items()):
        clip = bytes(members[video][1])
        clips.append((clip, data.sizes[entry.key]))
        held += len(clip)
        if held >= CLIP_BUDGET:
            break
    return clips


class PyAV:
    name = "pyav"

    def __init__(self, data: Dataset, threads: int, resize: tuple[int, ...] | None):
        self.data, self.threads, self.resize = data, threads, resize
        self.clips: list[tuple[bytes, int]] = []

    def prepare(self) -> None:
        self.clips = held_clips(self.data)
        self._next = itertools.cycle(range(len(self.clips)))
        self._lock = threading.Lock()

    def _decode(self, meter: Meter) -> None:
        def decoded() -> bool:
            meter.add(0, 1, 0)
            return meter.over

        while not meter.over:
            with self._lock:
                clip, size = self.clips[next(self._next)]
            if not decode_clip(clip, self.resize, self.keep, decoded):
                return
            meter.add(1, 0, size)

    def keep(self, frame) -> None:
        """What the loop does with a decoded frame: nothing (the floor of decoding)."""

    def run(self, meter: Meter) -> None:
        run_threads(self._decode, self.threads, meter)

    def close(self) -> None:
        self.clips = []


class PyAVProcs:
    """The bare PyAV loop in ``processes`` processes (``python -m dsbuild.bench.pyavproc``, see there): the
    floor of the loader's worker processes, which the GIL does not bind either. The clips are written once
    to a file in ``scratch``; each process is given its share (every N-th clip) by offset in a JSON
    argument, reads it into memory and decodes it round and round, with the same resize. The figure is
    the processes' total over the meter's window. Started by ``prepare`` (once per bench run), so start-up
    and the clip reads stay out of the measurement, as the loader's own start-up does."""

    name = "pyav-procs"

    def __init__(self, data: Dataset, processes: int, resize: tuple[int, ...] | None, scratch: Path):
        self.data, self.processes, self.resize, self.scratch = data, processes, resize, scratch
        self.procs: list[subprocess.Popen] = []
        self.answers: list[pyavproc.Commands] = []  # each process's lines, read without a thread
        self.logs: list = []

    def prepare(self) -> None:
        clips = held_clips(self.data)
        if not clips:
            raise UsageError(f"baseline {self.name}: the split has no clips to decode")
        path = self.scratch / "pyav-clips.bin"
        places, at = [], 0
        with path.open("wb") as f:
            for clip, size in clips:
                f.write(clip)
                places.append([at, len(clip), size])
                at += len(clip)
        for i in range(self.processes):
            share = places[i :: self.processes] or [places[i % len(places)]]  # (fewer clips than processes)
            spec = {
                "clips": str(path),
                "share": share,
                "resize": list(self.resize) if self.resize else None,
                "decoders": self.processes,
            }
            log = tempfile.TemporaryFile()  # noqa: SIM115 (the process's stderr, closed in close())
            self.logs.append(log)
            proc = subprocess.Popen(
                [sys.executable, "-m", "dsbuild.bench.pyavproc", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            self.procs.append(proc)
            self.answers.append(pyavproc.Commands(proc.stdout.fileno()))  # type: ignore[union-attr]
        for i in range(self.processes):
            self._receive(i, pyavproc.READY)

    def run(self, meter: Meter) -> None:
        """The processes decode from ``go`` until the meter is over, then ``stop``; their counts are read
        here, in the caller's thread (no thread is started while they decode). Decoders that never sleep
        can keep this process off every core for tens of seconds (seen on 2 loaded cores), and its
        ``stop`` with it: each process also stops by itself ``STOP_MARGIN_S`` after the slice."""
        going = set(range(self.processes))
        for i in going:
            self._send(i, pyavproc.go_line(meter.remaining() + STOP_MARGIN_S))
        stopping = False
        try:
            while going:
                if not stopping and meter.over:
                    for i in going:
                        self._send(i, pyavproc.STOP)
                    stopping = True
                select.select([self.answers[i].fd for i in going], [], [], TICK_S)
                for i in sorted(going):
                    while i in going and self.answers[i].arrived():
                        counts = self._receive(i, pyavproc.STOPPED)
                        if counts is None:
                            going.discard(i)
                        else:
                            meter.add(*counts)
        finally:
            if not stopping:  # (a process failed, or Ctrl-C: the others stop too)
                for i in going:
                    self._send(i, pyavproc.STOP)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.close()  # (its input closed, a process exits)
        for p, log in zip(self.procs, self.logs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
            log.close()
        self.procs, self.answers, self.logs = [], [], []

    def _send(self, i: int, line: bytes) -> None:
        stdin = self.procs[i].stdin
        if stdin is None or self.procs[i].poll() is not None:
            return  # (a dead process is reported by its reader)
        try:
            stdin.write(line)
            stdin.flush()
        except BrokenPipeError:
            pass

    def _receive(self, i: int, until: str) -> list[float] | None:
        """Process ``i``'s next counts [samples, frames, bytes], or None at its ``until`` line; a process
        that exited is ``WorkerDied`` naming it and its last line of stderr."""
        p = self.procs[i]
        line = self.answers[i].next()
        if not line:
            p.wait()
            said = last_words(self.logs[i])
            raise WorkerDied(
                f"bench baseline {self.name}: process {i} of {self.processes} exited (code {p.returncode})"
                + (f": {said}" if said else "")
            )
        return pyavproc.parse_answer(line, until, f"{self.name} process {i}")

"""One round of our loader, measured: throughput, time to first batch, resume, and a simulated training loop.

A round runs three phases on real batches:
  throughput : a fresh loader, consumed as fast as it delivers for ``seconds``. Its time to first batch
               (construction, index load, pipeline fill) is one figure; the rates are steady-state, the
               batches after the first over the time after the first.
  resume     : a new loader restored from the mid-epoch state_dict() the throughput phase ended at,
               timed from construction to its first batch.
  training   : that restored loader feeding a ``step`` of ``step_ms`` for ``step_seconds``: the wait for
               each batch (next() including the host->device copy) and the fraction of wall time spent
               waiting.
Stage seconds come from ``loader.stats()`` (timestamps taken in the pipeline, per thread), so the
decomposition is attribution, not estimation:
  consumer : wall = wait + h2d + step + other (loop overhead, planning on the consumer's thread)
  pipeline : per worker thread, busy = read + decode + collate, utilisation = busy / wall.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from dsbuild.bench.dataset import Dataset
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.summary import percentiles, rate
from dsbuild.core.errors import DsbuildError

MIN_STEPS = 2  # the training phase always runs at least this many steps, however short its time
STAGES = ("read", "decode", "collate")
TICK_S = 0.25

Progress = Callable[[dict], None]


class Ticker:
    """Reports current rates to ``progress`` at most every TICK_S seconds (for the live display)."""

    def __init__(self, progress: Progress | None, name: str, round_: int, seconds: float):
        self.progress, self.name, self.round, self.seconds = progress, name, round_, seconds
        self.last = 0.0

    def __call__(self, elapsed: float, samples: float, frames: float, nbytes: float, force: bool = False) -> None:
        if self.progress is None or (not force and elapsed - self.last < TICK_S):
            return
        self.last = elapsed
        e = max(elapsed, 1e-9)
        self.progress({"measurement": self.name, "round": self.round, "elapsed": elapsed, "seconds": self.seconds,
                       "samples_per_s": samples / e, "frames_per_s": frames / e, "mb_per_s": nbytes / e / 1e6})


def loader_kwargs(o: BenchOptions, data: Dataset, device: str | None, rank: int = 0, world: int = 1) -> dict:
    return {"seed": o.seed, "batch_size": o.batch_size, "num_workers": o.workers, "decode": o.decode,
            "resize": o.resize, "bucket_by": data.bucket_by if o.decode == "frames" and o.resize is None else None,
            "device": device, "verify": o.verify, "rank": rank, "world_size": world}


def endless(loader) -> Iterator[dict]:
    """The loader's batches across epoch ends; closing this closes the loader's iterator (its threads)."""
    empty = 0
    while True:
        it = iter(loader)
        n = 0
        try:
            for batch in it:
                n += 1
                yield batch
        finally:
            it.close()
        empty = 0 if n else empty + 1
        if empty > 1:
            raise DsbuildError("the loader delivered no batches for two epochs (more ranks than batches?)")


def _frames(batch: dict) -> int:
    return int(batch["lengths"].sum())


def _batch_bytes(data: Dataset, batch: dict) -> int:
    return sum(data.sample_bytes.get(k, 0) for k in batch["keys"])


def _stage_split(stats: dict, consumer: str, wall: float) -> dict:
    """Per worker thread: seconds per stage, busy and utilisation over ``wall``; plus totals."""
    workers = {}
    for name, secs in stats["threads"].items():
        if name == consumer:
            continue
        busy = sum(secs.get(s, 0.0) for s in STAGES)
        workers[name] = {**{s: secs.get(s, 0.0) for s in STAGES}, "busy": busy, "batches": int(secs.get("batches", 0)),
                         "wall": wall, "utilisation": busy / wall if wall > 0 else None}
    totals = {s: stats["seconds"][s] for s in STAGES}
    return {"wall": wall, **totals, "busy": sum(totals.values()), "workers": workers}


def _minus(after: dict, before: dict) -> dict:
    """stats() difference (seconds per stage and per thread)."""
    threads = {}
    for name, secs in after["threads"].items():
        old = before["threads"].get(name, {})
        threads[name] = {k: v - old.get(k, 0) for k, v in secs.items()}
    return {"seconds": {k: v - before["seconds"][k] for k, v in after["seconds"].items()}, "threads": threads}


def measure_ours(o: BenchOptions, data: Dataset, device: str | None, step, seconds: float, step_seconds: float,
                 *, rank: int = 0, world: int = 1, round_: int = 0, progress: Progress | None = None) -> dict:
    """One round of our loader (see the module docstring). ``step`` is a ``dsbuild.bench.step.Step``."""
    from dsbuild.loader import Loader

    consumer = threading.current_thread().name
    kw = loader_kwargs(o, data, device, rank, world)
    tick = Ticker(progress, "ours", round_, seconds)
    # -- throughput ----------------------------------------------------------------------------
    t0 = time.perf_counter()
    loader = Loader(data.ref, data.split, **kw)
    loader.state_dict()  # opens it: the index and the epoch plans
    t_open = time.perf_counter()
    gen = endless(loader)
    min_batches = o.threads + 2  # at least one whole cycle of the workers after the first batch
    n_batches = n_samples = n_frames = n_bytes = 0
    points: list[tuple[float, float]] = []
    first = None
    try:
        while True:
            batch = next(gen)
            now = time.perf_counter()
            if first is None:
                first, t_first, first_samples, first_frames, first_bytes = \
                    now - t0, now, len(batch["keys"]), _frames(batch), _batch_bytes(data, batch)
            n_batches += 1
            n_samples += len(batch["keys"])
            n_frames += _frames(batch)
            n_bytes += _batch_bytes(data, batch)
            points.append((now - t_open, n_samples))
            tick(now - t_open, n_samples, n_frames, n_bytes)
            if now - t_open >= seconds and n_batches >= min_batches:
                break
        t_last = now
        state = loader.state_dict()
        # Rates are steady-state: the batches after the first, over the time after the first (which is
        # reported as first_batch_s). Workers finish batches in bursts; from the first batch of one burst
        # to the first of a later one is whole cycles, while the slice end falls between bursts.
        n_steady = n_samples - first_samples
        steady = t_last - t_first
    finally:
        gen.close()
    t_closed = time.perf_counter()
    stats = loader.stats()
    wall = t_last - t_open
    s = stats["seconds"]
    out = {
        "samples": n_samples, "frames": n_frames, "bytes": n_bytes, "batches": n_batches, "seconds": wall,
        "samples_per_s": rate(n_steady, steady), "frames_per_s": rate(n_frames - first_frames, steady),
        "mb_per_s": rate((n_bytes - first_bytes) / 1e6, steady), "batches_per_s": rate(n_batches - 1, steady),
        "first_batch_s": first, "open_s": t_open - t0, "corrupt": stats["corrupt"],
        "timeline": points,
        "throughput": {
            "consumer": {"wall": wall, "wait": s["wait"], "h2d": s["h2d"], "step": 0.0,
                         "other": wall - s["wait"] - s["h2d"]},
            "pipeline": _stage_split(stats, consumer, t_closed - t_open),
        },
    }
    # -- resume --------------------------------------------------------------------------------
    t0 = time.perf_counter()
    restored = Loader(data.ref, data.split, **kw)
    restored.load_state_dict(state)
    gen = endless(restored)
    try:
        batch = next(gen)
        out["resume_s"] = time.perf_counter() - t0
        out["training"] = _training(restored, gen, batch, data, step, step_seconds, consumer, tick) \
            if step.ms > 0 else None
    finally:
        gen.close()
    return out


def _training(loader, gen: Iterator[dict], batch: dict, data: Dataset, step, seconds: float, consumer: str,
              tick: Ticker) -> dict:
    """Feed ``step`` from ``gen`` for ``seconds``: per-step data wait, wait fraction, GPU busy time."""
    before = loader.stats()
    busy0 = step.gpu_busy_s
    waits: list[float] = []
    step_s = 0.0
    n_samples = n_frames = n_bytes = 0
    t_start = time.perf_counter()
    tick.name = "ours+step"
    while True:
        t = time.perf_counter()
        step(batch)
        now = time.perf_counter()
        step_s += now - t
        if now - t_start >= seconds and len(waits) >= MIN_STEPS:
            break
        t = time.perf_counter()
        batch = next(gen)
        waits.append(time.perf_counter() - t)
        n_samples += len(batch["keys"])
        n_frames += _frames(batch)
        n_bytes += _batch_bytes(data, batch)
        tick(time.perf_counter() - t_start, n_samples, n_frames, n_bytes)
    wall = time.perf_counter() - t_start
    gen.close()
    t_closed = time.perf_counter()
    d = _minus(loader.stats(), before)
    waited = sum(waits)
    gpu_busy = step.gpu_busy_s - busy0
    return {
        "steps": len(waits) + 1, "seconds": wall, "samples_per_s": rate(n_samples, wall),
        "frames_per_s": rate(n_frames, wall), "waits": waits, "wait_fraction": waited / wall,
        "wait_ms": {k: (v * 1000 if v is not None else None) for k, v in percentiles(waits).items()},
        "gpu_busy_s": gpu_busy if step.cuda else None,
        "gpu_idle_fraction": max(0.0, 1 - gpu_busy / wall) if step.cuda else None,
        "consumer": {"wall": wall, "data_wait": waited, "wait": d["seconds"]["wait"], "h2d": d["seconds"]["h2d"],
                     "step": step_s, "other": wall - waited - step_s},
        "pipeline": _stage_split(d, consumer, t_closed - t_start),
    }

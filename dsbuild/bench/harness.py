"""One round of our loader: throughput, time to first batch, resume, and a simulated training loop.

  throughput : a fresh ``Loader`` (constructed and opened inside the slice: its index load is part of the
               round) consumed as fast as it delivers. Its first cycle (one batch per worker thread) fills
               the pipeline and gives the time to first batch (from construction); the rates are everything
               delivered after it, over the time after it, up to the end of a whole cycle once the slice is
               spent. Threads finish batches in bursts and deliver in order: a window of whole cycles counts
               the work of every thread, where a window cut inside a burst, or from a cold start, would count
               fill and drop finished work (tens of percent when a slice holds few batches).
  resume     : a new loader restored from the state_dict() the throughput phase ended at, timed from
               construction to its first batch, inside the same slice (the throughput window leaves
               room for it: about one time to first batch).
  training   : that restored loader feeding a ``step`` of ``step_ms`` for its own slice: the wait for each
               batch (``next()``, host->device copy included) and the fraction of wall time spent waiting.
The round is a ``OursRound`` record, so rank processes hand it to the parent as JSON.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from dsbuild.bench.measure import Measured, Meter
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.stages import Stages, stages
from dsbuild.core.errors import UsageError
from dsbuild.core.records import Record
from dsbuild.loader.parallel import parse_layout


@dataclass(frozen=True, slots=True)
class OursRound(Record):
    throughput: Measured
    training: Measured | None  # None with step_ms 0
    open_s: float  # construction + index load
    first_batch_s: float  # construction -> first batch
    resume_s: float  # restore from a mid-epoch state -> first batch
    waits_ms: tuple[float, ...]  # per batch, throughput phase: the consumer blocked in next()
    step_waits_ms: tuple[float, ...]  # per step, training phase
    gpu_busy_s: float | None  # CUDA event time of the steps (None on CPU)
    corrupt: int
    throughput_stages: Stages
    training_stages: Stages | None
    notes: tuple[str, ...]  # what the loader chose on the user's behalf (device, decoder)
    ranks: int = 1  # ranks combined into this round (their step waits add up over ranks x seconds)


SHORT_EPOCH = 4  # batches per loader thread per epoch below which epoch ends weigh on the figures
SHORT_WINDOW = 0.5  # the share of a round's slice below which ours' measured window is named too short


def short_epochs(batches: int, threads: int) -> list[str]:
    """A note when epochs are too short for the threads: the loader reads ahead into the next epoch
    only, so threads idle at epoch ends (a GPU run gave 8 threads 2 batches per epoch, and a figure that
    said more about the data than the loader)."""
    if batches >= SHORT_EPOCH * threads:
        return []
    return [
        f"{batches} batch{'' if batches == 1 else 'es'} per epoch for {threads} threads: the pipeline reads "
        "ahead into the next epoch only, so "
        "threads idle at epoch ends and the figures understate steady throughput (use more samples or a "
        "smaller --batch-size)"
    ]


def short_window(measured: float, slice_s: float) -> list[str]:
    """A note when the loader's start-up (its worker processes, the first batch, the pipeline filling)
    took most of a round's slice: the figure then comes from a window too short to mean much (a sweep
    of ``--duration 20`` over 3 rounds and 2 points gave each 3.3 s, of which worker processes' start-up
    took about 2: 1 -> 2 workers read 2.1x there, 1.3x over 15-s slices)."""
    if measured >= SHORT_WINDOW * slice_s:
        return []
    return [
        f"throughput measured over {measured:.1f} s of a {slice_s:.1f} s slice (start-up took the rest): "
        "too short a window to mean much (give a longer --duration)"
    ]


def loader_kwargs(o: BenchOptions, bucket_by: str | None, device: str | None, rank: int, world: int) -> dict:
    return {
        "seed": o.seed,
        "batch_size": o.batch_size,
        "num_workers": o.workers or o.threads,
        "worker_mode": "thread" if o.workers is None else "process",  # (--threads: threads, whatever their count)
        "decode": o.decode,
        "decode_backend": o.decode_backend,
        "resize": tuple(o.resize) if o.resize else None,
        "bucket_by": bucket_by if o.decode == "frames" and o.resize is None else None,
        "device": device,
        "verify": o.verify,
        "rank": rank,
        "world_size": world,
        "parallel": parse_layout(o.parallel) if o.parallel else None,
    }


def endless(loader) -> Generator[dict, None, None]:
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
            raise UsageError(
                "the loader delivered no batches to this rank for two epochs: an epoch holds fewer "
                "batches than there are ranks",
                hint="use fewer --ranks or a smaller --batch-size",
            )


class Counter:
    """Counts a batch's samples, frames and payload bytes the way every baseline counts them."""

    def __init__(self, sizes: dict[str, int], decode: str):
        self.sizes, self.frames = sizes, decode == "frames"

    def __call__(self, meter: Meter, batch: dict) -> None:
        keys = batch["keys"]
        meter.add(len(keys), int(batch["lengths"].sum()) if self.frames else 0, sum(self.sizes[k] for k in keys))


def measure_ours(
    o: BenchOptions,
    ref: str,
    bucket_by: str | None,
    sizes: dict[str, int],
    device: str | None,
    step,
    seconds: float,
    step_seconds: float,
    *,
    start_s: float = 0.0,
    round_: int = 0,
    rank: int = 0,
    world: int = 1,
    tick: Callable[[Meter], None] | None = None,
) -> OursRound:
    """One round (see the module docstring). ``step`` is a ``dsbuild.bench.step.Step``."""
    from dsbuild.loader import Loader

    consumer = threading.current_thread().name
    kw = loader_kwargs(o, bucket_by, device, rank, world)
    count = Counter(sizes, o.decode)
    t0 = time.perf_counter()
    loader = Loader(ref, o.split, **kw)
    loader.open()
    opened = time.perf_counter()
    per_epoch = len(loader)  # batches of this rank in an epoch (the loader starts at an epoch's beginning)
    before = loader.stats()
    gen = endless(loader)
    waits: list[float] = []

    def take() -> dict:
        t = time.perf_counter()
        batch = next(gen)
        waits.append((time.perf_counter() - t) * 1000)
        return batch

    try:
        take()
        first = time.perf_counter() - t0
        for _ in range(o.threads - 1):  # the rest of the first cycle: the pipeline filling up
            take()
        filled = time.perf_counter()
        # the slice also holds the resume below, which costs about what the first batch did
        meter = Meter(
            "ours",
            round_,
            start_s + filled - t0,
            max(0.0, seconds - (filled - t0) - first),
            decodes=o.decode == "frames",
            tick=tick,
        )
        while not (meter.over and len(waits) % o.threads == 0):
            count(meter, take())
        throughput = meter.result()
        state = loader.state_dict()
    finally:
        gen.close()
    # the consumer's phase runs from iteration start to the last batch; the workers' until the pipeline closed
    throughput_stages = stages(
        before, loader.stats(), consumer, filled - opened + throughput.seconds, time.perf_counter() - opened
    )
    t = time.perf_counter()
    restored = Loader(ref, o.split, **kw)
    restored.load_state_dict(state)
    gen = endless(restored)
    try:
        batch = next(gen)
        resume_s = time.perf_counter() - t
        training = (
            _training(
                restored,
                gen,
                batch,
                count,
                step,
                step_seconds,
                consumer,
                start_s + time.perf_counter() - t0,
                round_,
                o.decode,
                tick,
            )
            if step.ms > 0
            else None
        )
    finally:
        gen.close()
    corrupt = loader.stats()["corrupt"] + restored.stats()["corrupt"]
    return OursRound(
        throughput=throughput,
        training=training[0] if training else None,
        open_s=opened - t0,
        first_batch_s=first,
        resume_s=resume_s,
        waits_ms=tuple(waits),
        step_waits_ms=training[1] if training else (),
        gpu_busy_s=training[2] if training else None,
        corrupt=corrupt,
        throughput_stages=throughput_stages,
        training_stages=training[3] if training else None,
        notes=tuple(
            dict.fromkeys(
                [
                    *loader.stats()["notes"],
                    *short_epochs(per_epoch, o.threads),
                    *short_window(throughput.seconds, seconds),
                ]
            )
        ),
    )


def _training(
    loader,
    gen: Generator[dict, None, None],
    batch: dict,
    count: Counter,
    step,
    seconds: float,
    consumer: str,
    start_s: float,
    round_: int,
    decode: str,
    tick: Callable[[Meter], None] | None,
):
    """Feed ``step`` from ``gen`` for ``seconds``: (Measured, per-step waits in ms, GPU busy s, Stages)."""
    before = loader.stats()
    busy0 = step.gpu_busy_s
    meter = Meter("ours+step", round_, start_s, seconds, decodes=decode == "frames", tick=tick)
    waits: list[float] = []
    stepping = 0.0
    while True:
        t = time.perf_counter()
        step(batch)
        stepping += time.perf_counter() - t
        count(meter, batch)
        if meter.over:
            break
        t = time.perf_counter()
        batch = next(gen)
        waits.append((time.perf_counter() - t) * 1000)
    measured = meter.result()
    gen.close()
    return (
        measured,
        tuple(waits),
        step.gpu_busy_s - busy0 if step.cuda else None,
        stages(before, loader.stats(), consumer, measured.seconds, meter.elapsed(), stepping),
    )

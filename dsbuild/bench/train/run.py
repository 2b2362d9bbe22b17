"""``bench --model``: train a world model on the version's batches and measure the steps.

One job per scaling point: the base point (1 rank, or the smallest world asked for), weak scaling (each
larger world with the same per-rank batch) and strong scaling (each larger world with the base's global
batch split among its ranks, when it divides). The jobs run as one interleaved run: each is started in
turn and warmed up (its CPU peak measured while the others wait), then the profiled steps are cut into
``rounds`` and the points take turns, round after round (the order rotating), so load on the machine
falls on every point alike; efficiency is the median of the rounds' paired ratios.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from dsbuild.bench import models
from dsbuild.bench.train.launch import Job
from dsbuild.bench.train.options import TrainOptions
from dsbuild.bench.train.report import (
    DatasetRef,
    ModelInfo,
    Point,
    RankRun,
    TrainReport,
    cost,
    paired_efficiency,
    point,
    verdict,
)
from dsbuild.bench.train.worker import round_steps
from dsbuild.core.errors import MissingDependency, StorageError, UsageError


def require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingDependency("bench --model", "torch") from None


def available_memory(cuda: bool) -> int | None:
    """Bytes one rank may use: the GPU's total memory on CUDA, else what the host has available (shared by
    every rank)."""
    if cuda:
        import torch

        return torch.cuda.mem_get_info(0)[1]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(o: TrainOptions, actions: int, cuda: bool) -> None:
    """A model that cannot fit is refused before any rank starts, in one line."""
    world, (height, width) = max(o.ranks), o.resize[:2]
    size = models.size(o.model)
    shards = world if o.parallel == "fsdp" else 1
    need = models.memory_bytes(size, o.clip_frames, height, width, actions, o.batch_size, shards)
    params = models.parameters(size, o.clip_frames, height, width, actions)
    have = available_memory(cuda)
    total = need if cuda else need * world
    if have is not None and total > have:
        where = "per GPU" if cuda else f"for {world} rank(s) on this host"
        raise StorageError(
            f"model {o.model} ({params / 1e6:.1f} M parameters, batch {o.batch_size} of {o.clip_frames}x{height}x"
            f"{width} clips) needs about {total / 1e9:.1f} GB {where}; {have / 1e9:.1f} GB available",
            hint="a smaller --model, --batch-size, --clip-frames or --resize",
        )


def plan(o: TrainOptions) -> tuple[list[tuple[str, int, int]], list[str]]:
    """The jobs: (kind, world, per-rank batch), and notes on points that cannot be run."""
    ranks = sorted(o.ranks)
    base = ranks[0]
    jobs = [("base", base, o.batch_size)]
    notes = []
    for w in ranks[1:]:
        jobs.append(("weak", w, o.batch_size))
        if (o.batch_size * base) % w == 0:
            jobs.append(("strong", w, o.batch_size * base // w))
        else:
            notes.append(
                f"no strong-scaling point at {w} ranks: the global batch {o.batch_size * base} does not divide"
            )
    return jobs, notes


def run_train(o: TrainOptions, progress: Callable[[str], None] | None = None) -> TrainReport:
    require_torch()
    models.size(o.model)
    models.check_shape(o.clip_frames, o.resize[0], o.resize[1])
    import torch

    from dsbuild.bench.dataset import describe
    from dsbuild.bench.report import machine

    cuda = torch.cuda.is_available()
    if cuda and max(o.ranks) > torch.cuda.device_count():
        raise UsageError(f"--ranks {max(o.ranks)}: this host has {torch.cuda.device_count()} GPU(s)")
    data = describe(o.ref, o.split)
    check_memory(o, 5, cuda)
    jobs, notes = plan(o)
    # every point gives a rank the same share of the host's cores, so points differ in ranks alone
    threads = max(1, (os.cpu_count() or 1) // max(o.ranks))
    tokens = models.tokens(o.clip_frames, o.resize[0], o.resize[1])
    points = [
        point(kind, runs, tokens)
        for (kind, _, _), runs in zip(jobs, _interleaved(o, data.ref, jobs, threads, progress))
    ]
    base = points[0]
    points = [p if p.kind == "base" else _with_efficiency(p, paired_efficiency(p.kind, base, p)) for p in points]
    top = max((p for p in points if p.kind != "strong"), key=lambda p: p.world)
    restart = None
    if o.restart:
        from dsbuild.bench.train.restart import measure_restart

        if progress:
            progress(f"restart: {top.world} rank(s), one killed")
        restart = measure_restart(o, data.ref, top.world, top.batch_size, threads)
    first = top.ranks[0]
    fed = verdict(top, o.threads)
    return TrainReport(
        options=o,
        dataset=DatasetRef(data.facts.version_id, data.facts.split, data.facts.samples),
        model=ModelInfo(o.model, first.params, tokens, o.parallel, o.dtype),
        device=first.device,
        peak=first.peak,
        software=first.software,
        machine=machine(first.peak.device if cuda else None),
        points=tuple(points),
        verdict=fed,
        cost=None if o.price_per_hour is None else cost(top, fed, o.price_per_hour, data.facts.samples),
        restart=restart,
        notes=tuple(notes),
    )


def _interleaved(
    o: TrainOptions, ref: str, jobs: list[tuple[str, int, int]], threads: int, progress: Callable[[str], None] | None
) -> list[list[RankRun]]:
    """Every job's ranks' measurements, the jobs started in turn, then run round by round (see the module
    docstring)."""
    rounds = len(round_steps(o.steps, o.rounds))
    running: list[Job] = []
    try:
        for kind, world, batch in jobs:
            if progress:
                progress(f"start-up: {kind}, {world} rank(s) x batch {batch}")
            setup = {
                "options": o.to_json(),
                "ref": ref,
                "batch_size": batch,
                "torch_threads": threads,
                "rounds": rounds,
            }
            running.append(Job(setup, world, o.timeout_s))
            running[-1].start()
        for k in range(rounds):
            for i in [(k + j) % len(jobs) for j in range(len(jobs))]:  # rotated: no point always first
                if progress:
                    kind, world, batch = jobs[i]
                    progress(f"round {k + 1}/{rounds}: {kind}, {world} rank(s) x batch {batch}")
                running[i].round(k)
        outcomes = [job.finish() for job in running]
    finally:
        for job in running:
            job.close()
    return [[RankRun.from_json(r, f"rank {i}") for i, r in enumerate(out.results)] for out in outcomes]


def _with_efficiency(p: Point, e: float) -> Point:
    import dataclasses

    return dataclasses.replace(p, efficiency=e)

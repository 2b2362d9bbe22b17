"""A bench run: start-up, then ours and the baselines in interleaved rounds within ``--duration``, then one
report (and, against a saved report, the gate's verdicts).

Rounds run the measurements in a rotated order, so none always runs first (cold cache, CPU boost), and
only whole rounds count: a ratio pairs two measurements of the same round. Ctrl-C during the rounds ends
the run with ``BenchInterrupted`` carrying the report of the rounds finished so far.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsbuild.bench.baselines import Baseline
from dsbuild.bench.budget import Budget
from dsbuild.bench.compare import choose, wanted
from dsbuild.bench.dataset import Dataset, check_split, describe
from dsbuild.bench.gate import MIN_ROUNDS, Against
from dsbuild.bench.harness import OursRound
from dsbuild.bench.measure import UNITS, Measured, Meter
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.ranks import FRESH_LIMIT, RankGroup, combine, cuda_available, start_server
from dsbuild.bench.report import BenchReport, Resolved, RunTime, machine
from dsbuild.bench.stats import rotate
from dsbuild.bench.step import H2D, StepInfo, h2d_bandwidth


@dataclass(frozen=True)
class Event:
    """Progress: start-up steps (``round`` None), then each measurement as it runs."""

    what: str  # "opening the version", "preparing litdata", "ours", "pyav", ...
    round: int | None
    rounds: int
    elapsed: float  # seconds of the budget spent
    duration: float  # the budget
    rate: float | None  # the running measurement's figure so far
    unit: str


Progress = Callable[[Event], None]


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during the rounds; ``report`` holds the rounds finished before it, ``signal`` the
    interrupt itself (the CLI raises it again once the report is out: its type decides the exit code)."""

    def __init__(self, report: BenchReport, signal: KeyboardInterrupt):
        super().__init__("interrupted")
        self.report, self.signal = report, signal


def batch_bytes(o: BenchOptions, data: Dataset) -> int:
    """Bytes of one batch as it crosses to the device (frames, or encoded clips): sizes the H2D test."""
    per_sample = data.facts.bytes / data.facts.samples
    if o.decode == "bytes":
        return int(o.batch_size * per_sample)
    w, h = (
        (o.resize[1], o.resize[0])
        if o.resize
        else max((tuple(map(int, r.split("x"))) for r in data.facts.resolutions), key=lambda s: s[0] * s[1])
    )
    return int(o.batch_size * data.facts.frames / data.facts.samples * h * w * 3)


def run_bench(
    o: BenchOptions,
    progress: Progress | None = None,
    against: Against | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BenchReport:
    """Measure (see the module docstring) and return the report; ``against`` gates it against a saved one
    (refusing, before measuring, runs that are not comparable). Our loader runs in processes started with
    the fork server (see ``dsbuild.bench.ranks``); the baselines in this one."""
    from dsbuild.loader.backends import choose_backend, probe
    from dsbuild.loader.device import resolve_device

    t_start, started = clock(), time.time()
    unit = UNITS[o.decode][0]

    def say(what: str, round_: int | None = None, elapsed: float = 0.0, rate: float | None = None) -> None:
        if progress is not None:
            progress(Event(what, round_, o.rounds, elapsed, o.duration, rate, unit))

    check_split(o.split)  # usage errors of the options alone before the fork server starts (1.5 s here)
    wanted(o)
    start_server()
    say("opening the version")
    data = describe(o.ref, o.split)
    cuda = cuda_available() if o.device is not None or o.decode == "frames" else False
    device, _ = resolve_device(o.device, cuda=cuda)
    if o.decode == "frames":
        cuda, installed = probe(cuda)
        backend = choose_backend(o.decode_backend, cuda=cuda, installed=installed)
    else:
        backend = None
    resolved = Resolved(
        device or "numpy",
        backend.name if backend else None,
        data.bucket_by if o.decode == "frames" and o.resize is None else None,
    )
    gpu = None
    if device and device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(torch.device(device))
    scratch = Path(tempfile.mkdtemp(prefix="dsbuild-bench-"))
    active: list[Baseline] = []
    groups: list = []
    try:
        active, skipped = choose(o, data, scratch)
        diffs = (
            against.check(
                {**o.settings(), **resolved.to_json()}, data.facts.to_json(), {b.name for b in active}, o.rounds
            )
            if against
            else ()
        )
        for b in active:
            say(f"preparing {b.name}")
            b.prepare()
        fresh = o.rounds * o.ranks <= FRESH_LIMIT
        say(f"starting {o.rounds if fresh else 1} x {o.ranks} loader process(es)")
        setup = {"options": o.to_json(), "ref": data.ref, "device": device}
        groups = [RankGroup(setup, o.ranks) for _ in range(o.rounds if fresh else 1)]
        for g in groups:
            g.start()
        ready = [StepInfo.from_json(doc, "rank step") for g in groups for doc in g.ready()]  # (waits for all)
        step_info = ready[0]
        startup_s = clock() - t_start
        per_round = 1 + (o.step_ms > 0) + len(active)
        budget = Budget(o.duration, o.rounds, per_round, clock)
        ours: list[OursRound] = []
        per_rank: list[list[OursRound]] = []
        measured: dict[str, list[Measured]] = {b.name: [] for b in active}
        by_name = {b.name: b for b in active}

        def tick(name: str, elapsed: float, frames: float, nbytes: float, round_: int = 0) -> None:
            t = max(elapsed, 1e-9)
            say(name, round_, budget.elapsed(), frames / t if o.decode == "frames" else nbytes / t * UNITS["bytes"][1])

        interrupted: KeyboardInterrupt | None = None
        try:
            for r in range(o.rounds):
                if not budget.can_start_round(len(ours)):
                    break
                got: dict[str, Measured] = {}
                for name in rotate(["ours", *by_name], r):
                    seconds = budget.slice()
                    say(name, r, budget.elapsed())
                    if name == "ours":
                        group = groups[r if fresh else 0]
                        parts = group.round(
                            {
                                "round": r,
                                "seconds": seconds,
                                "start_s": budget.elapsed(),
                                "step_seconds": seconds if o.step_ms > 0 else 0.0,
                            },
                            lambda name, elapsed, frames, nbytes, r=r: tick(name, elapsed, frames, nbytes, round_=r),
                        )
                        if fresh:
                            group.stop()
                        mine = parts[0] if o.ranks == 1 else combine(parts)
                        budget.spend(1 + (o.step_ms > 0))
                    else:
                        meter = Meter(
                            name,
                            r,
                            budget.elapsed(),
                            seconds,
                            decodes=name.startswith("pyav"),
                            tick=lambda m: tick(m.name, m.elapsed(), m.frames, m.bytes, m.round),
                        )
                        by_name[name].run(meter)
                        got[name] = meter.result()
                        budget.spend()
                ours.append(mine)
                if o.ranks > 1:
                    per_rank.append(parts)
                for name, m in got.items():
                    measured[name].append(m)
        except KeyboardInterrupt as e:
            interrupted = e
        measured_s = budget.elapsed()
        h2d = (
            H2D(0, None, None, "not measured: interrupted")
            if interrupted is not None
            else h2d_bandwidth(device, batch_bytes(o, data))
        )
        report = _report(
            o,
            data,
            resolved,
            machine(gpu),
            started,
            RunTime(o.duration, measured_s, startup_s, o.rounds, len(ours), interrupted is not None),
            ours,
            per_rank,
            measured,
            skipped,
            step_info,
            h2d,
            backend.note if backend else None,
        )
        report = replace(report, rank_work=_rank_work(o, data, resolved))
        if against is not None and len(ours) >= MIN_ROUNDS and interrupted is None:  # (fewer: ``enforce`` refuses)
            report = replace(report, gate=against.judge(report, diffs))
    finally:
        for b in active:
            b.close()
        for g in groups:
            g.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if interrupted is not None:
        raise BenchInterrupted(report, interrupted)
    return report


def _rank_work(o: BenchOptions, data: Dataset, resolved: Resolved):
    """With several data-parallel ranks: their frames per step, as drawn and balanced (``bench.balance``)."""
    from dsbuild.bench.balance import rank_work
    from dsbuild.bench.harness import loader_kwargs
    from dsbuild.loader import Loader

    if o.ranks < 2:
        return None
    with Loader(data.ref, o.split, **loader_kwargs(o, resolved.bucket_by, None, 0, o.ranks)) as loader:
        return rank_work(loader)


def _report(
    o, data, resolved, machine_facts, started, runtime, ours, per_rank, measured, skipped, step_info, h2d, decoder_note
) -> BenchReport:
    from dsbuild.bench import summary
    from dsbuild.bench.ranks import rank_facts

    waits, waits_of = summary.waits(ours)
    return BenchReport(
        options=o,
        resolved=resolved,
        dataset=data.facts,
        machine=machine_facts,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        time=runtime,
        unit=summary.unit(o.decode),
        ours=summary.ours_figures(ours, o.decode, decoder_note),
        baselines=summary.baseline_results(ours, measured, skipped, o.decode, machine_facts),
        training=summary.training(ours, step_info),
        stages=summary.stage_totals(ours),
        waits_ms=waits,
        waits_of=waits_of,
        h2d=h2d,
        ranks=rank_facts([list(r) for r in zip(*per_rank)], o.decode) if per_rank else None,
        rounds=summary.measurements(ours, measured),
    )

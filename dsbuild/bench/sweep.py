"""Scaling as a measured curve: `dsbuild bench --workers 1,2,4` (worker processes) or `--threads 1,2,4`.

Each point N is a bench run of the loader with N workers against the baselines at the same N (N-thread
sha256 and raw reads; in frames mode a bare PyAV loop in N processes, ``pyav-procs``, for worker
processes, and in N threads, ``pyav``, for threads). The points are interleaved: round r runs every N once, in the order given, before round r + 1,
so a machine that drifts (another job, a warming cache) touches every point alike. A point's figure is
the median of its rounds; its ratio to a baseline is the median of the per-round ratios. Efficiency is
throughput at N / (N x throughput at 1) — against the smallest N measured when 1 is not in the list
(scaled by N / N0) — so 1.0 is perfect scaling.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from dsbuild.bench.options import BenchOptions
from dsbuild.core.errors import UsageError

MODES = ("process", "thread")
MAX_COUNT = 512


def parse_counts(text: str, flag: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (each a whole number >= 1, no repeats, in the order given)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= MAX_COUNT for p in parts):
        raise UsageError(f"{flag} {text!r}: use whole numbers from 1 to {MAX_COUNT}, e.g. 1,2,4")
    counts = [int(p) for p in parts]
    if len(set(counts)) != len(counts):
        raise UsageError(f"{flag} {text!r}: a count is repeated")
    return counts


@dataclass(frozen=True)
class Point:
    """One N of the sweep: medians over its rounds (in the sweep's unit)."""

    n: int
    figure: float | None  # ours
    efficiency: float | None
    baselines: dict[str, float | None]  # each baseline's figure at this N
    ratios: dict[str, float | None]  # median over rounds of ours / baseline
    rounds: int
    startup_s: float  # the loader's start-up (worker processes included), median over rounds
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Sweep:
    mode: str  # process or thread
    unit: str
    options: dict  # the bench options every point shares (threads / workers vary)
    points: tuple[Point, ...]
    interrupted: bool = False

    def to_json(self) -> dict:
        return {"sweep": dataclasses.asdict(self)}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def point_options(o: BenchOptions, mode: str, n: int, duration: float) -> BenchOptions:
    """The bench options of point ``n``: N workers of ``mode``, baselines with N threads, one round."""
    return dataclasses.replace(o, threads=n, workers=n if mode == "process" else None, rounds=1, duration=duration)


def efficiencies(figures: dict[int, float | None]) -> dict[int, float | None]:
    """Throughput at N / (N x throughput at 1), against the smallest N measured (scaled) if 1 is not."""
    known = {n: f for n, f in figures.items() if f}
    if not known:
        return dict.fromkeys(figures)
    n0 = min(known)
    per_worker = known[n0] / n0
    return {n: (f / (n * per_worker) if f else None) for n, f in figures.items()}


def run_sweep(
    o: BenchOptions,
    mode: str,
    counts: list[int],
    run: Callable[[BenchOptions], object],
    progress: Callable[[int, int, int], None] | None = None,
) -> Sweep:
    """The sweep (see the module docstring); ``run(options)`` is ``run_bench`` (one round, one N).
    Ctrl-C keeps the rounds finished so far (``interrupted``)."""
    if mode not in MODES:
        raise UsageError(f"a sweep is of {' or '.join(MODES)} workers, not {mode!r}")
    share = o.duration / (o.rounds * len(counts))
    per: dict[int, list] = {n: [] for n in counts}
    interrupted = False
    try:
        for r in range(o.rounds):
            for n in counts:
                if progress is not None:
                    progress(r, n, o.rounds)
                per[n].append(run(point_options(o, mode, n, share)))
    except KeyboardInterrupt:
        interrupted = True
    unit = next((rep.unit for reps in per.values() for rep in reps), "")
    figures = {n: _median([rep.ours.figure.median for rep in reps if rep.ours]) for n, reps in per.items()}
    eff = efficiencies(figures)
    points = []
    for n, reps in per.items():
        names = list(dict.fromkeys(b.name for rep in reps for b in rep.baselines if not b.skipped))
        base = {
            name: _median([b.figure.median for rep in reps for b in rep.baselines if b.name == name and b.figure])
            for name in names
        }
        ratios = {
            name: _median([b.ratio.median for rep in reps for b in rep.baselines if b.name == name and b.ratio])
            for name in names
        }
        notes = tuple(dict.fromkeys(note for rep in reps if rep.ours for note in rep.ours.notes))
        points.append(
            Point(
                n=n,
                figure=figures[n],
                efficiency=eff[n],
                baselines=base,
                ratios=ratios,
                rounds=len(reps),
                startup_s=_median([rep.time.startup_s for rep in reps]) or 0.0,
                notes=notes,
            )
        )
    shared = {k: v for k, v in o.to_json().items() if k not in ("threads", "workers", "duration", "rounds")}
    return Sweep(mode, unit, shared, tuple(points), interrupted)


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def columns(s: Sweep) -> list[str]:
    names = list(dict.fromkeys(name for p in s.points for name in p.baselines))
    return [
        "workers" if s.mode == "process" else "threads",
        f"ours {s.unit}",
        "efficiency",
        *(f"{name} {s.unit}" for name in names),
        *(f"ours / {name}" for name in names),
    ]


def rows(s: Sweep) -> list[list[str]]:
    names = list(dict.fromkeys(name for p in s.points for name in p.baselines))
    return [
        [
            str(p.n),
            _num(p.figure, 1),
            _num(p.efficiency),
            *(_num(p.baselines.get(name), 1) for name in names),
            *(_num(p.ratios.get(name)) for name in names),
        ]
        for p in s.points
    ]


def html(s: Sweep) -> str:
    """A self-contained page: the table and throughput against N (ours and each baseline)."""
    from dsbuild.bench import svg

    series: dict[str, list[list[tuple[float, float]]]] = {"ours": [[(p.n, p.figure) for p in s.points if p.figure]]}
    for name in dict.fromkeys(name for p in s.points for name in p.baselines):
        series[name] = [[(p.n, v) for p in s.points if (v := p.baselines.get(name))]]
    what = "worker processes" if s.mode == "process" else "threads"
    table = "".join(f"<th>{escape(c)}</th>" for c in columns(s))
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows(s))
    chart = svg.lines(series, what, s.unit, f"throughput against {what}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>dsbuild bench sweep</title></head>'
        f"<body><h1>dsbuild bench: scaling with {escape(what)}</h1>"
        f"<p><code>{escape(str(s.options.get('ref')))}</code>, decode {escape(str(s.options.get('decode')))}; "
        "efficiency = throughput at N / (N x throughput at 1)</p>"
        f"<table><tr>{table}</tr>{body}</table>{chart}</body></html>"
    )

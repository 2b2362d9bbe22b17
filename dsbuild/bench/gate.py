"""The CI gate: is this run a regression against a saved one? Only like is compared with like.

Comparable: two reports are judged only when their settings (``BenchOptions.settings()`` plus the device
and decoder that actually ran) and their dataset (version id, split, samples, bytes, frames, resolutions)
are equal and both measured the same baselines; otherwise ``Against.check`` raises ``UsageError`` naming
each difference, before any measuring (``allow_different`` judges anyway and records the differences).
Both runs need at least ``MIN_ROUNDS`` rounds. Machines may differ (noted, not refused): figures are ratios against baselines
measured in the same run, which is what makes them portable at all.

The decision is about *our* loader, and each baseline is a reference it is measured against. Per
baseline (``judge``, pure), on the per-round ratios ours / baseline, the ratio dropped when both hold:
  - its median fell below ``fail_below`` x the saved median, and
  - the drop (saved median - current median) exceeds the run-to-run spread seen in *both* runs: the
    larger of the two interquartile ranges of the per-round ratios.
Ours regressed (``decide``) when it dropped against *every* baseline. A slower loader lowers every ratio
at once (ours is the common numerator), while what moves one reference (a noisy read floor, a peer
library's own hiccup) or moves references unequally (another job taking a core from a two-thread reader
and not from a one-thread one) does not: requiring every reference to agree is an intersection-union
test, whose false-alarm rate is at most that of its least noisy reference, where "any ratio dropped"
would add the false alarms of all of them (measured: ``benchmarks/bench_false_alarms.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dsbuild.bench.stats import Spread
from dsbuild.core.errors import CheckFailed, UsageError
from dsbuild.core.records import Record

MIN_ROUNDS = 3  # quartiles of fewer rounds say nothing about the spread


@dataclass(frozen=True, slots=True)
class Verdict(Record):
    baseline: str  # the ratio ours / this baseline
    saved: Spread
    now: Spread
    floor: float  # fail_below x saved median
    noise: float  # max(saved IQR, current IQR)
    dropped: bool  # below the floor and beyond the noise
    why: str


@dataclass(frozen=True, slots=True)
class Gate(Record):
    baseline_file: str
    fail_below: float
    verdicts: tuple[Verdict, ...]
    differences: tuple[str, ...]  # what differed and was allowed (--allow-different)
    machine_differences: tuple[str, ...]  # noted, never refused

    regressed: bool  # ours dropped against every baseline (``decide``)


def judge(baseline: str, saved: Spread, now: Spread, fail_below: float) -> Verdict:
    """Whether ours dropped against one baseline (see the module docstring)."""
    floor = fail_below * saved.median
    drop = saved.median - now.median
    noise = max(saved.iqr, now.iqr)
    below, beyond = now.median < floor, drop > noise
    if below and beyond:
        why = (
            f"median {now.median:.3g} < {fail_below:g} x saved {saved.median:.3g}, and the drop {drop:.3g} "
            f"exceeds the spread of both runs ({noise:.3g})"
        )
    elif below:
        why = f"below {fail_below:g} x saved, but the drop {drop:.3g} is within the runs' spread ({noise:.3g})"
    else:
        why = f"median {now.median:.3g} >= {fail_below:g} x saved {saved.median:.3g}"
    return Verdict(baseline, saved, now, floor, noise, below and beyond, why)


def decide(verdicts: tuple[Verdict, ...]) -> bool:
    """Ours regressed: it dropped against every baseline both runs measured (and there was one)."""
    return bool(verdicts) and all(v.dropped for v in verdicts)


def _differences(what: str, saved: dict, now: dict) -> list[str]:
    return [
        f"{what} {k}: saved {saved.get(k)!r}, now {now.get(k)!r}"
        for k in sorted(set(saved) | set(now))
        if saved.get(k) != now.get(k)
    ]


class SavedRun(Protocol):
    """What the gate reads of a saved ``report.BenchReport`` (that module imports this one)."""

    @property
    def baselines(self) -> tuple[Any, ...]: ...

    @property
    def time(self) -> Any: ...

    @property
    def options(self) -> Any: ...

    @property
    def resolved(self) -> Any: ...

    @property
    def dataset(self) -> Any: ...

    @property
    def machine(self) -> Any: ...


def ratios(report: SavedRun) -> dict[str, Spread]:
    """A report's ratio ours / baseline per measured baseline."""
    return {b.name: b.ratio for b in report.baselines if b.ratio is not None}


@dataclass(frozen=True)
class Against:
    """A saved report to gate against, and how."""

    report: SavedRun  # a report.BenchReport
    source: str  # where it was read from (for messages)
    fail_below: float = 0.9
    allow_different: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.fail_below <= 1:
            raise UsageError(
                f"--fail-below must be in (0, 1], not {self.fail_below!r}",
                hint="0.9 flags a drop below 90% of the saved ratio",
            )

    def check(self, settings: dict, dataset: dict, measured: set[str], rounds: int) -> tuple[str, ...]:
        """Before measuring: the differences that make the runs incomparable (raises ``UsageError`` naming
        them unless allowed), too few rounds, or a saved report with nothing to compare."""
        saved = self.report
        if saved.time.rounds_done < MIN_ROUNDS or rounds < MIN_ROUNDS:
            few = (
                f"{self.source} has {saved.time.rounds_done} round(s)"
                if saved.time.rounds_done < MIN_ROUNDS
                else f"--rounds {rounds}"
            )
            raise UsageError(
                f"--baseline: {few}; judging a regression needs at least {MIN_ROUNDS} rounds in both runs",
                hint="the default --rounds 5 is what the gate's false-alarm rate is measured with",
            )
        if not ratios(saved):
            raise UsageError(
                f"--baseline {self.source}: it measured no baseline, so it holds no ratio to compare",
                hint="save the baseline without --compare none",
            )
        had = set(ratios(saved))
        diffs = _differences("setting", {**saved.options.settings(), **saved.resolved.to_json()}, settings)
        diffs += _differences("dataset", saved.dataset.to_json(), dataset)
        diffs += [f"baseline {n}: measured in the saved run only" for n in sorted(had - measured)]
        diffs += [f"baseline {n}: measured in this run only" for n in sorted(measured - had)]
        if diffs and not self.allow_different:
            raise UsageError(
                f"--baseline {self.source} is not comparable: {'; '.join(diffs)}",
                hint="run with the same settings on the same data, or --allow-different to judge anyway",
            )
        return tuple(diffs)

    def judge(self, now: SavedRun, diffs: tuple[str, ...]) -> Gate:
        """After measuring: a verdict per ratio both runs measured."""
        a, b = ratios(self.report), ratios(now)
        verdicts = tuple(judge(name, a[name], b[name], self.fail_below) for name in sorted(set(a) & set(b)))
        return Gate(
            self.source,
            self.fail_below,
            verdicts,
            diffs,
            tuple(_differences("machine", self.report.machine.to_json(), now.machine.to_json())),
            decide(verdicts),
        )


def enforce(report, against: Against | None = None) -> None:
    """Raise ``CheckFailed`` when the report's gate found ours regressed (the CLI exits 1); a UsageError when
    it was run ``against`` a baseline but too few rounds finished to judge (one round's ratios have no
    spread: the gate judged them and passed)."""
    g = report.gate
    if against is not None and g is None:
        t = report.time
        raise UsageError(
            f"--baseline: {t.rounds_done} of {t.rounds_planned} round(s) finished within --duration "
            f"{t.duration_s:g}; judging a regression needs at least {MIN_ROUNDS}: nothing was judged",
            hint="raise --duration, or lower --rounds (not below 3)",
        )
    if g is not None and g.regressed:
        names = ", ".join(f"ours/{v.baseline} {v.now.median:.3g} (saved {v.saved.median:.3g})" for v in g.verdicts)
        raise CheckFailed(
            f"regression against {g.baseline_file}: ours dropped against every baseline: {names}",
            hint="the report's gate section gives the spread each drop was weighed against",
        )

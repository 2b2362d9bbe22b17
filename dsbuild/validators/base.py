"""What a check is: one definition that carries its thresholds and the code that runs it.

A ``Check`` names itself, its stage, what it proves, its thresholds (each with a default and the reason
for it), its severity, the level it needs and whether it needs a split set. It runs in up to two parts:

- ``sample(view) -> [detail, ...]``: per sample, in the worker that holds the sample's bytes (the
  per-sample pass runs every active check's ``sample`` on every sample, once);
- ``run(judge, facts) -> CheckResult``: once, over the version's facts (the per-sample findings, the
  index, lineage.verify's report, the split set). Per-sample checks default to counting their offenders.

Adding a check is adding one ``Check`` to its module's ``CHECKS``; the registry, the spec's keys and
validation, the reports and the skip rules follow from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsbuild.validators.model import Acceptance, CheckResult, Distribution, Offender, Table

if TYPE_CHECKING:
    from dsbuild.validators.facts import VersionFacts
    from dsbuild.validators.view import SampleView

STAGES = ("structural", "content", "dataset")
LEVELS = ("structural", "full")
# The [low, high] each numeric kind allows; a threshold whose unit has narrower limits gives its own ``bounds``.
RANGES = {"count": (0, (1 << 53) - 1), "fraction": (0, 1), "number": (0, math.inf)}  # counts exact in JSON
KINDS = (*RANGES, "strings")
Offending = tuple[str, str] | tuple[str, str, str]  # (item, detail) or (item, detail, kind)


@dataclass(frozen=True)
class Threshold:
    key: str
    default: object
    kind: str  # count (whole number) | fraction | number (finite) | strings (list of str)
    reason: str  # why the default is what it is
    bounds: tuple[float, float] | None = None  # [low, high] when the unit allows less than the kind's range

    @property
    def allowed(self) -> tuple[float, float]:
        """The [low, high] a value of this numeric threshold must lie in (``spec`` refuses the rest)."""
        return self.bounds or RANGES[self.kind]


def count_offenders(j: Judge, facts: VersionFacts) -> CheckResult:
    """The default ``run`` of a per-sample check: its offenders against its first (count) threshold."""
    return j.count(facts.offenders(j.check.name))


@dataclass(frozen=True)
class Check:
    name: str
    stage: str
    doc: str
    thresholds: tuple[Threshold, ...] = ()
    severity: str = "fail"
    level: str = "structural"  # the level it needs
    needs_split: bool = False
    counts: str = "sample(s)"  # what its offenders are, for the message of a count check
    sample: Callable[[SampleView], Iterable[str]] | None = None
    run: Callable[[Judge, VersionFacts], CheckResult] = count_offenders

    def __post_init__(self) -> None:
        if (
            self.stage not in STAGES
            or self.level not in LEVELS
            or self.severity not in ("fail", "warn")
            or any(t.kind not in KINDS for t in self.thresholds)
        ):
            raise ValueError(f"check {self.name!r} is malformed")


@dataclass(frozen=True)
class Judge:
    """A check bound to the spec: the one place where thresholds and severities become a status."""

    check: Check
    spec: Acceptance

    def __getitem__(self, key: str):
        return self.spec[key]

    def limits(self) -> dict:
        return {t.key: self.spec[t.key] for t in self.check.thresholds}

    def result(
        self,
        *,
        measured: object,
        breaches: list[str],
        message: str,
        offenders: Iterable[Offending] = (),
        kind: str = "sample",
        distribution: Distribution | None = None,
        table: Table | None = None,
    ) -> CheckResult:
        """``breaches`` lists the thresholds missed, in words: none is a pass, else the check's severity.
        ``offenders`` are (item, detail) or (item, detail, kind), worst first."""
        found = list(offenders)
        severity = self.spec.severity_of(self.check.name)
        status = "pass" if not breaches else ("warn" if severity == "warn" else "fail")
        text = message if not breaches else f"{message}; " + "; ".join(breaches)
        shown = tuple(
            Offender(str(o[0]), str(o[1]), o[2] if len(o) > 2 else kind) for o in found[: self.spec.max_offenders]
        )
        return CheckResult(
            self.check.name,
            self.check.stage,
            status,
            text,
            severity,
            measured,
            self.limits(),
            shown,
            len(found),
            distribution,
            table,
        )

    def count(
        self, offenders: Sequence[Offending], *, kind: str = "sample", distribution: Distribution | None = None
    ) -> CheckResult:
        """Pass while there are at most as many offenders as the check's first (count) threshold."""
        key = self.check.thresholds[0].key
        n, limit = len(offenders), self.spec[key]
        return self.result(
            measured=n,
            breaches=[f"{n} > {key} = {limit}"] if n > limit else [],
            message=f"{n} {self.check.counts}",
            offenders=offenders,
            kind=kind,
            distribution=distribution,
        )

    def fraction(
        self,
        key: str,
        offenders: Sequence[Offending],
        total: int,
        what: str,
        distribution: Distribution | None = None,
    ) -> CheckResult:
        """Pass while offenders / total is at most the fraction threshold ``key``."""
        n = len(offenders)
        frac = n / total if total else 0.0
        limit = self.spec[key]
        return self.result(
            measured=round(frac, 6),
            breaches=[f"fraction {frac:.4g} > {key} = {limit}"] if frac > limit else [],
            message=f"{n} of {total} {what}",
            offenders=offenders,
            distribution=distribution,
        )

    def skipped(self, why: str) -> CheckResult:
        return CheckResult(
            self.check.name,
            self.check.stage,
            "skip",
            why,
            self.spec.severity_of(self.check.name),
            threshold=self.limits(),
        )

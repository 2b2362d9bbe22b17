"""What a validation run produces: one ``CheckResult`` per named check, and the ``Report`` around them.

A check measures one value, compares it with one or more thresholds of the acceptance spec and names
its worst offenders (sample keys, shards, titles, groups, controls). Statuses:

    pass  the measured value is within the thresholds
    warn  it is not, and the spec gives the check severity "warn" (reported, does not reject)
    fail  it is not, and the severity is "fail" (rejects the version: exit 1)
    skip  the check did not run: it needs --level full or --split, the spec turned it off ("off"),
          or a check it depends on failed (the message says which)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

STATUSES = ("pass", "warn", "fail", "skip")
STAGES = ("structural", "content", "dataset")


@dataclass(frozen=True)
class Offender:
    """One thing that broke a check: ``kind`` says what ``item`` names (sample, shard, title, ...)."""

    item: str
    detail: str
    kind: str = "sample"

    def to_json(self) -> dict:
        return {"item": self.item, "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class CheckResult:
    name: str
    stage: str
    status: str
    message: str
    measured: object = None  # a number, or a short string when the value is not a number
    threshold: object = None  # {threshold key: value} of the spec keys this check compared with
    offenders: tuple[Offender, ...] = ()  # the worst ones, at most the spec's max_offenders
    offender_count: int = 0  # all of them
    severity: str = "fail"
    details: dict = field(default_factory=dict)  # per-value tables for reports and plots (JSON-safe)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_json(self) -> dict:
        return {"name": self.name, "stage": self.stage, "status": self.status, "severity": self.severity,
                "message": self.message, "measured": self.measured, "threshold": self.threshold,
                "offender_count": self.offender_count, "offenders": [o.to_json() for o in self.offenders],
                "details": self.details}


@dataclass(frozen=True)
class Report:
    catalog: str
    version_id: str
    level: str
    split: str | None
    spec_source: str  # the spec file, or "defaults"
    spec: dict  # the effective thresholds and severities
    checks: tuple[CheckResult, ...]
    summary: dict  # samples, shards, hours, seconds taken, plot data (see run.py)

    @property
    def accepted(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else "rejected"

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict:
        return {"format": "dsbuild.validate/1", "catalog": self.catalog, "version_id": self.version_id,
                "level": self.level, "split": self.split, "verdict": self.verdict, "accepted": self.accepted,
                "counts": self.counts(), "spec_source": self.spec_source, "spec": self.spec,
                "summary": self.summary, "checks": [c.to_json() for c in self.checks]}


def offenders_from(items: Iterable[tuple], limit: int, kind: str = "sample") -> tuple[Offender, ...]:
    """The first ``limit`` (item, detail) or (item, detail, kind) tuples as Offenders (callers sort worst
    first); ``kind`` applies where a tuple does not name its own."""
    out = []
    for t in items:
        if len(out) >= limit:
            break
        out.append(Offender(str(t[0]), str(t[1]), t[2] if len(t) > 2 else kind))
    return tuple(out)

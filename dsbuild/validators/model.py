"""What a validation run produces: one ``CheckResult`` per registered check, and the ``Report`` around them.

A check measures one value, compares it with the thresholds of the acceptance spec and names its worst
offenders (sample keys, shards, members, titles, groups, controls). Statuses:

    pass  the measured value is within the thresholds
    warn  it is not, and the spec gives the check severity "warn" (reported, does not reject)
    fail  it is not, and the severity is "fail" (rejects the version)
    skip  the check did not run: it needs level full or a split set, or the spec turned it off

Every record is a frozen ``core.records.Record``: ``to_json()`` is the report's JSON, and nothing here
is markup (capture text is carried as plain strings; renderers escape it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from dsbuild.core.errors import CheckFailed
from dsbuild.core.records import JsonValue, Record

STATUSES = ("pass", "warn", "fail", "skip")
REPORT_FORMAT = "dsbuild.validate/2"
MAX_PLOTTED = 20_000  # per-sample values a report keeps for a plot; an even subsample beyond this


class Acceptance(Protocol):
    """What a check reads of the acceptance spec (``spec.AcceptanceSpec`` is the one implementation). The
    spec is built from the checks' definitions, so checks, views and ``base`` see it through this
    protocol and never import ``spec`` (which imports them all through the registry)."""

    @property
    def max_offenders(self) -> int: ...

    def __getitem__(self, key: str) -> Any: ...

    def severity_of(self, check: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Offender(Record):
    """One thing that broke a check: ``kind`` says what ``item`` names (sample, shard, member, title...)."""

    item: str
    detail: str
    kind: str = "sample"


@dataclass(frozen=True, slots=True)
class Bar(Record):
    label: str
    value: float


@dataclass(frozen=True, slots=True)
class Distribution(Record):
    """What a check measured, for a plot: per-sample ``values`` (a histogram) or labelled ``bars``, with the
    threshold it was judged against and the side of it that breaks the check."""

    label: str  # what a value is, e.g. "mean gray of the brightest sampled frame"
    unit: str = ""
    values: tuple[float, ...] = ()
    bars: tuple[Bar, ...] = ()
    threshold: float | None = None
    threshold_key: str | None = None
    bad: str = "below"  # below | above: values on this side of the threshold break the check
    sampled_from: int | None = None  # set when ``values`` is an even subsample of this many values


def per_sample(label: str, values: list[float], unit: str = "", **threshold) -> Distribution:
    """A histogram's worth of per-sample values (finite ones, rounded; evenly subsampled past MAX_PLOTTED)."""
    values = [round(float(x), 4) for x in values if math.isfinite(x)]
    if len(values) <= MAX_PLOTTED:
        return Distribution(label, unit, values=tuple(values), **threshold)
    step = len(values) / MAX_PLOTTED
    return Distribution(
        label,
        unit,
        values=tuple(values[int(i * step)] for i in range(MAX_PLOTTED)),
        sampled_from=len(values),
        **threshold,
    )


@dataclass(frozen=True, slots=True)
class Table(Record):
    """A small table a check produced (coverage per title, split x title), JSON scalars in each cell."""

    columns: tuple[str, ...]
    rows: JsonValue  # list of lists, one cell per column


@dataclass(frozen=True, slots=True)
class CheckResult(Record):
    name: str
    stage: str
    status: str
    message: str
    severity: str
    measured: JsonValue = None  # a number, or a short string when the value is not a number
    threshold: dict[str, JsonValue] | None = None  # {threshold key: value} this check compared with
    offenders: tuple[Offender, ...] = ()  # the worst ones, at most the spec's max_offenders
    offender_count: int = 0  # all of them
    distribution: Distribution | None = None
    table: Table | None = None

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass(frozen=True, slots=True)
class Summary(Record):
    samples: int
    shards: int
    bytes: int
    hours: float
    shard_format: str
    checked_content: int  # samples whose content was decoded and read (level full)
    decoded_frames: int
    seconds: dict[str, float]  # per stage, and "total" ("shards" runs during "samples" on a local catalog)
    durations: Distribution  # clip window lengths


@dataclass(frozen=True, slots=True)
class Report(Record):
    FORMAT = REPORT_FORMAT
    catalog: str
    version_id: str
    level: str
    split: str | None
    spec_source: str  # the spec file, or "defaults"
    spec: JsonValue  # the effective thresholds and severities
    checks: tuple[CheckResult, ...]
    summary: Summary

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

    def raise_if_rejected(self) -> None:
        """The gate: ``CheckFailed`` (the CLI's exit 1) naming the failed checks when the version is rejected."""
        failed = [c.name for c in self.checks if c.failed]
        if failed:
            raise CheckFailed(
                f"version {self.version_id[:12]} rejected: {len(failed)} check(s) failed ({', '.join(failed)})",
                hint="the report names the offending samples",
            )

    def to_json(self) -> dict:
        out = Record.to_json(self)
        out.update(verdict=self.verdict, accepted=self.accepted, counts=self.counts())
        return out

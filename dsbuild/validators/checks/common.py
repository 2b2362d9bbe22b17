"""Turning measurements into CheckResults: the one place where thresholds and severities are applied."""

from __future__ import annotations

from typing import Iterable

from dsbuild.validators.model import CheckResult, offenders_from
from dsbuild.validators.spec import BY_NAME, AcceptanceSpec


def skipped(spec: AcceptanceSpec, name: str, why: str) -> CheckResult:
    return CheckResult(name, BY_NAME[name].stage, "skip", why, threshold=spec.limits(name),
                       severity=spec.severity_of(name))


def judge(spec: AcceptanceSpec, name: str, *, measured: object, breaches: list[str], message: str,
          offenders: Iterable[tuple[str, str]] = (), offender_count: int | None = None, kind: str = "sample",
          details: dict | None = None) -> CheckResult:
    """``breaches`` lists the thresholds missed, in words; none means pass, else the check's severity."""
    offenders = list(offenders)
    severity = spec.severity_of(name)
    status = "pass" if not breaches else ("warn" if severity == "warn" else "fail")
    text = message if not breaches else f"{message}; " + "; ".join(breaches)
    return CheckResult(name, BY_NAME[name].stage, status, text, measured=measured, threshold=spec.limits(name),
                       offenders=offenders_from(offenders, spec.max_offenders, kind),
                       offender_count=len(offenders) if offender_count is None else offender_count,
                       severity=severity, details=details or {})


def count_check(spec: AcceptanceSpec, name: str, offenders: list[tuple[str, str]], *, what: str = "sample(s)",
                kind: str = "sample", details: dict | None = None) -> CheckResult:
    """Pass while the number of offenders is at most the check's one count threshold."""
    key = BY_NAME[name].thresholds[0].key
    limit = spec[key]
    n = len(offenders)
    return judge(spec, name, measured=n, breaches=[f"{n} > {key} = {limit}"] if n > limit else [],
                 message=f"{n} {what}", offenders=offenders,
                 kind=kind, details=details)


def fraction_check(spec: AcceptanceSpec, name: str, key: str, offenders: list[tuple[str, str]], total: int,
                   what: str) -> CheckResult:
    """Pass while offenders / total is at most the fraction threshold ``key``."""
    n = len(offenders)
    frac = n / total if total else 0.0
    limit = spec[key]
    return judge(spec, name, measured=round(frac, 6),
                 breaches=[f"fraction {frac:.4g} > {key} = {limit}"] if frac > limit else [],
                 message=f"{n} of {total} {what}", offenders=offenders)

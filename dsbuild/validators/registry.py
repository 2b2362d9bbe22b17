"""Every check, in report order: structural, content, dataset. Each module owns its checks' definitions."""

from __future__ import annotations

from dsbuild.validators.base import Check, Threshold
from dsbuild.validators.checks import clips, dataset, splits, structural

CHECKS: tuple[Check, ...] = (*structural.CHECKS, *clips.CHECKS, *dataset.CHECKS, *splits.CHECKS)
BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}
THRESHOLDS: dict[str, tuple[Check, Threshold]] = {t.key: (c, t) for c in CHECKS for t in c.thresholds}
if len(BY_NAME) != len(CHECKS) or len(THRESHOLDS) != sum(len(c.thresholds) for c in CHECKS):
    raise ValueError("two checks share a name or a threshold key")

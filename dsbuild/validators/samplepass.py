"""The per-sample pass, run in worker processes (``core.executor.run_tasks``): each unit reads a run of
one shard's samples once, through the shard format's reader, and runs every active check's ``sample``
function on each; only small per-sample facts cross the process boundary, never sample bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsbuild.formats import get_format
from dsbuild.lineage.index import IndexRow
from dsbuild.validators.facts import SampleFacts, UnitResult, Usage
from dsbuild.validators.registry import CHECKS
from dsbuild.validators.view import SampleView

# Samples per unit at most: enough to amortise opening a shard; few enough at level full (decoding is
# slow) that units balance over the workers. Smaller versions get about UNITS_PER_WORKER units per worker.
UNIT_SAMPLES = {"structural": 256, "full": 16}
UNITS_PER_WORKER = 4
ACTIVE = 0.5  # |value| at which a control counts as in use (buttons are 0/1; axes past half travel)


@dataclass(frozen=True)
class Unit:
    shard: str  # its path in the catalog, for messages
    path: str  # a local file holding it
    shard_format: str
    rows: tuple[IndexRow, ...]
    level: str
    spec: object  # the AcceptanceSpec (per-sample checks apply their thresholds where the sample is)
    scan_keys: tuple[str, ...] | None = None  # on a shard's first unit: every key the index gives the shard
    shard_damaged: bool = False  # lineage.verify found its bytes changed: name the damaged samples


def _order(r: IndexRow) -> tuple:
    """Shard order: byte offset, or row group and row (each read once, in file order)."""
    return tuple(-1 if x is None else x for x in (r.byte_offset, r.row_group, r.row_index))


def make_units(
    shard_rows: dict[str, list[IndexRow]],
    paths: dict[str, str],
    shard_format: str,
    level: str,
    spec,
    damaged: set[str],
    workers: int,
) -> list[Unit]:
    """Units over every shard that has a local file (``paths``), rows in shard order."""
    samples = sum(len(rows) for shard, rows in shard_rows.items() if shard in paths)
    size = max(1, min(UNIT_SAMPLES[level], -(-samples // (UNITS_PER_WORKER * workers))))
    units = []
    for shard in sorted(shard_rows):
        if shard not in paths:
            continue
        rows = sorted(shard_rows[shard], key=_order)
        for start in range(0, len(rows), size):
            scan = tuple(sorted(r.key for r in rows)) if start == 0 else None
            units.append(
                Unit(
                    shard,
                    paths[shard],
                    shard_format,
                    tuple(rows[start : start + size]),
                    level,
                    spec,
                    scan,
                    shard in damaged,
                )
            )
    return units


def usage_of(view: SampleView) -> Usage | None:
    """How often each control is active in this sample (None when its action array is malformed)."""
    s = view.sample
    if s is None or s.actions.dtype.kind != "f" or s.actions.ndim != 2 or s.actions.shape[1] != len(s.meta.controls):
        return None
    active = (np.abs(np.nan_to_num(s.actions)) >= ACTIVE).sum(axis=0)
    return Usage(tuple(s.meta.controls), tuple(int(x) for x in active), int(s.actions.shape[0]))


def active_checks(spec, level: str) -> list:
    """The checks whose ``sample`` part runs: at this level, and not turned off by the spec."""
    return [
        c
        for c in CHECKS
        if c.sample is not None and (c.level == "structural" or level == "full") and spec.severity_of(c.name) != "off"
    ]


def inspect_unit(unit: Unit) -> UnitResult:
    checks = active_checks(unit.spec, unit.level)
    out = []
    with get_format(unit.shard_format).reader(Path(unit.path)) as reader:
        for row in unit.rows:
            view = SampleView.read(reader, row, unit.spec, unit.level, unit.shard_damaged)
            problems = tuple((c.name, d) for c in checks for d in c.sample(view))
            out.append(SampleFacts(row.key, problems, usage_of(view), view.measure(), view.content))
        unsafe = reader.scan(set(unit.scan_keys)) if unit.scan_keys is not None else []
    return UnitResult(tuple(out), tuple(unsafe))

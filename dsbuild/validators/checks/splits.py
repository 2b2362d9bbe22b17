"""Split checks (given --split NAME): no group in two splits, and every title in every split.

The split set is read through ``dsbuild.split`` (which verifies each file against the split manifest's
sha256); ``read_split`` is the only code here that knows where split files live.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from dsbuild.core.errors import FormatError
from dsbuild.lineage.catalog import Catalog
from dsbuild.validators.checks.common import judge
from dsbuild.validators.model import CheckResult
from dsbuild.validators.spec import AcceptanceSpec


@dataclass(frozen=True)
class SplitRows:
    name: str
    by: str  # the group field, e.g. player
    rows: dict[str, list[tuple[str, str]]]  # split -> [(key, group value)]


def read_split(catalog: Catalog, version_id: str, name: str) -> SplitRows:
    """The split set ``name`` of the version. UsageError when there is none; FormatError when damaged."""
    from dsbuild.split import open_split

    s = open_split(catalog, version_id, name)
    rows = {}
    for split in s.splits:
        t = s.table(split, ["key", "group_value"])
        rows[split] = list(zip(t["key"].to_pylist(), t["group_value"].to_pylist()))
    return SplitRows(name, str(s.manifest.get("parameters", {}).get("by", "group")), rows)


def leakage_check(spec: AcceptanceSpec, split: SplitRows) -> CheckResult:
    splits_of_group: dict[str, set[str]] = defaultdict(set)
    splits_of_key: dict[str, set[str]] = defaultdict(set)
    for sp, pairs in split.rows.items():
        for key, group in pairs:
            splits_of_group[group].add(sp)
            splits_of_key[key].add(sp)
    leaked = {g: sorted(s) for g, s in splits_of_group.items() if len(s) > 1}
    twice = {k: sorted(s) for k, s in splits_of_key.items() if len(s) > 1}
    offenders = [(k, f"sample is in {', '.join(s)}") for k, s in sorted(twice.items())]
    for sp, pairs in sorted(split.rows.items()):
        offenders += [(key, f"{split.by} {g!r} is in {', '.join(leaked[g])}; this sample is in {sp}")
                      for key, g in sorted(pairs) if g in leaked and key not in twice]
    limit = spec["max_leaked_groups"]
    breaches = []
    if len(leaked) > limit:
        breaches.append(f"{len(leaked)} > max_leaked_groups = {limit}")
    if twice:
        breaches.append(f"{len(twice)} sample(s) in two splits")
    return judge(spec, "split_leakage", measured=len(leaked), breaches=breaches,
                 message=f"split set {split.name!r} by {split.by}: {len(splits_of_group)} groups in "
                         f"{len(split.rows)} splits, {len(leaked)} in more than one",
                 offenders=offenders, details={"leaked_groups": dict(sorted(leaked.items())[:100])})


def coverage_check(spec: AcceptanceSpec, split: SplitRows, rows: list[dict]) -> CheckResult:
    title_of = {r["key"]: r["title"] for r in rows}
    titles = sorted(set(title_of.values()))
    per_split = {sp: defaultdict(int) for sp in split.rows}
    unknown = []
    for sp, pairs in split.rows.items():
        for key, _ in pairs:
            if key in title_of:
                per_split[sp][title_of[key]] += 1
            else:
                unknown.append((key, f"in split {sp} but not in this version", "sample"))
    missing = [(t, f"missing from split {sp}") for sp in sorted(per_split) for t in titles if not per_split[sp][t]]
    limit = spec["max_missing_titles"]
    breaches = [f"{len(missing)} > max_missing_titles = {limit}"] if len(missing) > limit else []
    if unknown:
        breaches.append(f"{len(unknown)} split key(s) are not samples of this version")
    return judge(spec, "split_coverage", measured=len(missing), breaches=breaches,
                 message=f"{len(titles)} titles x {len(per_split)} splits, {len(missing)} pair(s) empty",
                 offenders=missing + unknown, kind="title",
                 details={"per_split": {sp: dict(sorted(c.items())) for sp, c in sorted(per_split.items())}})


def load_split(catalog: Catalog, version_id: str, name: str) -> SplitRows | FormatError:
    """The split set, or the FormatError that says how it is damaged (a check failure, not a usage error).
    A split set that does not exist raises UsageError: asking for it is the user's mistake (exit 2)."""
    try:
        return read_split(catalog, version_id, name)
    except FormatError as e:
        return e


def split_checks(spec: AcceptanceSpec, split: SplitRows | FormatError, name: str,
                 rows: list[dict]) -> list[CheckResult]:
    """Both split checks; a damaged split set fails both with the reason."""
    if isinstance(split, FormatError):
        return [judge(spec, c, measured=None, breaches=[f"split set unreadable: {split}"],
                      message=f"split set {name!r}") for c in ("split_leakage", "split_coverage")]
    return [leakage_check(spec, split), coverage_check(spec, split, rows)]

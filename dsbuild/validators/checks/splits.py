"""Split checks (with a split set): no group in two splits, and every title in every split.

Groups are recomputed from the version's index with the split package's own rule
(``dsbuild.split.groups.field_value``: a session field or condition, in Unicode NFC), never taken from
the split files: a player written once composed and once decomposed (``José``) is one group here too,
and a hand-edited ``group_value`` cannot hide a leak.
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict

from dsbuild.core.errors import FormatError, LineageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import IndexRow
from dsbuild.validators.base import Check, Judge, Offending, Threshold
from dsbuild.validators.checks.dataset import seconds
from dsbuild.validators.facts import SplitData, VersionFacts
from dsbuild.validators.model import CheckResult, Table

MAX_LISTED_GROUPS = 100  # leaked groups in the report's table


def read_split(catalog: Catalog, version_id: str, name: str) -> SplitData:
    """The split set ``name`` of the version: UsageError when there is none (asking for it is the user's
    mistake), LineageError when its files are damaged."""
    import pyarrow as pa

    from dsbuild.lineage.splitsets import open_split_set  # (only with a split set: a validation's start-up)

    try:
        s = open_split_set(catalog, version_id, name)
        keys = {split: tuple(s.table(split, ["key"])["key"].to_pylist()) for split in s.splits}
        by = s.manifest.parameters.by
    except (FormatError, KeyError, TypeError, OSError, pa.ArrowException) as e:
        raise LineageError(
            f"{catalog.url}: split set {name!r} of {version_id[:12]} is damaged ({str(e)[:200]})",
            hint="make it again with `dsbuild split --force`",
        ) from None
    return SplitData(name, str(by), keys)


def session_of(r: IndexRow) -> dict:
    """The session fields of a sample's row, as ``field_value`` reads them."""
    return {
        "session_id": r.session_id,
        "title": r.title,
        "player": r.player,
        "platform": r.platform,
        "build": r.build,
        "conditions": dict(r.conditions),
    }


def _leakage(j: Judge, d: VersionFacts) -> CheckResult:
    from dsbuild.split.groups import field_value

    split = d.split_set()
    row_of = {r.key: r for r in d.rows}
    splits_of_group: dict[str, set[str]] = defaultdict(set)
    splits_of_key: dict[str, set[str]] = defaultdict(set)
    group_of: dict[str, str] = {}
    for sp, keys in split.keys.items():
        for key in keys:
            splits_of_key[key].add(sp)
            group = field_value(session_of(row_of[key]), split.by) if key in row_of else None
            if group is not None:
                group_of[key] = group
                splits_of_group[group].add(sp)
    leaked = {g: sorted(s) for g, s in splits_of_group.items() if len(s) > 1}
    twice = {k: sorted(s) for k, s in splits_of_key.items() if len(s) > 1}
    offenders = [(k, f"sample is in {', '.join(s)}") for k, s in sorted(twice.items())]
    for sp, keys in sorted(split.keys.items()):
        offenders += [
            (k, f"{split.by} {group_of[k]!r} is in {', '.join(leaked[group_of[k]])}; this sample is in {sp}")
            for k in sorted(keys)
            if group_of.get(k) in leaked and k not in twice
        ]
    limit = j["max_leaked_groups"]
    breaches = [f"{len(leaked)} > max_leaked_groups = {limit}"] if len(leaked) > limit else []
    if twice:
        breaches.append(f"{len(twice)} sample(s) in two splits")
    return j.result(
        measured=len(leaked),
        breaches=breaches,
        message=f"split set {split.name!r} by {split.by}: {len(splits_of_group)} groups in "
        f"{len(split.keys)} splits, {len(leaked)} in more than one",
        offenders=offenders,
        table=Table((split.by, "splits"), [[g, ", ".join(s)] for g, s in sorted(leaked.items())[:MAX_LISTED_GROUPS]]),
    )


def _coverage(j: Judge, d: VersionFacts) -> CheckResult:
    split = d.split_set()
    row_of = {r.key: r for r in d.rows}
    title_of = {r.key: unicodedata.normalize("NFC", r.title) for r in d.rows}  # as split --stratify compares
    titles = sorted(set(title_of.values()))
    cells: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
    unknown: list[Offending] = []
    for sp, keys in split.keys.items():
        for key in keys:
            if key in row_of:
                cell = cells[(sp, title_of[key])]
                cell[0] += 1
                cell[1] += seconds(row_of[key]) / 3600
            else:
                unknown.append((key, f"in split {sp} but not in this version", "sample"))
    splits = sorted(split.keys)
    missing = [(t, f"missing from split {sp}") for sp in splits for t in titles if not cells[(sp, t)][0]]
    titles_missing = len({t for t, _ in missing})  # the threshold counts titles, not (split, title) pairs
    limit = j["max_missing_titles"]
    breaches = [f"{titles_missing} > max_missing_titles = {limit}"] if titles_missing > limit else []
    if unknown:
        breaches.append(f"{len(unknown)} split key(s) are not samples of this version")
    table = Table(
        ("title", *(f"{sp} samples" for sp in splits), *(f"{sp} hours" for sp in splits)),
        [[t, *(cells[(sp, t)][0] for sp in splits), *(round(cells[(sp, t)][1], 6) for sp in splits)] for t in titles],
    )
    return j.result(
        measured=titles_missing,
        breaches=breaches,
        message=f"{len(titles)} titles x {len(splits)} splits: {titles_missing} title(s) missing from "
        f"a split ({len(missing)} pair(s) empty)",
        offenders=[*missing, *unknown],
        kind="title",
        table=table,
    )


CHECKS = (
    Check(
        "split_leakage",
        "dataset",
        "No group of the split set (its --by field, NFC-normalised like the split "
        "rule) and no sample is in two splits.",
        (Threshold("max_leaked_groups", 0, "count", "one leaked player inflates every metric"),),
        needs_split=True,
        run=_leakage,
    ),
    Check(
        "split_coverage",
        "dataset",
        "Every title of the version appears in every split of the split set.",
        (
            Threshold(
                "max_missing_titles",
                0,
                "count",
                "a split without a title cannot measure it (counts titles missing from at least one split)",
            ),
        ),
        needs_split=True,
        run=_coverage,
    ),
)

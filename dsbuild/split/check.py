"""``--check``: prove a stored split set is what its rule gives, and that no group is in two splits.

The proof reads the stored files (each verified against the manifest's sha256), checks disjointness of
groups and keys from the files alone, then recomputes the split set from the version and its recorded
parameters (or the ones given) and compares rows, not bytes, so a different Parquet writer version does
not fail a correct split set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsbuild.core.errors import FormatError, LineageError, UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.splitsets import SplitSet, open_split_set
from dsbuild.split.files import split_schema
from dsbuild.split.groups import read_version
from dsbuild.split.make import compute, open_version, resolve_params
from dsbuild.split.params import SplitOptions, SplitParams

# Manifest fields that legitimately differ between equal split sets (writer bytes, who wrote it, and the
# warnings that version of dsbuild knew to give: they comment on the data, the rule does not change).
NOT_COMPARED = ("hash", "tool_version", "splits", "warnings")
SPLIT_FIELDS_NOT_COMPARED = ("sha256", "bytes")


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    version_id: str
    name: str
    hash: str | None
    problems: list[str] = field(default_factory=list)
    checked: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def overlaps(members: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Pure: every value listed under two or more splits -> those splits (sorted)."""
    seen: dict[str, list[str]] = {}
    for split in sorted(members):
        for v in set(members[split]):
            seen.setdefault(v, []).append(split)
    return {v: s for v, s in sorted(seen.items()) if len(s) > 1}


def check_split(
    catalog: str | Path | Catalog, version: str | None, name: str, options: SplitOptions | None = None
) -> CheckResult:
    """Check the split set ``name`` of a version. Parameters not given in ``options`` are the recorded ones."""
    cat, version_id = open_version(catalog, version)
    stored = open_split_set(cat, version_id, name)  # UsageError when missing, LineageError when damaged
    problems: list[str] = []
    groups, keys, tables = {}, {}, {}
    for split in stored.splits:
        try:
            tables[split] = stored.table(split)
        except (FormatError, LineageError) as e:
            problems.append(str(e))
            continue
        if tables[split].schema.names != split_schema().names:
            problems.append(f"{split}.parquet: columns {tables[split].schema.names} are not {split_schema().names}")
            continue
        groups[split] = tables[split]["group_value"].to_pylist()
        keys[split] = tables[split]["key"].to_pylist()
    for what, members in (("group", groups), ("key", keys)):
        both = overlaps(members)
        if both:
            first = next(iter(both))
            problems.append(
                f"{len(both)} {what}(s) are in more than one split, e.g. {first!r} in {', '.join(both[first])}"
            )
    checked = {
        "splits": len(stored.splits),
        "samples": sum(len(k) for k in keys.values()),
        "groups": len({g for gs in groups.values() for g in gs}),
    }
    try:
        problems += _recompute(cat, version_id, stored, tables, options)
    except UsageError as e:  # the recorded rule cannot be applied any more (e.g. its --from-split is gone)
        problems.append(f"cannot recompute: {e}")
    return CheckResult(
        ok=not problems, version_id=version_id, name=name, hash=stored.hash, problems=problems, checked=checked
    )


def _recompute(
    cat: Catalog, version_id: str, stored: SplitSet, tables: dict, options: SplitOptions | None
) -> list[str]:
    recorded = stored.manifest.parameters
    inherited = SplitParams.from_rule(recorded, stored.path)
    options = options or SplitOptions()
    old_ref = recorded.from_split
    if options.from_split is None and old_ref:
        options = replace(options, from_split=f"{old_ref.version_id}/{old_ref.name}")
    params, old = resolve_params(cat, version_id, options, inherited)
    problems = []
    if (
        old is not None
        and old_ref
        and (old.version_id, old.name) == (old_ref.version_id, old_ref.name)
        and old.hash != old_ref.hash
    ):
        problems.append(
            f"--from-split {old_ref.version_id[:12]}/{old_ref.name} has changed since "
            f"(hash {old.hash[:12]}, recorded {old_ref.hash[:12]})"
        )
    fresh = compute(read_version(cat, version_id), stored.name, params, old, pins_given=options.pins is not None)
    for split in sorted(set(fresh.tables) | set(stored.splits)):
        if split not in stored.splits:
            problems.append(f"split {split!r} is missing from the stored split set")
            continue
        if split not in fresh.tables:
            problems.append(f"split {split!r} should not exist under the rule")
            continue
        if split not in tables:
            continue  # already reported as unreadable
        want = fresh.tables[split].select(split_schema().names).cast(split_schema()).sort_by("key")
        have = tables[split].cast(split_schema())
        if not have.equals(want):
            wk, hk = set(want["key"].to_pylist()), set(have["key"].to_pylist())
            problems.append(
                f"split {split!r} differs from the rule: {len(hk - wk)} sample(s) should not be "
                f"there, {len(wk - hk)} missing, {len(wk & hk)} shared"
                + ("; locators or groups differ" if wk == hk else "")
            )
    want_doc, have_doc = fresh.manifest.to_json(), stored.manifest.to_json()
    differ = [
        key
        for key in sorted(set(want_doc) | set(have_doc))
        if key not in NOT_COMPARED and want_doc.get(key) != have_doc.get(key)
    ]
    for split in sorted(set(want_doc["splits"]) & set(have_doc["splits"])):
        w, h = want_doc["splits"][split], have_doc["splits"][split]
        differ += [
            f"splits.{split}.{key}"
            for key in sorted(set(w) | set(h))
            if key not in SPLIT_FIELDS_NOT_COMPARED and w.get(key) != h.get(key)
        ]
    if differ:
        more = f" and {len(differ) - 8} more" if len(differ) > 8 else ""
        problems.append(f"manifest differs from the recomputation in {', '.join(differ[:8])}{more}")
    return problems

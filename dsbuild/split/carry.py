"""``--from-split``: carry the group assignments of a split set made for another version.

Carried groups are *fixed*: they keep their old split whatever the rule would say now (even after a
change of ratios or salt), so a model evaluated on the old test split is never trained on it later.
Groups new in this version are assigned by the rule; groups gone from it are reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dsbuild.core.errors import UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.splitsets import SplitSet, list_split_sets, open_split_set


@dataclass(frozen=True)
class Carry:
    fixed: dict[str, str]  # group -> old split, for groups that keep it
    new: tuple[str, ...]  # groups not in the old set
    removed: tuple[str, ...]  # old groups not in this version
    reassigned: dict[str, str]  # group -> old split that no longer takes hashed groups (rule decides)


def carry_over(
    old: Mapping[str, str], present: Iterable[str], hashed_splits: Iterable[str], pinned: Mapping[str, str]
) -> Carry:
    """Pure: which present groups keep their ``old`` split. Pins win over carried assignments."""
    present = set(present)
    takes = set(hashed_splits)
    fixed, reassigned = {}, {}
    for g in sorted(present & set(old)):
        if g in pinned:
            if pinned[g] != old[g]:
                reassigned[g] = old[g]
        elif old[g] in takes:
            fixed[g] = old[g]
        else:
            reassigned[g] = old[g]
    return Carry(
        fixed=fixed,
        new=tuple(sorted(present - set(old))),
        removed=tuple(sorted(set(old) - present)),
        reassigned=reassigned,
    )


def resolve_split_set(catalog: Catalog, ref: str, current_version: str) -> SplitSet:
    """``VERSION/NAME`` (id, unique prefix or tag) or ``NAME`` alone when exactly one other version has a
    split set of that name."""
    ref = str(ref)
    version, slash, name = ref.rpartition("/")
    if slash:
        if not version or not name:
            raise UsageError(f"--from-split {ref!r}: use VERSION/NAME or NAME")
        return open_split_set(catalog, catalog.resolve(version), name)
    found = [
        v.version_id
        for v in catalog.versions()
        if v.version_id != current_version and any(s.name == ref for s in list_split_sets(catalog, v.version_id))
    ]
    if not found:
        raise UsageError(f"--from-split {ref!r}: no other version of {catalog.url} has a split set of that name")
    if len(found) > 1:
        raise UsageError(
            f"--from-split {ref!r}: {len(found)} versions have one ({', '.join(v[:12] for v in found)})",
            hint="give VERSION/NAME",
        )
    return open_split_set(catalog, found[0], ref)

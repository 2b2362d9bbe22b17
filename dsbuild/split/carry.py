"""``--from-split``: carry the group assignments of a split set made for another version.

Carried groups are *fixed*: they keep their old split whatever the rule would say now (even after a
change of ratios or salt), so a model evaluated on the old test split is never trained on it later.
Groups new in this version are assigned by the rule; groups gone from it are reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dsbuild.errors import UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.split.files import MANIFEST, SplitSet, open_split_set, set_dir


@dataclass(frozen=True)
class Carry:
    fixed: dict[str, str]  # group -> old split, for groups that keep it
    new: tuple[str, ...]  # groups not in the old set
    removed: tuple[str, ...]  # old groups not in this version
    reassigned: dict[str, str]  # group -> old split that no longer takes hashed groups (rule decides)


def carry_over(old: Mapping[str, str], present: Iterable[str], hashed_splits: Iterable[str],
               pinned: Mapping[str, str]) -> Carry:
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
    return Carry(fixed=fixed, new=tuple(sorted(present - set(old))),
                 removed=tuple(sorted(set(old) - present)), reassigned=reassigned)


def resolve_split_set(catalog: Catalog, ref: str, current_version: str) -> SplitSet:
    """``VERSION/NAME`` (id or unique prefix), a split set folder of this catalog, or ``NAME`` alone
    when exactly one other version has a split set of that name."""
    ref = str(ref)
    path = Path(ref)
    if (path / MANIFEST).is_file():
        folder = path.resolve()
        splits_root = (catalog.root / "splits").resolve()
        if folder.parent.parent != splits_root:
            raise UsageError(f"--from-split {ref}: not a split set of the catalog {catalog.root} "
                             f"(expected {catalog.root}/splits/<version>/<name>)")
        return open_split_set(catalog.root, catalog.resolve(folder.parent.name), folder.name)
    version, slash, name = ref.rpartition("/")
    if slash:
        if not version or not name:
            raise UsageError(f"--from-split {ref!r}: use VERSION/NAME, NAME or a split set folder")
        return open_split_set(catalog.root, catalog.resolve(version), name)
    found = [v.version_id for v in catalog.versions()
             if v.version_id != current_version and (set_dir(catalog.root, v.version_id, ref) / MANIFEST).is_file()]
    if not found:
        raise UsageError(f"--from-split {ref!r}: no other version of {catalog.root} has a split set of that name")
    if len(found) > 1:
        raise UsageError(f"--from-split {ref!r}: {len(found)} versions have one "
                         f"({', '.join(v[:12] for v in found)}); give VERSION/NAME")
    return open_split_set(catalog.root, found[0], ref)

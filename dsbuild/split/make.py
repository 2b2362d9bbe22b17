"""Making a split set: version index -> groups -> assignment (``assign``) -> split files + manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from dsbuild import __version__
from dsbuild.core.errors import UsageError
from dsbuild.core.hashing import sha256_bytes, sha256_json
from dsbuild.lineage.catalog import Catalog, open_catalog
from dsbuild.lineage.splitsets import (
    Carried,
    SplitEntry,
    SplitManifest,
    SplitSet,
    SplitSource,
    SplitTotals,
    Stratification,
    Stratum,
    Unassigned,
    open_split_set,
    publish_split_set,
    split_set_names,
)
from dsbuild.split.assign import assign_groups, intervals, sample_share_gaps, shares, split_for, unit
from dsbuild.split.carry import Carry, carry_over, resolve_split_set
from dsbuild.split.files import table_bytes
from dsbuild.split.groups import (
    NO_STRATUM,
    VersionSamples,
    field_value,
    group_sessions,
    group_strata,
    read_version,
    rows_by_split,
    samples_per_group,
)
from dsbuild.split.params import SplitOptions, SplitParams, check_name

# A split whose group share is further than this many binomial std from its target is reported.
DEVIATION_WARN_STD = 3.0
# A split whose share of the assigned samples is further than this from its requested ratio is reported
# (0.8 asked, under 0.75 or over 0.85 got): above the hash's own spread with thousands of equal groups, so
# it points at groups of unequal size or too few of them.
SAMPLE_SHARE_TOLERANCE = 0.05
# How many group values an error or warning line names before it says "and N more".
NAMED = 5


@dataclass(frozen=True)
class Computed:
    """A split set as computed, before it is written: file bytes, tables and the sealed manifest."""

    files: dict[str, bytes]
    tables: dict[str, pa.Table]
    manifest: SplitManifest


@dataclass(frozen=True)
class SplitResult:
    catalog: str
    version_id: str
    name: str
    path: str
    state: str  # created | existed | replaced
    manifest: SplitManifest
    hints: tuple[str, ...] = ()  # what the user may have meant to do instead (see ``moved_groups_hint``)

    @property
    def warnings(self) -> list[str]:
        return list(self.manifest.warnings)

    def to_json(self) -> dict:
        m = self.manifest.to_json()
        return {
            "catalog": self.catalog,
            "version_id": self.version_id,
            "name": self.name,
            "path": self.path,
            "state": self.state,
            **{
                k: m[k]
                for k in (
                    "hash",
                    "assignment_id",
                    "parameters",
                    "splits",
                    "totals",
                    "unassigned",
                    "stratification",
                    "carried",
                    "warnings",
                )
            },
            "hints": list(self.hints),
        }


def _named(values) -> str:
    values = list(values)
    more = f" and {len(values) - NAMED} more" if len(values) > NAMED else ""
    return ", ".join(repr(v) for v in values[:NAMED]) + more


def open_version(catalog: str | Path | Catalog, ref: str | None) -> tuple[Catalog, str]:
    cat = catalog if isinstance(catalog, Catalog) else open_catalog(catalog)
    return cat, cat.resolve(ref)


def resolve_params(
    cat: Catalog, version_id: str, options: SplitOptions, inherited: SplitParams | None = None
) -> tuple[SplitParams, SplitSet | None]:
    """Options -> parameters. With ``from_split`` the unset options take that split set's values."""
    old = resolve_split_set(cat, options.from_split, version_id) if options.from_split else None
    if old is not None and inherited is None:
        inherited = SplitParams.from_rule(old.manifest.parameters, old.path)
    params = options.resolve(inherited)
    if old is not None and old.manifest.parameters.by != params.by:
        raise UsageError(
            f"--from-split: {old.version_id[:12]}/{old.name} groups by "
            f"{old.manifest.parameters.by}, not {params.by}; its groups cannot carry over"
        )
    return params, old


def compute(
    vs: VersionSamples, name: str, params: SplitParams, old: SplitSet | None = None, pins_given: bool = True
) -> Computed:
    """Everything a split set holds, from the version's samples and the parameters (no writing)."""
    check_name(name, "split set name")
    group_of, unassigned = group_sessions(vs, params.by)
    spg = samples_per_group(vs, group_of)
    present = set(spg)
    warnings: list[str] = []
    pinned = params.pinned()
    absent = sorted(set(pinned) - present)
    if absent and pins_given:
        split = pinned[absent[0]]
        raise UsageError(
            f"--pin {split}: {len(absent)} group value(s) not in version {vs.version_id[:12]} "
            f"(grouped by {params.by}): {_named(absent)}"
        )
    if absent:
        warnings.append(f"{len(absent)} pinned group(s) are not in this version: {_named(absent)}")
    pinned_here = {g: s for g, s in pinned.items() if g in present}
    hashed_splits = [n for n, _ in params.ratios if n not in params.exclusive]
    carry = None
    if old is not None:
        carry = carry_over(old.group_assignment(), present, hashed_splits, pinned)
    fixed = {**(carry.fixed if carry else {}), **pinned_here}
    strata, multi = group_strata(vs, group_of, params.stratify) if params.stratify else (None, 0)
    a = assign_groups(
        present, ratios=params.ratios, salt=params.salt, fixed=fixed, exclusive=params.exclusive, strata=strata
    )
    share = shares(a.splits, spg, params.ratios, params.exclusive)
    gaps = sample_share_gaps({n: s.samples for n, s in share.items()}, params.ratios, SAMPLE_SHARE_TOLERANCE)

    tables, files, split_docs, key_hashes = {}, {}, {}, {}
    for split in params.split_names:
        table = rows_by_split(vs, group_of, a.splits, split)
        data = table_bytes(table)
        tables[split], files[f"{split}.parquet"] = table, data
        key_hashes[split] = sha256_bytes("".join(k + "\n" for k in table["key"].to_pylist()).encode())
        s = share[split]
        split_docs[split] = SplitEntry(
            file=f"{split}.parquet",
            sha256=sha256_bytes(data),
            bytes=len(data),
            keys_sha256=key_hashes[split],
            pinned=split in params.exclusive,
            groups=s.groups,
            samples=s.samples,
            requested=s.requested,
            target=s.target,
            ratio_groups=s.ratio_groups,
            ratio_samples=s.ratio_samples,
            expected_std_groups=s.expected_std_groups,
            deviation_std=s.deviation_std,
        )
        if s.groups == 0:
            warnings.append(f"split {split!r} is empty (0 groups)")
            continue  # its sample share, 0, says nothing more
        if s.deviation_std is not None and abs(s.deviation_std) > DEVIATION_WARN_STD:
            warnings.append(
                f"split {split!r}: group share {s.ratio_groups:.3f} is {s.deviation_std:+.1f} std "
                f"from its target {s.target:.3f}"
            )
        if split in gaps:
            requested, got = gaps[split]
            warnings.append(
                f"split {split!r}: sample share {got:.3f}, requested {requested:.3f} (more than "
                f"{SAMPLE_SHARE_TOLERANCE:g} off: the groups are few or differ in size)"
            )
    unassigned_samples = sum(vs.samples_per_session[sid] for sid in unassigned)
    if unassigned:
        warnings.append(
            f"{len(unassigned)} session(s) without {params.by} are unassigned "
            f"({unassigned_samples} samples): {_named(unassigned)}"
        )
    stratification = None
    if strata is not None and params.stratify is not None:  # (strata are made only when it is set)
        uncovered = {label: r for label, r in a.strata.items() if r.missing}
        for label, r in uncovered.items():
            warnings.append(
                f"stratum {label or '(none)'!r} ({r.groups} group(s)) is missing from split(s) {', '.join(r.missing)}"
            )
        warnings += _strata_without_samples(vs, tables, params.stratify, set(uncovered), hashed_splits)
        stratification = Stratification(
            field=params.stratify,
            multi_stratum_groups=multi,
            uncovered=tuple(sorted(uncovered)),
            repaired={g: tuple(v) for g, v in sorted(a.repaired.items())},
            strata={
                label: Stratum(r.groups, dict(r.per_split), tuple(r.missing), tuple(sorted(r.repaired)))
                for label, r in a.strata.items()
            },
        )
    carried = _carried_doc(carry, a.splits, old, params) if carry and old is not None else None
    if carry and carry.reassigned:
        warnings.append(
            f"{len(carry.reassigned)} carried group(s) were reassigned because their old split "
            f"no longer takes hashed groups or they are pinned: {_named(carry.reassigned)}"
        )
    manifest = SplitManifest(
        tool_version=__version__,
        name=name,
        version_id=vs.version_id,
        version_content_id=vs.content_id,
        parameters=params.to_rule(None if old is None else SplitSource(old.version_id, old.name, old.hash)),
        splits=split_docs,
        totals=SplitTotals(
            sessions=len(vs.session_ids),
            samples=vs.table.num_rows,
            groups=len(present),
            hashed_groups=sum(1 for g in present if g not in pinned_here),
            assigned_samples=vs.table.num_rows - unassigned_samples,
        ),
        unassigned=Unassigned(params.by, tuple(unassigned), unassigned_samples),
        stratification=stratification,
        carried=carried,
        assignment_id=sha256_json(key_hashes),
        warnings=tuple(warnings),
    )
    return Computed(files=files, tables=tables, manifest=manifest.sealed())


def _strata_without_samples(
    vs: VersionSamples, tables: dict, stratify: str, warned: set[str], hashed_splits: list[str]
) -> list[str]:
    """Warnings for values of the ``stratify`` field that reach no sample of a hashed split although no
    stratum was reported missing: a value every group of which belongs mostly to other strata (a
    title each player played once) has no groups of its own, so stratification cannot place it."""
    reach: dict[str, set[str]] = {}
    for split, table in tables.items():
        for sid in set(table["session_id"].to_pylist()):
            reach.setdefault(field_value(vs.sessions[sid], stratify) or NO_STRATUM, set()).add(split)
    labels = {field_value(vs.sessions[sid], stratify) or NO_STRATUM for sid in vs.session_ids}
    out = []
    for label in sorted(labels - warned):
        missing = [s for s in hashed_splits if s not in reach.get(label, set())]
        if missing:
            out.append(
                f"{stratify} {label or '(none)'!r} reaches no sample of split(s) {', '.join(missing)}: "
                "no group has most of its samples there, so stratification cannot place it"
            )
    return out


def _carried_doc(carry: Carry, final: dict, old: SplitSet, params: SplitParams) -> Carried:
    bounds = intervals(params.ratios, params.exclusive)
    return Carried(
        source=f"{old.version_id}/{old.name}",
        carried_groups=len(carry.fixed),
        new_groups={g: final[g] for g in carry.new},
        removed_groups=tuple(carry.removed),
        reassigned_groups={g: (s, final[g]) for g, s in carry.reassigned.items()},
        # carried groups the rule alone would now put elsewhere (ratios, salt or stratification changed)
        differs_from_rule=sum(1 for g, s in carry.fixed.items() if split_for(unit(params.salt, g), bounds) != s),
    )


def make_split(
    catalog: str | Path | Catalog,
    version: str | None,
    name: str,
    options: SplitOptions | None = None,
    *,
    force: bool = False,
) -> SplitResult:
    """Compute the split set ``name`` of a version (None = newest) and write it into the catalog.

    An identical split set already there is left as is (state "existed"); a different one is replaced
    only with ``force``. Raises ``UsageError`` for bad parameters, unknown versions, fields no session
    has, and pin files naming groups the version does not hold.
    """
    options = options or SplitOptions()
    cat, version_id = open_version(catalog, version)
    check_name(name, "split set name")
    params, old = resolve_params(cat, version_id, options)
    if old is not None and (old.version_id, old.name) == (version_id, name):
        raise UsageError(
            f"--from-split {options.from_split}: is the split set being made; it cannot carry "
            "its own groups (its `--check` could never pass once it is replaced)",
            hint="carry from the split set of another version, or give the rule alone",
        )
    vs = read_version(cat, version_id)
    computed = compute(vs, name, params, old, pins_given=options.pins is not None)
    state = publish_split_set(cat, version_id, name, computed.files, computed.manifest, force=force)
    hint = moved_groups_hint(cat, version_id, name) if state != "existed" and old is None else None
    return SplitResult(
        catalog=cat.url,
        version_id=version_id,
        name=name,
        path=f"{cat.url}/splits/{version_id}/{name}/{computed.manifest.hash}",
        state=state,
        manifest=computed.manifest,
        hints=(hint,) if hint else (),
    )


def moved_groups_hint(cat: Catalog, version_id: str, name: str) -> str | None:
    """A split set made by its rule alone for a new version need not follow the one of the same name in
    an earlier version (other ratios, a stratification, pins): a group that moves from train to test leaks
    what a model trained on into its evaluation. When the newest earlier version's split set puts groups
    both hold elsewhere, say how many and how to carry its assignments instead."""
    earlier = next(
        (
            v.version_id
            for v in cat.versions()
            if v.version_id != version_id and name in split_set_names(cat, v.version_id)
        ),
        None,
    )
    if earlier is None:
        return None
    before = open_split_set(cat, earlier, name).group_assignment()
    now = open_split_set(cat, version_id, name).group_assignment()
    moved = sorted(g for g in before.keys() & now.keys() if before[g] != now[g])
    if not moved:
        return None
    return (
        f"{len(moved)} of the {len(before.keys() & now.keys())} groups that version {earlier[:12]} also holds "
        f"are in another split than in its split set {name!r} (e.g. {moved[0]!r}: {before[moved[0]]} there, "
        f"{now[moved[0]]} here); to keep every group where it was, make it with --from-split "
        f"{earlier[:12]}/{name} --force"
    )

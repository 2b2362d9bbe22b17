"""Comparing two split sets (of one version or of two): which groups and samples moved, came or went."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from dsbuild.lineage.splitsets import SplitSet


def compare_assignments(a: Mapping[str, str], b: Mapping[str, str]) -> dict:
    """Pure: item -> split maps ``a`` and ``b`` -> moved / added / removed / unchanged."""
    moved = {k: [a[k], b[k]] for k in sorted(a.keys() & b.keys()) if a[k] != b[k]}
    return {
        "moved": moved,
        "added": {k: b[k] for k in sorted(b.keys() - a.keys())},
        "removed": {k: a[k] for k in sorted(a.keys() - b.keys())},
        "unchanged": sum(1 for k in a.keys() & b.keys() if a[k] == b[k]),
    }


def _keys(s: SplitSet) -> dict[str, str]:
    return {k: split for split in s.splits for k in s.table(split, ["key"])["key"].to_pylist()}


def diff_split_sets(a: SplitSet, b: SplitSet) -> dict:
    """Groups moved (with from/to), added and removed; sample counts of the same; changed parameters.

    ``a`` and ``b`` are split sets or their folders (``<catalog>/splits/<version>/<name>``). Samples are
    matched by key, so a split set of an older version compares with one of a newer version.
    """
    groups = compare_assignments(a.group_assignment(), b.group_assignment())
    ka, kb = _keys(a), _keys(b)
    samples = compare_assignments(ka, kb)
    transitions = Counter(f"{x}->{y}" for x, y in samples["moved"].values())
    pa_, pb = a.manifest.parameters.to_json(), b.manifest.parameters.to_json()
    return {
        "a": {"version_id": a.version_id, "name": a.name, "hash": a.hash},
        "b": {"version_id": b.version_id, "name": b.name, "hash": b.hash},
        "identical": a.hash == b.hash,
        "same_assignment": a.manifest.assignment_id == b.manifest.assignment_id,
        "parameters": {k: [pa_.get(k), pb.get(k)] for k in sorted(set(pa_) | set(pb)) if pa_.get(k) != pb.get(k)},
        "groups": groups,
        "samples": {
            "moved": len(samples["moved"]),
            "added": len(samples["added"]),
            "removed": len(samples["removed"]),
            "unchanged": samples["unchanged"],
            "transitions": dict(sorted(transitions.items())),
        },
        "splits": {s: {"a": _counts(a, s), "b": _counts(b, s)} for s in sorted(set(a.splits) | set(b.splits))},
    }


def _counts(s: SplitSet, split: str) -> dict | None:
    rec = s.manifest.splits.get(split)
    return None if rec is None else {"groups": rec.groups, "samples": rec.samples}

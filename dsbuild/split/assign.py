"""Split assignment: pure functions from (salt, group values, ratios) to a split per group. No I/O.

The rule (``RULE``), in three steps:

1. **Keyed hash.** Each group value maps to a point ``u`` in [0, 1): the first 53 bits of
   ``sha256(TAG || len(salt) || salt || value)``. It depends on nothing but the salt and the value, so it
   is the same on any machine, in any file order, with any number of workers.
2. **Thresholds.** Split names are put in a canonical order (sorted by name, so ``train=.8,val=.1`` and
   ``val=.1,train=.8`` are the same request) and their ratios laid end to end on [0, 1); a group goes to
   the split whose interval holds its ``u``. Splits reserved for pinned groups (``exclusive``) take no
   hashed groups: the remaining ratios are renormalised to fill [0, 1).
3. **Stratified coverage repair** (only with ``strata``). Within a stratum (e.g. one title) holding at
   least as many groups as there are hashed splits, if the thresholds left a split without any group, the
   group whose ``u`` lies closest to the empty split's interval, taken from a split holding two or more,
   is moved there; repeated for each empty split, largest ratio first. A stratum with fewer groups than
   splits cannot cover them all: it keeps its threshold assignment and is reported.

**Stable under growth — and the trade-off of stratifying.** Steps 1-2 give every group a split that is a
function of that group alone, so adding groups never moves an existing group. Step 3 cannot have that
property in full, and no rule can: "adding groups never moves a group" means a group's split is the same
in every set that contains it, including the set holding only that group, so it can depend on nothing but
the group itself -- and then nothing can guarantee that a stratum's few groups land in different splits.
We choose coverage with a bounded, visible cost:

- a stratum whose thresholds already cover every split is never repaired, and adding groups cannot
  uncover it, so from then on none of its groups ever moves;
- a group can move between two builds only if it was repaired in one of them (recorded in the split
  manifest), at most ``splits - 1`` groups per stratum, and only in strata that were not yet covered
  by the thresholds;
- ``--from-split`` removes even that: carried groups are ``fixed``, repair never touches them.

Without ``--stratify`` the assignment is exactly steps 1-2: perfectly stable.

**Expected deviation.** With ``n`` hashed groups a split of ratio ``p`` receives a binomial share of them:
its realised group share has standard deviation ``sqrt(p (1 - p) / n)`` (``expected_std``) -- for
``p = 0.1`` that is 0.095 with 10 groups, 0.03 with 100 and 0.0095 with 1,000. The share of *samples*
deviates more when groups differ in size: one player holding half the data puts half of it wherever the
hash puts that player (``sample_share_gaps`` finds such splits). Small datasets should expect, and are
warned about, empty splits.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

RULE = "dsbuild.split.assign/1"
_TAG = b"dsbuild.split/1\x00"
_SCALE = float(1 << 53)

Ratios = tuple[tuple[str, float], ...]  # canonical: sorted by split name


def unit(salt: str, value: str) -> float:
    """The group's point in [0, 1): 53 bits of a keyed sha256, exact as a float on every machine."""
    s = salt.encode("utf-8")
    digest = hashlib.sha256(_TAG + len(s).to_bytes(8, "big") + s + value.encode("utf-8")).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / _SCALE


def canonical_ratios(ratios: Mapping[str, float] | Iterable[tuple[str, float]]) -> Ratios:
    items = ratios.items() if isinstance(ratios, Mapping) else ratios
    return tuple(sorted((str(k), float(v)) for k, v in items))


def intervals(ratios: Ratios, exclusive: Iterable[str] = ()) -> dict[str, tuple[float, float]]:
    """[lo, hi) of each split that takes hashed groups; the last interval ends at exactly 1.0."""
    excl = set(exclusive)
    free = [(n, r) for n, r in ratios if n not in excl and r > 0]
    total = math.fsum(r for _, r in free)
    if not free or total <= 0:
        return {}
    out, lo, acc = {}, 0.0, 0.0
    for i, (name, r) in enumerate(free):
        acc += r
        hi = 1.0 if i == len(free) - 1 else acc / total
        out[name] = (lo, hi)
        lo = hi
    return out


def split_for(u: float, bounds: Mapping[str, tuple[float, float]]) -> str:
    """The split whose [lo, hi) holds ``u`` (bounds as returned by ``intervals``)."""
    for name, (lo, hi) in bounds.items():
        if lo <= u < hi:
            return name
    raise ValueError(f"u={u!r} outside [0, 1) or no split takes hashed groups")


def expected_std(p: float, n: int) -> float:
    """Standard deviation of the group share of a split of ratio ``p`` over ``n`` hashed groups."""
    return math.sqrt(p * (1 - p) / n) if n > 0 else 0.0


@dataclass(frozen=True)
class StratumReport:
    groups: int
    per_split: dict[str, int]
    missing: tuple[str, ...]  # splits without a group of this stratum after repair
    repaired: dict[str, tuple[str, str]]  # group -> (threshold split, repaired split)


@dataclass(frozen=True)
class Assignment:
    splits: dict[str, str]  # group -> split, keys sorted
    base: dict[str, str]  # group -> split by thresholds alone (hashed groups only)
    repaired: dict[str, tuple[str, str]] = field(default_factory=dict)
    strata: dict[str, StratumReport] = field(default_factory=dict)  # stratum label -> report


def _distance(u: float, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return lo - u if u < lo else (u - hi if u >= hi else 0.0)


def assign_groups(
    groups: Iterable[str],
    *,
    ratios: Ratios,
    salt: str,
    fixed: Mapping[str, str] | None = None,
    exclusive: Iterable[str] = (),
    strata: Mapping[str, str] | None = None,
) -> Assignment:
    """Assign every group to one split.

    ``fixed`` groups keep the split given (pinned or carried over); the others are hashed onto the
    splits not in ``exclusive``. With ``strata`` (group -> stratum label) the coverage repair runs per
    stratum, moving hashed groups only. The result depends on the *set* of groups, never their order.
    """
    fixed = dict(fixed or {})
    names = [n for n, _ in ratios]
    unknown = sorted({s for s in fixed.values() if s not in names} - set(exclusive))
    if unknown:
        raise ValueError(f"fixed groups name splits {unknown} that are not in the ratios")
    bounds = intervals(ratios, exclusive)
    all_groups = sorted(set(groups) | set(fixed))
    hashed = [g for g in all_groups if g not in fixed]
    if hashed and not bounds:
        raise ValueError("no split takes hashed groups (every split with a ratio is pinned)")
    u = {g: unit(salt, g) for g in hashed}
    base = {g: split_for(u[g], bounds) for g in hashed}
    current = {g: fixed[g] if g in fixed else base[g] for g in all_groups}  # a group is pinned or hashed
    repaired: dict[str, tuple[str, str]] = {}
    reports: dict[str, StratumReport] = {}
    if strata is not None:
        ratio_of = dict(ratios)
        order = sorted(bounds, key=lambda n: (-ratio_of[n], n))  # fill the largest empty split first
        members: dict[str, list[str]] = {}
        for g in all_groups:
            members.setdefault(strata[g], []).append(g)
        for label in sorted(members):
            local = _repair(members[label], current, u, bounds, order)
            repaired.update(local)
            counts = Counter(current[g] for g in members[label])
            reports[label] = StratumReport(
                groups=len(members[label]),
                per_split={n: counts.get(n, 0) for n in names},
                missing=tuple(n for n in names if not counts.get(n)),
                repaired=local,
            )
    return Assignment(splits=current, base=base, repaired=repaired, strata=reports)


def _repair(
    members: list[str],
    current: dict[str, str],
    u: Mapping[str, float],
    bounds: Mapping[str, tuple[float, float]],
    order: Sequence[str],
) -> dict[str, tuple[str, str]]:
    """Move hashed groups of one stratum into its empty hashed splits (mutates ``current``).

    Only a stratum with at least as many groups in hashed splits as there are hashed splits is repaired:
    a smaller one cannot cover them all, and half-covering it would skew the ratios for no guarantee.
    """
    if sum(1 for g in members if current[g] in bounds) < len(bounds):
        return {}
    counts = Counter(current[g] for g in members)
    moved: dict[str, tuple[str, str]] = {}
    for target in order:
        if counts[target]:
            continue
        donors = [g for g in members if g in u and g not in moved and counts[current[g]] >= 2]
        if not donors:
            break  # donors do not depend on the target: no later split can be filled either
        g = min(donors, key=lambda d: (_distance(u[d], bounds[target]), d))
        moved[g] = (current[g], target)
        counts[current[g]] -= 1
        counts[target] += 1
        current[g] = target
    return moved


def majority_stratum(counts: Mapping[str, int]) -> str:
    """A group spanning several strata belongs to the one holding most of its samples (ties: smallest)."""
    return min(counts, key=lambda s: (-counts[s], s))


@dataclass(frozen=True)
class SplitShare:
    groups: int
    samples: int
    ratio_groups: float
    ratio_samples: float
    requested: float | None
    target: float | None  # ratio among hashed groups (renormalised around pinned splits); None if pinned
    expected_std_groups: float | None  # binomial std of the share among hashed groups; None if pinned
    deviation_std: float | None  # (realised - target) / expected std, among hashed groups


def shares(
    assignment: Mapping[str, str], samples_per_group: Mapping[str, int], ratios: Ratios, exclusive: Iterable[str] = ()
) -> dict[str, SplitShare]:
    """Realised group and sample shares per split, with the binomial std expected for hashed groups."""
    excl = set(exclusive)
    names = sorted({n for n, _ in ratios} | excl)
    ratio_of = dict(ratios)
    free_total = math.fsum(r for n, r in ratios if n not in excl)
    n_groups = len(assignment)
    n_samples = sum(samples_per_group[g] for g in assignment)
    n_hashed = sum(1 for s in assignment.values() if s not in excl)
    g_count: Counter[str] = Counter()
    s_count: Counter[str] = Counter()
    for g, s in assignment.items():
        g_count[s] += 1
        s_count[s] += samples_per_group[g]
    out = {}
    for n in names:
        p = ratio_of[n] / free_total if n not in excl and free_total > 0 else None
        std = expected_std(p, n_hashed) if p is not None else None
        dev = (g_count[n] / n_hashed - p) / std if p is not None and std else None
        out[n] = SplitShare(
            groups=g_count[n],
            samples=s_count[n],
            ratio_groups=round(g_count[n] / n_groups, 6) if n_groups else 0.0,
            ratio_samples=round(s_count[n] / n_samples, 6) if n_samples else 0.0,
            requested=ratio_of.get(n),
            target=None if p is None else round(p, 6),
            expected_std_groups=None if std is None else round(std, 6),
            deviation_std=None if dev is None else round(dev, 3),
        )
    return out


def sample_share_gaps(samples: Mapping[str, int], ratios: Ratios, tolerance: float) -> dict[str, tuple[float, float]]:
    """split -> (requested ratio, realised sample share) of each split whose share of the samples is more
    than ``tolerance`` from its ratio: the hash balances groups, not samples, so unequal groups can leave a
    split asked for 0.8 with 0.5 of the samples while every group share looks right."""
    total = sum(samples.values())
    if not total:
        return {}
    got = {name: samples.get(name, 0) / total for name, _ in ratios}
    return {name: (r, got[name]) for name, r in ratios if abs(got[name] - r) > tolerance}

"""The split rule as pure functions: keyed hash, thresholds, stratified coverage, pins and carry-over.

Properties are checked with hypothesis; one golden vector pins the rule so an accidental change of
assignment (which would silently reshuffle every user's splits) is caught.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import UsageError
from dsbuild.split.assign import (
    RULE,
    assign_groups,
    canonical_ratios,
    expected_std,
    intervals,
    majority_stratum,
    sample_share_gaps,
    shares,
    split_for,
    unit,
)
from dsbuild.split.carry import carry_over
from dsbuild.split.check import overlaps
from dsbuild.split.diff import compare_assignments
from dsbuild.split.params import DEFAULT_RATIOS, SplitParams, parse_ratios

GROUP = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
GROUPS = st.lists(GROUP, min_size=1, max_size=60, unique=True)
SALT = st.text(max_size=8)
NAMES = st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), min_size=1, max_size=5, unique=True)


@st.composite
def ratio_sets(draw, min_splits: int = 1) -> tuple[tuple[str, float], ...]:
    names = draw(NAMES.filter(lambda n: len(n) >= min_splits))
    weights = [draw(st.integers(1, 100)) for _ in names]
    return canonical_ratios({n: w / sum(weights) for n, w in zip(names, weights)})


# -- the keyed hash --------------------------------------------------------------------------------


def test_golden_vector_pins_the_rule():
    assert RULE == "dsbuild.split.assign/1"
    assert unit("dsbuild", "p-0000") == 0.04710901993997596
    assert unit("", "") == 0.7875143894179436
    a = assign_groups([f"p-{i:04x}" for i in range(24)], ratios=DEFAULT_RATIOS, salt="dsbuild")
    assert {g: s for g, s in a.splits.items() if s != "train"} == {
        "p-0000": "test",
        "p-0003": "test",
        "p-0007": "val",
        "p-000b": "val",
        "p-000d": "test",
    }


@given(SALT, GROUP)
def test_unit_is_a_deterministic_point_in_the_unit_interval(salt, value):
    u = unit(salt, value)
    assert 0.0 <= u < 1.0 and u == unit(salt, value)


@given(GROUP, GROUP)
def test_salt_and_value_cannot_be_confused_by_concatenation(a, b):
    assume(len(b) >= 2)
    assert unit(a, b) != unit(a + b[0], b[1:])  # the salt is length-prefixed


@given(ratio_sets(), st.floats(0, 1, exclude_max=True))
def test_thresholds_tile_the_unit_interval(ratios, u):
    bounds = intervals(ratios)
    assert list(bounds) == [n for n, _ in ratios]
    assert next(iter(bounds.values()))[0] == 0.0 and list(bounds.values())[-1][1] == 1.0
    assert split_for(u, bounds) in bounds
    assert sum(lo <= u < hi for lo, hi in bounds.values()) == 1


# -- the assignment --------------------------------------------------------------------------------


@given(GROUPS, ratio_sets(), SALT, st.randoms(use_true_random=False))
def test_assignment_is_independent_of_the_order_groups_arrive_in(groups, ratios, salt, rnd):
    shuffled = list(groups)
    rnd.shuffle(shuffled)
    a = assign_groups(groups, ratios=ratios, salt=salt)
    b = assign_groups(shuffled, ratios=ratios, salt=salt)
    assert a.splits == b.splits
    assert list(a.splits) == sorted(a.splits)


@given(GROUPS, GROUPS, ratio_sets(), SALT)
def test_adding_groups_never_moves_an_existing_group(old, extra, ratios, salt):
    before = assign_groups(old, ratios=ratios, salt=salt).splits
    after = assign_groups(old + extra, ratios=ratios, salt=salt).splits
    assert {g: after[g] for g in before} == before


@given(GROUPS, ratio_sets(), SALT)
def test_a_group_depends_on_nothing_but_itself(groups, ratios, salt):
    together = assign_groups(groups, ratios=ratios, salt=salt).splits
    for g in groups[:10]:
        assert assign_groups([g], ratios=ratios, salt=salt).splits[g] == together[g]


@given(GROUPS, ratio_sets(min_splits=2), SALT, st.data())
def test_every_group_gets_exactly_one_split_and_pins_hold(groups, ratios, salt, data):
    names = [n for n, _ in ratios]
    pinned_split = data.draw(st.sampled_from(names))
    pinned = dict.fromkeys(data.draw(st.lists(st.sampled_from(groups), unique=True, max_size=5)), pinned_split)
    a = assign_groups(groups, ratios=ratios, salt=salt, fixed=pinned, exclusive={pinned_split})
    assert set(a.splits) == set(groups)
    assert all(s in names for s in a.splits.values())
    assert all(a.splits[g] == pinned_split for g in pinned)
    assert all(s != pinned_split for g, s in a.splits.items() if g not in pinned)


@given(GROUPS, SALT)
def test_pinned_split_is_frozen_whatever_the_ratios(groups, salt):
    pinned = dict.fromkeys(groups[:3], "test")
    for ratios in (
        {"train": 0.8, "val": 0.1, "test": 0.1},
        {"train": 0.5, "val": 0.4, "test": 0.1},
        {"train": 0.9, "test": 0.1},
    ):
        a = assign_groups(groups, ratios=canonical_ratios(ratios), salt=salt, fixed=pinned, exclusive={"test"})
        assert {g for g, s in a.splits.items() if s == "test"} == set(pinned)


# -- stratified coverage ---------------------------------------------------------------------------


@st.composite
def stratified(draw):
    groups = draw(st.lists(GROUP, min_size=1, max_size=40, unique=True))
    labels = draw(st.lists(st.sampled_from(["A", "B", "C", "D"]), min_size=len(groups), max_size=len(groups)))
    return groups, dict(zip(groups, labels))


@given(stratified(), ratio_sets(min_splits=2), SALT)
def test_stratum_with_enough_groups_reaches_every_split(gs, ratios, salt):
    groups, strata = gs
    a = assign_groups(groups, ratios=ratios, salt=salt, strata=strata)
    k = len(ratios)
    for label, report in a.strata.items():
        members = [g for g in groups if strata[g] == label]
        got = {a.splits[g] for g in members}
        if len(members) >= k:
            assert got == {n for n, _ in ratios} and report.missing == ()
        else:
            assert not report.repaired  # too small to cover: left on its thresholds, and reported
            assert set(report.missing) == {n for n, _ in ratios} - got
        assert len(report.repaired) <= k - 1


@given(stratified(), stratified(), ratio_sets(min_splits=2), SALT)
def test_stratified_growth_moves_only_repaired_groups_and_never_in_covered_strata(old, new, ratios, salt):
    groups, strata = old
    extra = [g for g in new[0] if g not in strata]
    grown = {**strata, **{g: new[1][g] for g in extra}}
    before = assign_groups(groups, ratios=ratios, salt=salt, strata=strata)
    after = assign_groups(groups + extra, ratios=ratios, salt=salt, strata=grown)
    moved = {g for g in groups if before.splits[g] != after.splits[g]}
    assert moved <= set(before.repaired) | set(after.repaired)
    names = {n for n, _ in ratios}
    for label in before.strata:
        members = [g for g in groups if strata[g] == label]
        if {before.base[g] for g in members} == names:  # thresholds alone covered it: frozen for good
            assert not moved & set(members)


@given(stratified(), ratio_sets(min_splits=2), SALT, st.data())
def test_repair_never_moves_fixed_groups(gs, ratios, salt, data):
    groups, strata = gs
    names = [n for n, _ in ratios]
    fixed = {g: data.draw(st.sampled_from(names)) for g in groups[: len(groups) // 2]}
    a = assign_groups(groups, ratios=ratios, salt=salt, fixed=fixed, strata=strata)
    assert all(a.splits[g] == s for g, s in fixed.items())
    assert not set(a.repaired) & set(fixed)


def test_majority_stratum_takes_most_samples_then_the_smallest_label():
    assert majority_stratum({"B": 3, "A": 1}) == "B"
    assert majority_stratum({"B": 2, "A": 2}) == "A"


# -- realised ratios -------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(ratio_sets(), SALT)
def test_realised_group_shares_are_within_five_binomial_std_of_the_ratios(ratios, salt):
    n = 3000
    groups = [f"g{i}" for i in range(n)]
    a = assign_groups(groups, ratios=ratios, salt=salt)
    share = shares(a.splits, dict.fromkeys(groups, 1), ratios)
    for name, p in ratios:
        assert abs(share[name].ratio_groups - p) <= 5 * expected_std(p, n) + 1e-9
        assert share[name].expected_std_groups == round(math.sqrt(p * (1 - p) / n), 6)


def test_documented_binomial_std_matches_the_spread_over_salts():
    p, n, trials = 0.1, 100, 400
    ratios = canonical_ratios({"a": p, "b": 1 - p})
    values = []
    for t in range(trials):
        a = assign_groups([f"g{i}" for i in range(n)], ratios=ratios, salt=f"s{t}")
        values.append(sum(s == "a" for s in a.splits.values()) / n)
    mean = sum(values) / trials
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (trials - 1))
    assert abs(mean - p) < 0.01
    assert abs(std - expected_std(p, n)) / expected_std(p, n) < 0.15  # documented: 0.03 for p=0.1, n=100


def test_shares_renormalise_around_a_pinned_split():
    groups = [f"g{i}" for i in range(2000)]
    ratios = DEFAULT_RATIOS
    fixed = dict.fromkeys(groups[:200], "test")
    a = assign_groups(groups, ratios=ratios, salt="x", fixed=fixed, exclusive={"test"})
    share = shares(a.splits, dict.fromkeys(groups, 2), ratios, exclusive={"test"})
    assert share["test"].target is None and share["test"].groups == 200
    assert share["train"].target == round(0.8 / 0.9, 6)
    assert abs(share["train"].deviation_std) < 5 and abs(share["val"].deviation_std) < 5
    assert sum(s.samples for s in share.values()) == 4000


@given(ratio_sets(), st.lists(st.integers(0, 10_000), min_size=5, max_size=5), st.integers(1, 1000))
def test_sample_share_gaps_are_the_splits_further_than_the_tolerance_at_any_scale(ratios, counts, k):
    samples = dict(zip((n for n, _ in ratios), counts))
    total = sum(samples.values())
    gaps = sample_share_gaps(samples, ratios, 0.05)
    assert gaps == sample_share_gaps({n: c * k for n, c in samples.items()}, ratios, 0.05)  # shares, not counts
    for name, requested in ratios:
        off = total > 0 and abs(samples[name] / total - requested) > 0.05
        assert (name in gaps) == off
        if off:
            assert gaps[name] == (requested, samples[name] / total)


@settings(max_examples=30, deadline=None)
@given(ratio_sets(min_splits=2), SALT, st.lists(st.integers(1, 20), min_size=1, max_size=30))
def test_a_group_holding_most_samples_puts_its_split_off_its_ratio_whatever_the_hash(ratios, salt, sizes):
    """The reported case: one player with most of the data, wherever the hash puts them, drags that
    split's sample share away from every ratio while the group shares can look right."""
    most = max(r for _, r in ratios) + 0.05
    assume(most < 1)
    groups = {f"g{i}": n for i, n in enumerate(sizes)}
    groups["whale"] = math.floor(sum(sizes) * most / (1 - most)) + 1  # more than `most` of all samples
    a = assign_groups(groups, ratios=ratios, salt=salt)
    samples = Counter()
    for g, split in a.splits.items():
        samples[split] += groups[g]
    assert a.splits["whale"] in sample_share_gaps(samples, ratios, 0.05)


@settings(max_examples=15, deadline=None)
@given(ratio_sets(), SALT)
def test_many_groups_of_one_size_stay_within_the_tolerance(ratios, salt):
    """0.05 is above the hash's own spread with many groups (5 binomial std <= 0.046 at 3,000 groups):
    the warning points at group sizes or too few groups, not at chance."""
    groups = [f"g{i}" for i in range(3000)]
    a = assign_groups(groups, ratios=ratios, salt=salt)
    assert sample_share_gaps(Counter(a.splits.values()), ratios, 0.05) == {}


# -- parameters ------------------------------------------------------------------------------------


@given(ratio_sets(), st.randoms(use_true_random=False))
def test_ratios_parse_to_one_canonical_form_in_any_order(ratios, rnd):
    items = list(ratios)
    rnd.shuffle(items)
    text = ",".join(f"{n}={r!r}" for n, r in items)
    assume(abs(math.fsum(r for _, r in ratios) - 1) <= 1e-6)
    assert parse_ratios(text) == ratios


@given(ratio_sets(), st.floats(1e-5, 0.5))
def test_ratios_that_do_not_sum_to_one_are_a_usage_error(ratios, delta):
    text = (
        ",".join(f"{n}={r!r}" for n, r in ratios[:-1])
        + ("," if len(ratios) > 1 else "")
        + f"{ratios[-1][0]}={ratios[-1][1] + delta!r}"
    )
    assume(ratios[-1][1] + delta <= 1)
    with pytest.raises(UsageError, match="sum to"):
        parse_ratios(text)


@pytest.mark.parametrize(
    "text", ["train=0.8,train=0.2", "train", "tr.ain=1", "train=nan", "train=-1,val=2", "unassigned=1", "", "train=x"]
)
def test_malformed_ratios_are_one_line_usage_errors(text):
    with pytest.raises(UsageError) as e:
        parse_ratios(text)
    assert "\n" not in str(e.value)


def test_a_group_pinned_to_two_splits_or_everything_pinned_is_refused():
    with pytest.raises(UsageError, match="pinned to both"):
        SplitParams(pins=(("test", ("a",)), ("val", ("a",))))
    with pytest.raises(UsageError, match="every split is pinned"):
        SplitParams(ratios=canonical_ratios({"test": 1.0}), pins=(("test", ("a",)),))


# -- carry-over, overlaps and diffs ----------------------------------------------------------------


@given(st.dictionaries(GROUP, st.sampled_from(["train", "val", "test", "gone"]), max_size=30), GROUPS, st.data())
def test_carry_over_keeps_old_splits_that_still_take_groups(old, present, data):
    pinned = dict.fromkeys(data.draw(st.lists(st.sampled_from(present), unique=True, max_size=3)), "test")
    c = carry_over(old, present, ["train", "val"], pinned)
    assert set(c.new) == set(present) - set(old)
    assert set(c.removed) == set(old) - set(present)
    assert all(old[g] == s and s in ("train", "val") and g not in pinned for g, s in c.fixed.items())
    assert set(c.fixed) | set(c.reassigned) | {g for g in pinned if g in old and old[g] == "test"} == set(
        present
    ) & set(old)


@given(st.dictionaries(st.sampled_from("abc"), st.lists(st.sampled_from("wxyz"), max_size=4)))
def test_overlaps_finds_exactly_the_values_in_two_splits(members):
    found = overlaps(members)
    for v in "wxyz":
        holders = sorted(s for s, vs in members.items() if v in vs)
        assert (v in found) == (len(holders) > 1)
        if v in found:
            assert found[v] == holders


@given(
    st.dictionaries(GROUP, st.sampled_from("abc"), max_size=20),
    st.dictionaries(GROUP, st.sampled_from("abc"), max_size=20),
)
def test_compare_assignments_accounts_for_every_item(a, b):
    d = compare_assignments(a, b)
    assert len(d["moved"]) + d["unchanged"] + len(d["added"]) == len(b)
    assert len(d["moved"]) + d["unchanged"] + len(d["removed"]) == len(a)
    assert all(a[k] == x and b[k] == y for k, (x, y) in d["moved"].items())


def test_many_groups_assign_quickly():
    groups = [f"player-{i}" for i in range(100_000)]
    a = assign_groups(groups, ratios=DEFAULT_RATIOS, salt="s")
    assert len(a.splits) == 100_000

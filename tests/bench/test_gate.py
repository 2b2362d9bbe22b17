"""The regression decision (pure, property-tested): per reference a drop beyond the floor and the spread,
and ours regressed only when every reference agrees; and the refusal to compare unlike runs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.bench.gate import MIN_ROUNDS, Against, decide, judge
from dsbuild.bench.stats import summarise
from dsbuild.core.errors import UsageError

rounds = st.lists(st.floats(min_value=0.05, max_value=20, allow_nan=False), min_size=MIN_ROUNDS, max_size=9)
fail_below = st.floats(min_value=0.5, max_value=1.0)


@given(rounds, fail_below)
def test_a_run_never_drops_against_itself(xs, fb):
    s = summarise(xs)
    assert not judge("pyav", s, s, fb).dropped


@given(rounds, rounds, fail_below, st.floats(min_value=0.01, max_value=100))
def test_the_decision_does_not_depend_on_the_unit(a, b, fb, k):
    plain = judge("x", summarise(a), summarise(b), fb).dropped
    scaled = judge("x", summarise([x * k for x in a]), summarise([x * k for x in b]), fb).dropped
    assert plain == scaled or abs(summarise(b).median - fb * summarise(a).median) < 1e-9 * max(a + b)


@given(rounds, rounds, fail_below, st.floats(min_value=0.1, max_value=1.0))
def test_lower_figures_never_turn_a_drop_into_a_pass(a, b, fb, k):
    saved, now = summarise(a), summarise(b)
    if judge("x", saved, now, fb).dropped:
        lower = [x * k for x in b]  # every round lower: a smaller median, and a spread no wider
        assert judge("x", saved, summarise(lower), fb).dropped


@given(rounds, fail_below)
def test_a_drop_beyond_the_floor_and_the_spread_counts(xs, fb):
    saved = summarise(xs)
    gap = max(saved.iqr, (1 - fb) * saved.median) * 1.5 + 1e-6
    now = summarise([x - saved.median + (saved.median - gap) for x in xs])  # same spread, median lower by gap
    if now.min > 0:
        verdict = judge("x", saved, now, fb)
        assert verdict.dropped and "exceeds the spread" in verdict.why


def test_a_drop_within_either_runs_spread_is_not_evidence():
    saved = summarise([1.0, 1.0, 1.0, 1.0, 1.0])
    noisy = summarise([0.4, 0.6, 0.8, 1.0, 1.2])  # median 0.8 < 0.9, but its IQR (0.4) covers the drop (0.2)
    v = judge("pyav", saved, noisy, 0.9)
    assert not v.dropped and v.noise == pytest.approx(0.4) and "within the runs' spread" in v.why
    assert judge("pyav", saved, summarise([0.5, 0.5, 0.5, 0.5, 0.5]), 0.9).dropped
    assert not judge("pyav", saved, summarise([0.95] * 5), 0.9).dropped  # above the floor


@given(
    st.lists(st.tuples(rounds, st.floats(0.5, 2.0)), min_size=1, max_size=5),
    fail_below,
    st.floats(min_value=0.05, max_value=1.0),
)
def test_ours_regressed_only_when_every_reference_agrees(refs, fb, k):
    """A slower loader scales every ratio at once; the decision is the intersection of the per-reference ones."""
    saved = [summarise(xs) for xs, _ in refs]
    now = [summarise([x * k * jitter for x in xs]) for xs, jitter in refs]
    verdicts = tuple(judge(str(i), a, b, fb) for i, (a, b) in enumerate(zip(saved, now)))
    assert decide(verdicts) == all(v.dropped for v in verdicts)
    same = tuple(judge(str(i), a, a, fb) for i, a in enumerate(saved))
    assert not decide(same) and not decide(())
    if len(verdicts) > 1 and not verdicts[0].dropped:  # one reference that held vetoes the others
        assert not decide(verdicts)


def test_one_noisy_reference_alone_is_not_a_regression_but_a_slower_loader_is():
    steady = summarise([1.0, 1.02, 0.98, 1.01, 0.99])
    refs = {"raw": steady, "sha256": steady}
    one = tuple(
        judge(n, s, summarise([x * (0.5 if n == "raw" else 1.0) for x in (1.0, 1.02, 0.98, 1.01, 0.99)]), 0.9)
        for n, s in refs.items()
    )
    assert [v.dropped for v in one] == [True, False] and not decide(one)
    slower = tuple(
        judge(n, s, summarise([x * 0.7 for x in (1.0, 1.02, 0.98, 1.01, 0.99)]), 0.9) for n, s in refs.items()
    )
    assert decide(slower)


# -- comparability ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(baseline):
    """The session's saved report of three rounds (``tests/bench/conftest.py``), as the gate reads it."""
    from dsbuild.bench import load_report

    return load_report(baseline)


def check(saved, against=None, **changes):
    o = dataclasses.replace(saved.options, **changes.pop("options", {}))
    settings = {**o.settings(), **saved.resolved.to_json()}
    dataset = {**saved.dataset.to_json(), **changes.pop("dataset", {})}
    measured = changes.pop("measured", {b.name for b in saved.baselines if b.ratio})
    return (against or Against(saved, "base.json")).check(settings, dataset, measured, o.rounds)


def test_a_saved_report_is_comparable_with_its_own_settings(saved):
    assert saved.time.rounds_done >= MIN_ROUNDS
    assert check(saved) == ()


def test_different_settings_data_or_baselines_are_refused_naming_what_differs(saved):
    for changes, named in (
        ({"options": {"resize": (64, 64)}}, "setting resize"),
        ({"options": {"threads": 1}}, "setting threads"),
        ({"options": {"verify": "shard"}}, "setting verify"),
        ({"dataset": {"version_id": "0" * 64}}, "dataset version_id"),
        ({"dataset": {"split": "main/train"}}, "dataset split"),
        ({"measured": {"raw"}}, "baseline sha256: measured in the saved run only"),
    ):
        with pytest.raises(UsageError, match=named) as e:
            check(saved, **changes)
        assert "--allow-different" in e.value.hint


def test_allow_different_judges_anyway_and_records_the_differences(saved):
    diffs = check(saved, Against(saved, "base.json", allow_different=True), options={"resize": (64, 64)})
    assert diffs == ("setting resize: saved None, now [64, 64]",)
    gate = Against(saved, "base.json", allow_different=True).judge(saved, diffs)
    assert gate.differences == diffs and not gate.regressed and {v.baseline for v in gate.verdicts} == {"raw", "sha256"}


def test_the_gate_needs_enough_rounds_and_a_ratio(saved):
    with pytest.raises(UsageError, match="at least 3 rounds"):
        check(saved, options={"rounds": 2})
    few = dataclasses.replace(saved, time=dataclasses.replace(saved.time, rounds_done=2))
    with pytest.raises(UsageError, match="has 2 round"):
        check(few, Against(few, "base.json"))
    bare = dataclasses.replace(saved, baselines=())
    with pytest.raises(UsageError, match="no baseline"):
        check(bare, Against(bare, "base.json"))
    with pytest.raises(UsageError, match="--fail-below"):
        Against(saved, "base.json", fail_below=1.5)


def test_an_edited_baseline_is_refused_naming_what_does_not_hold(saved, tmp_path):
    """A saved report's medians and quartiles were trusted as written: quartiles out of order, negative
    ratios, every ratio x1000 (in order) or the rounds removed were all judged against."""
    import copy
    import json

    from dsbuild.bench import load_report
    from dsbuild.core.errors import FormatError

    doc = saved.to_json()
    first = next(i for i, b in enumerate(doc["baselines"]) if b["ratio"])

    def edited(change):
        d = copy.deepcopy(doc)
        change(d)
        path = tmp_path / "base.json"
        path.write_text(json.dumps(d))
        return path

    def scaled(d):
        d["baselines"][first]["ratio"] = {
            k: v if k == "rounds" else v * 1000 for k, v in d["baselines"][first]["ratio"].items()
        }

    for change, message in [
        (lambda d: d["ours"]["open_s"].update(q1=99.0), "open_s: min, q1, median, q3, max"),
        (lambda d: d["baselines"][first]["ratio"].update(min=-1.0), "ratio: min, q1"),
        (scaled, "is not what its rounds give"),
        (lambda d: d.update(rounds=[]), "is not what its rounds give"),
    ]:
        with pytest.raises(FormatError, match=message):
            load_report(edited(change))
    assert load_report(edited(lambda d: None)).to_json() == doc

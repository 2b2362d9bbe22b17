"""Dataset-level checks: coverage per title/condition/resolution/fps, duplicates, near-duplicates, action
balance, and split leakage (with the split rule's NFC groups) and coverage; severities decide whether a
miss rejects."""

from __future__ import annotations

import json
import shutil
import unicodedata

import numpy as np
import pyarrow as pa
import pytest

from dsbuild.core.errors import LineageError, UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.core.hashing import sha256_bytes
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.splitsets import SplitManifest, open_split_set, publish_split_set
from dsbuild.split import SplitOptions, make_split
from dsbuild.split.files import table_bytes
from dsbuild.validators import ValidateOptions, parse_spec, validate
from dsbuild.validators.base import Judge
from dsbuild.validators.checks.dataset import near_duplicate_pairs
from dsbuild.validators.facts import SampleFacts, Usage, VersionFacts
from dsbuild.validators.registry import BY_NAME
from dsbuild.validators.spec import default_spec
from tests.validators.support import build, rows, write_moving_session

TITLES = ("Kart Storm", "Sky Rally")
RELAXED = "[thresholds]\nmax_duplicate_fraction = 1\n"


@pytest.fixture(scope="module")
def dup(tmp_path_factory):
    """Six sessions (two titles, six players) plus a copy of the first under another session id."""
    root = tmp_path_factory.mktemp("dup")
    caps = root / "caps"
    for i in range(6):
        write_moving_session(caps, f"mv-{i}", TITLES[i % 2], f"p-{i}", seed=i)
    shutil.copytree(caps / "mv-0", caps / "zz-copy")
    doc = json.loads((caps / "zz-copy" / "session.json").read_text())
    (caps / "zz-copy" / "session.json").write_text(json.dumps({**doc, "session_id": "zz-copy", "player": "p-9"}))
    return build(caps, root / "cat", clip_seconds=1.0)


def run(cat, vid, text: str = "", **options):
    return validate(
        cat, vid, parse_spec(text, "spec.toml"), ValidateOptions(**options), executor=ExecutorSpec(workers=1)
    )


def test_a_capture_converted_twice_is_a_duplicate_named_by_its_later_keys(dup):
    cat, vid = dup
    report = run(cat, vid)
    d = report.check("duplicates")
    copies = sorted(r.key for r in rows(cat, vid) if r.session_id == "zz-copy")
    assert d.status == "fail" and [o.item for o in d.offenders] == copies
    assert d.offenders[0].detail == "duplicate of mv-0__000000 (same window of the same source video)"
    assert d.measured == round(len(copies) / len(rows(cat, vid)), 6)
    relaxed = run(cat, vid, RELAXED)
    assert relaxed.check("duplicates").status == "pass" and relaxed.accepted


def test_title_and_condition_coverage_follow_the_spec_and_carry_hours_per_value(dup):
    cat, vid = dup
    report = run(
        cat,
        vid,
        RELAXED + 'required_titles = ["Kart Storm", "Dungeon Drift"]\n'
        'min_hours_per_title = 0.002\nrequired_conditions = ["weather=snow"]\n',
    )
    titles = report.check("titles")
    assert titles.status == "fail" and titles.offenders[0].kind == "title"
    per = {row[0]: row[1:] for row in titles.table.rows}
    assert titles.table.columns == ("title", "samples", "hours")
    assert per["Kart Storm"][0] == 8 and abs(per["Sky Rally"][1] - 6 / 3600) < 1e-6
    assert [o.item for o in titles.offenders] == ["Dungeon Drift", "Sky Rally"]  # 6 s < 0.002 h = 7.2 s < 8 s
    bars = {b.label: b.value for b in titles.distribution.bars}
    assert bars["Dungeon Drift"] == 0 and titles.distribution.threshold == 0.002
    assert report.check("conditions").offenders[0].item == "weather=snow"


def test_a_title_of_exactly_the_minimum_hours_passes(dup):
    """Hours were rounded to 6 decimals before the comparison: a title of exactly the minimum failed it
    (8 s = 0.0022222 h was compared as 0.002222 h)."""
    cat, vid = dup
    exact = RELAXED + f"min_hours_per_title = {6 / 3600!r}\n"
    assert run(cat, vid, exact).check("titles").status == "pass"
    above = RELAXED + f"min_hours_per_title = {6.001 / 3600!r}\n"
    assert [o.item for o in run(cat, vid, above).check("titles").offenders] == ["Sky Rally"]


def test_sessions_convert_quarantined_are_reported_as_a_warning_naming_each(tmp_path):
    """A version missing a session passed the gate without a word in any report."""
    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.samples.synthetic import generate

    generate(tmp_path / "caps", sessions=3, seconds=1.0, seed=4, damage={0: "not_video"})
    r = convert(tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    (q,) = r.quarantined
    report = run(tmp_path / "cat", r.version_id)
    check = report.check("quarantine")
    assert report.accepted and check.status == "warn" and check.measured == 1
    assert [(o.item, o.kind) for o in check.offenders] == [
        (q.session, "session")
    ] and "not a readable video" in check.offenders[0].detail
    assert run(tmp_path / "cat", r.version_id, '[severity]\nquarantine = "fail"\n').accepted is False
    assert (
        run(tmp_path / "cat", r.version_id, "[thresholds]\nmax_quarantined_sessions = 1\n").check("quarantine").status
        == "pass"
    )


def test_allow_lists_for_resolution_and_frame_rate(dup):
    cat, vid = dup
    ok = run(cat, vid, RELAXED + 'allowed_resolutions = ["160x120"]\nallowed_fps = ["30"]\n')
    assert ok.check("resolutions").status == ok.check("frame_rates").status == "pass"
    bad = run(cat, vid, RELAXED + 'allowed_resolutions = ["1280x720"]\nallowed_fps = ["60"]\n')
    assert [o.item for o in bad.check("resolutions").offenders] == ["160x120"]
    assert [o.item for o in bad.check("frame_rates").offenders] == ["30"]


def test_warn_reports_without_rejecting_and_off_skips(dup):
    cat, vid = dup
    warn = run(cat, vid, '[thresholds]\nrequired_titles = ["Nope"]\n[severity]\ntitles = "warn"\nduplicates = "off"\n')
    assert warn.accepted and warn.check("titles").status == "warn"
    assert warn.check("duplicates").status == "skip" and "turned off" in warn.check("duplicates").message


def test_near_duplicate_search_finds_exactly_what_brute_force_finds():
    rng = np.random.default_rng(5)
    for max_bits in (0, 5, 12, 40):
        h = rng.integers(0, 2**63, size=(120, 4), dtype=np.uint64)
        for a, b, flips in ((3, 50, 0), (7, 8, max_bits), (20, 90, max_bits + 1), (60, 61, max_bits // 2)):
            h[b] = h[a]
            for bit in rng.choice(256, size=flips, replace=False):
                h[b, bit // 64] ^= np.uint64(1) << np.uint64(bit % 64)
        keys = [f"k{i:03d}" for i in range(len(h))]
        dist = np.bitwise_count(h[:, None, :] ^ h[None, :, :]).sum(axis=2)
        np.fill_diagonal(dist, 999)
        want = {keys[i]: int(dist[i].min()) for i in range(len(h)) if dist[i].min() <= max_bits}
        got = near_duplicate_pairs(keys, h, max_bits)
        assert {k: d for k, (d, _) in got.items()} == want
        assert all(dist[keys.index(k), keys.index(o)] == d for k, (d, o) in got.items())


def _balance(samples, spec=None):
    facts = VersionFacts("v" * 64, "structural", manifest=None, rows=[], samples=samples)
    check = BY_NAME["action_balance"]
    return check.run(Judge(check, spec or default_spec()), facts)


def test_action_balance_names_unused_controls_and_measures_imbalance():
    samples = [
        SampleFacts("a", (), Usage(("a", "b", "c"), (50, 1, 0), 100)),
        SampleFacts("b", (), Usage(("a", "b"), (50, 0), 100)),
    ]
    r = _balance(samples)
    assert r.status == "warn" and [o.item for o in r.offenders] == ["c"] and r.offenders[0].kind == "control"
    assert {b.label: b.value for b in r.distribution.bars} == {"a": 0.5, "b": 0.005, "c": 0.0}
    assert "imbalance unbounded" in r.message  # c never active: the ratio has no bound
    relaxed = parse_spec("[thresholds]\nmin_action_usage = 0\nmax_action_imbalance = 50\n", "s")
    r = _balance(samples[1:], relaxed)
    assert r.status == "warn" and not r.offenders  # b never active: min usage 0 passes, the ratio does not


def _regroup(cat, vid, name: str, moves: dict[str, str]) -> None:
    """Move samples (key -> split) inside a stored split set: hand-edited files, re-sealed manifest."""
    catalog = Catalog.open(cat)
    s = open_split_set(catalog, vid, name)
    tables = {sp: s.table(sp) for sp in s.splits}
    rows_by_key = {k: (sp, t.slice(i, 1)) for sp, t in tables.items() for i, k in enumerate(t["key"].to_pylist())}
    for key, dst in moves.items():
        src, row = rows_by_key[key]
        keep = pa.array([k != key for k in tables[src]["key"].to_pylist()])
        tables[src] = tables[src].filter(keep)
        row = row.set_column(row.schema.get_field_index("split"), "split", pa.array([dst], pa.string()))
        tables[dst] = pa.concat_tables([tables[dst], row.cast(tables[dst].schema)])
    doc = {k: v for k, v in s.manifest.to_json().items() if k != "hash"}
    files = {}
    for sp in s.splits:
        files[f"{sp}.parquet"] = data = table_bytes(tables[sp])
        doc["splits"][sp].update(sha256=sha256_bytes(data), bytes=len(data))
    publish_split_set(
        catalog, vid, name, files, SplitManifest.from_json({**doc, "hash": ""}, "edited").sealed(), force=True
    )


def test_a_leaking_split_fails_naming_the_samples_and_a_clean_one_passes(dup, tmp_path):
    cat = shutil.copytree(dup[0], tmp_path / "cat")
    vid = dup[1]
    make_split(cat, vid, "main", SplitOptions(ratios="train=0.5,val=0.5"))
    clean = run(cat, vid, RELAXED, split="main")
    assert clean.check("split_leakage").status == "pass" and clean.check("split_leakage").measured == 0
    moved = open_split_set(Catalog.open(cat), vid, "main").table("train")["key"][0].as_py()
    _regroup(cat, vid, "main", {moved: "val"})
    report = run(cat, vid, RELAXED, split="main")
    leak = report.check("split_leakage")
    assert leak.status == "fail" and leak.measured == 1 and not report.accepted
    assert moved in [o.item for o in leak.offenders] and all("is in train, val" in o.detail for o in leak.offenders)
    assert leak.table.columns == ("player", "splits") and leak.table.rows[0][1] == "train, val"


def test_the_same_player_in_nfc_and_nfd_is_one_group_for_leakage(tmp_path):
    caps = tmp_path / "caps"
    composed = unicodedata.normalize("NFC", "José")
    write_moving_session(caps, "a-nfc", "Kart Storm", composed, seed=1)
    write_moving_session(caps, "b-nfd", "Kart Storm", unicodedata.normalize("NFD", composed), seed=2)
    write_moving_session(caps, "c-other", "Kart Storm", "p-2", seed=3)
    cat, vid = build(caps, tmp_path / "cat", clip_seconds=1.0)
    make_split(cat, vid, "main", SplitOptions(ratios="train=0.5,val=0.5"))
    s = open_split_set(Catalog.open(cat), vid, "main")
    where = {k: sp for sp in s.splits for k in s.table(sp)["key"].to_pylist()}
    nfd_keys = [k for k in where if k.startswith("b-nfd")]
    other = "val" if where[nfd_keys[0]] == "train" else "train"
    _regroup(cat, vid, "main", dict.fromkeys(nfd_keys, other))  # as a rule without NFC would have split them
    leak = run(cat, vid, split="main").check("split_leakage")
    assert leak.status == "fail" and leak.measured == 1
    assert {o.item for o in leak.offenders} == {k for k in where if k.startswith(("a-nfc", "b-nfd"))}
    assert leak.table.rows == [[composed, "train, val"]]


def test_coverage_compares_titles_in_nfc_as_the_split_rule_does(tmp_path):
    """A title typed composed in some sessions and decomposed in others is one title to `split --stratify`;
    the coverage check compared the raw strings, counted two titles and rejected the version ("missing
    from split val") when one form was all in train and the other all in val."""
    caps = tmp_path / "caps"
    composed = unicodedata.normalize("NFC", "Café Kart")
    for i, (sid, title) in enumerate(
        [
            ("a-nfc", composed),
            ("b-nfc", composed),
            ("c-nfd", unicodedata.normalize("NFD", composed)),
            ("d-nfd", unicodedata.normalize("NFD", composed)),
        ]
    ):
        write_moving_session(caps, sid, title, f"p-{i}", seed=i)
    cat, vid = build(caps, tmp_path / "cat", clip_seconds=1.0)
    make_split(cat, vid, "main", SplitOptions(ratios="train=0.5,val=0.5"))
    s = open_split_set(Catalog.open(cat), vid, "main")
    where = {k: sp for sp in s.splits for k in s.table(sp)["key"].to_pylist()}
    moves = {k: "train" if "-nfc__" in k else "val" for k in where}  # each form wholly in one split
    _regroup(cat, vid, "main", {k: sp for k, sp in moves.items() if where[k] != sp})
    report = run(cat, vid, RELAXED, split="main")
    cov = report.check("split_coverage")
    assert report.check("split_leakage").status == "pass"
    assert cov.measured == 0 and [r[0] for r in cov.table.rows] == [composed]


def test_split_by_title_leaves_titles_uncovered_and_the_table_shows_split_by_title(dup, tmp_path):
    cat = shutil.copytree(dup[0], tmp_path / "cat")
    make_split(cat, dup[1], "bytitle", SplitOptions(by="title", ratios="train=0.5,val=0.5"))
    report = run(cat, dup[1], RELAXED, split="bytitle")
    cov = report.check("split_coverage")
    assert report.check("split_leakage").status == "pass"
    assert cov.status == "fail" and cov.measured == 2 and all("missing from split" in o.detail for o in cov.offenders)
    assert cov.table.columns == ("title", "train samples", "val samples", "train hours", "val hours")
    assert sorted(r[0] for r in cov.table.rows) == sorted(TITLES)
    assert all((r[1] == 0) != (r[2] == 0) for r in cov.table.rows)  # each title in exactly one split
    # over three splits each title is missing from two: the threshold counts titles (it counted the pairs)
    make_split(cat, dup[1], "bytitle3", SplitOptions(by="title", ratios="train=0.4,val=0.3,test=0.3"))
    cov3 = run(cat, dup[1], RELAXED, split="bytitle3").check("split_coverage")
    assert cov3.measured == len(TITLES) and len(cov3.offenders) > len(TITLES)


def test_a_missing_split_set_is_a_usage_error_and_a_damaged_one_a_lineage_error(dup, tmp_path):
    cat = shutil.copytree(dup[0], tmp_path / "cat")
    vid = dup[1]
    with pytest.raises(UsageError, match="has no split set 'nosuch'"):
        run(cat, vid, split="nosuch")
    make_split(cat, vid, "main", SplitOptions(ratios="train=0.5,val=0.5"))
    s = open_split_set(Catalog.open(cat), vid, "main")
    (cat / s.folder / "train.parquet").write_bytes(b"PAR1 damaged")
    with pytest.raises(LineageError, match="train.parquet: does not match the sha256"):
        run(cat, vid, split="main")

"""Dataset-level checks: coverage per title/condition/resolution/fps, duplicates, near-duplicates,
action balance, and split leakage and coverage; severities decide whether a miss rejects."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest

from dsbuild.lineage.catalog import Catalog
from dsbuild.core.hashing import sha256_bytes
from dsbuild.split import SplitOptions, make_split, open_split
from dsbuild.split.files import publish, seal, table_bytes
from dsbuild.validators import ValidateOptions, parse_spec, validate
from dsbuild.validators.checks.dataset import action_balance_check, near_duplicate_pairs
from dsbuild.validators.spec import default_spec
from tests.helpers import index_rows
from tests.test_validate_support import build, write_moving_session

TITLES = ("Kart Storm", "Sky Rally")


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
    return validate(cat, vid, parse_spec(text, "spec.toml"), ValidateOptions(workers=1, **options))


def test_a_capture_converted_twice_is_a_duplicate_named_by_its_later_keys(dup):
    cat, vid = dup
    report = run(cat, vid)
    d = report.check("duplicates")
    copies = sorted(r["key"] for r in index_rows(cat, vid) if r["session_id"] == "zz-copy")
    assert d.status == "fail" and [o.item for o in d.offenders] == copies
    assert "duplicate of mv-0__000000 (same window of the same source video)" == d.offenders[0].detail
    assert d.measured == round(len(copies) / len(index_rows(cat, vid)), 6)
    relaxed = run(cat, vid, "[thresholds]\nmax_duplicate_fraction = 0.5\n")
    assert relaxed.check("duplicates").status == "pass" and relaxed.accepted


def test_title_and_condition_coverage_follow_the_spec(dup):
    cat, vid = dup
    report = run(cat, vid, '[thresholds]\nmax_duplicate_fraction = 1\n'
                           'required_titles = ["Kart Storm", "Dungeon Drift"]\n'
                           'min_hours_per_title = 0.002\nrequired_conditions = ["weather=snow"]\n')
    titles = report.check("titles")
    assert titles.status == "fail" and titles.offenders[0].kind == "title"
    per = titles.details["per_value"]
    assert per["Kart Storm"]["samples"] == 8 and abs(per["Sky Rally"]["hours"] - 6 / 3600) < 1e-6
    assert [o.item for o in titles.offenders] == ["Dungeon Drift", "Sky Rally"]  # 6 s < 0.002 h = 7.2 s < 8 s
    assert report.check("conditions").offenders[0].item == "weather=snow"


def test_allow_lists_for_resolution_and_frame_rate(dup):
    cat, vid = dup
    ok = run(cat, vid, '[thresholds]\nallowed_resolutions = ["160x120"]\nallowed_fps = ["30"]\n')
    assert ok.check("resolutions").status == ok.check("frame_rates").status == "pass"
    bad = run(cat, vid, '[thresholds]\nallowed_resolutions = ["1280x720"]\nallowed_fps = ["60"]\n')
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


def test_action_balance_names_unused_controls_and_measures_imbalance():
    facts = [{"usage": {"controls": ["a", "b", "c"], "active": [50, 1, 0], "frames": 100}},
             {"usage": {"controls": ["a", "b"], "active": [50, 0], "frames": 100}}]
    r = action_balance_check(default_spec(), facts)
    assert r.status == "warn" and [o.item for o in r.offenders] == ["c"] and r.offenders[0].kind == "control"
    assert r.details["usage"] == {"a": 0.5, "b": 0.005, "c": 0.0} and r.details["imbalance"] is None
    spec = parse_spec("[thresholds]\nmin_action_usage = 0\nmax_action_imbalance = 50\n", "s")
    r = action_balance_check(spec, facts[1:])
    assert r.status == "warn" and r.details["imbalance"] is None  # b never active: ratio unbounded, min usage 0


def _leak(cat, vid, name: str) -> str:
    """Move one sample of a training group into val (hand-edited split files, re-sealed manifest)."""
    s = open_split(cat, vid, name)
    train, val = s.table("train"), s.table("val")
    moved = train.slice(0, 1)
    moved = moved.set_column(moved.schema.get_field_index("split"), "split", pa.array(["val"], pa.string()))
    new = {"train": train.slice(1), "val": pa.concat_tables([val, moved.cast(val.schema)])}
    doc = {k: v for k, v in json.loads(json.dumps(s.manifest)).items() if k != "hash"}
    files = {}
    for split in s.splits:
        data = table_bytes(new[split]) if split in new else s.file_bytes(split)
        files[f"{split}.parquet"] = data
        doc["splits"][split].update(sha256=sha256_bytes(data), bytes=len(data))
    publish(Catalog.open(cat), vid, name, files, seal(doc), force=True)
    return moved["key"][0].as_py()


def test_a_leaking_split_fails_naming_the_samples_and_a_clean_one_passes(dup, tmp_path):
    cat = tmp_path / "cat"
    shutil.copytree(dup[0], cat)
    vid = dup[1]
    make_split(cat, vid, "main", SplitOptions(ratios="train=0.5,val=0.5"))
    clean = run(cat, vid, "[thresholds]\nmax_duplicate_fraction = 1\n", split="main")
    assert clean.check("split_leakage").status == "pass" and clean.check("split_leakage").measured == 0
    moved = _leak(cat, vid, "main")
    report = run(cat, vid, "[thresholds]\nmax_duplicate_fraction = 1\n", split="main")
    leak = report.check("split_leakage")
    assert leak.status == "fail" and leak.measured == 1 and not report.accepted
    assert moved in [o.item for o in leak.offenders]
    assert all("is in train, val" in o.detail for o in leak.offenders)


def test_split_by_title_leaves_titles_uncovered(dup, tmp_path):
    cat = tmp_path / "cat"
    shutil.copytree(dup[0], cat)
    make_split(cat, dup[1], "bytitle", SplitOptions(by="title", ratios="train=0.5,val=0.5"))
    report = run(cat, dup[1], "[thresholds]\nmax_duplicate_fraction = 1\n", split="bytitle")
    cov = report.check("split_coverage")
    assert report.check("split_leakage").status == "pass"
    assert cov.status == "fail" and cov.measured == 2 and all("missing from split" in o.detail for o in cov.offenders)

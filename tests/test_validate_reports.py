"""The CLI gate and its reports: exit codes, the rich table, JSON, JUnit XML and the self-contained HTML
page (rendered in headless Chromium)."""

from __future__ import annotations

import io
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from dsbuild.validators.png import png_rgb
from dsbuild.validators.spec import CHECKS
from tests.helpers import index_rows
from tests.test_validate_support import cli, copy_catalog, reseal

EXAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "acceptance.toml"
CHROMIUM = Path("/usr/bin/chromium")
NAMES = [c.name for c in CHECKS]


@pytest.fixture(scope="module")
def damaged(wds_catalog, tmp_path_factory):
    """A consistent version with one undecodable clip and one sample whose metadata disagrees with the
    index, validated once through the CLI with every report requested."""
    out = tmp_path_factory.mktemp("reports")
    cat = copy_catalog(wds_catalog[0], out / "cat")
    keys = [r["key"] for r in index_rows(cat, wds_catalog[1])]

    def edit(key, members):
        if key == keys[0]:
            return [(n, b"\0" * len(p) if n.endswith(".mp4") else p) for n, p in members]
        if key == keys[1]:
            return [(n, p.replace(b'"frames":', b'"frames":1') if n.endswith(".json") else p) for n, p in members]
        return members

    vid = reseal(cat, wds_catalog[1], edit)
    paths = {"junit": out / "junit.xml", "html": out / "report.html"}
    r = cli("validate", f"{cat}@{vid[:10]}", "--level", "full", "--workers", "1", "--json",
            "--junit", paths["junit"], "--html", paths["html"])
    return r, paths, keys


def test_damaged_version_is_rejected_with_exit_1_and_a_json_report(damaged):
    r, _, keys = damaged
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "rejected" and not doc["accepted"] and doc["level"] == "full"
    assert [c["name"] for c in doc["checks"]] == NAMES
    for c in doc["checks"]:
        assert {"status", "measured", "threshold", "offenders", "offender_count", "message"} <= set(c)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["decode"]["status"] == "fail" and by["decode"]["offenders"][0]["item"] == keys[0]
    assert by["index"]["status"] == "fail" and by["index"]["offenders"][0]["item"] == keys[1]
    assert by["decode"]["threshold"] == {"max_decode_failures": 0} and by["decode"]["measured"] == 1
    assert doc["spec_source"] == "defaults" and doc["spec"]["thresholds"]["max_decode_failures"] == 0


def test_junit_has_one_testcase_per_check_and_failures_with_messages(damaged):
    _, paths, keys = damaged
    root = ET.parse(paths["junit"]).getroot()
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == NAMES
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert {"decode", "index"} <= set(failed) and keys[0] in failed["decode"].text
    assert int(root.get("failures")) == len(failed) and int(root.get("tests")) == len(NAMES)
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert skipped == ["split_leakage", "split_coverage"]


def test_html_is_self_contained(damaged):
    _, paths, _ = damaged
    page = paths["html"].read_text()
    for forbidden in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert forbidden not in page
    assert page.count("<svg") >= 6 and "data:image/png;base64," in page


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (Debian: apt-get install chromium)")
def test_html_renders_in_headless_chromium_with_every_check(damaged, tmp_path):
    _, paths, keys = damaged
    r = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                        paths["html"].resolve().as_uri()], capture_output=True, text=True, timeout=120)
    dom = r.stdout
    assert r.returncode == 0 and "<table" in dom, r.stderr[-2000:]
    for name in NAMES:
        assert f'id="check-{name}"' in dom and f"<b>{name}</b>" in dom
    assert 'id="verdict">REJECTED' in dom and keys[0] in dom and "data:image/png;base64," in dom


def test_clean_version_is_accepted_and_the_table_names_every_check(wds_catalog):
    cat, vid = wds_catalog
    r = cli("validate", f"{cat}@{vid}", "--acceptance", EXAMPLE, "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "ACCEPTED" in r.stderr and "built-in defaults" not in r.stderr
    for name in NAMES:
        assert name in r.stderr


def test_usage_and_input_errors_exit_2_with_one_line(wds_catalog, tmp_path):
    cat, vid = wds_catalog
    bad = tmp_path / "bad.toml"
    bad.write_text("[thresholds]\nmax_decode_failures = 0\nmax_frozen_fraction = = 1\n")
    typo = tmp_path / "typo.toml"
    typo.write_text("[thresholds]\nmax_decod_failures = 0\n")
    cases = [(["validate", f"{cat}@{vid}", "--acceptance", tmp_path / "missing.toml"], "acceptance spec not found"),
             (["validate", f"{cat}@{vid}", "--acceptance", bad], "line 3"),
             (["validate", f"{cat}@{vid}", "--acceptance", typo],
              "typo.toml:2: unknown threshold 'max_decod_failures'"),
             (["validate", tmp_path / "nowhere"], "not a dsbuild catalog"),
             (["validate", f"{cat}@{vid}", "--level", "deep"], "--level 'deep'"),
             (["validate", f"{cat}@{vid}", "--split", "nosuch"], "no split set 'nosuch'")]
    for args, message in cases:
        r = cli(*args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_png_encoder_output_decodes_to_the_same_pixels():
    import av

    img = np.random.default_rng(1).integers(0, 255, (7, 11, 3), dtype=np.uint8)
    with av.open(io.BytesIO(png_rgb(img)), format="png_pipe") as c:
        frame = next(c.decode(video=0))
    assert np.array_equal(frame.to_ndarray(format="rgb24"), img)


def test_the_ci_doc_runs_the_gate_and_uploads_reports():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "ci-gate.md").read_text()
    for needle in ("pull_request", "dsbuild validate", "--junit", "--html", "--json", "upload-artifact"):
        assert needle in doc

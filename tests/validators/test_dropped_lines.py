"""`validate`'s dropped_lines check, through the real executable: a version whose actions convert mostly
dropped (values out of range: a logger writing another scale) is rejected, exit 1, with the counts in
every report; its threshold (max_dropped_fraction, default 0.01) lets a project accept more."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dsbuild.samples.synthetic import generate
from tests.cli.clitools import run


@pytest.fixture(scope="module")
def dropped(tmp_path_factory) -> tuple[Path, str]:
    """(catalog, id of the session whose actions were logged on a 0..255 scale: all but the zeros dropped)."""
    root = tmp_path_factory.mktemp("dropped")
    paths = generate(root / "caps", sessions=2, seconds=2, seed=9)
    actions = paths[1] / "actions.jsonl"
    lines = [json.loads(x) for x in actions.read_text().splitlines()]
    actions.write_text("".join(json.dumps({**e, "value": e["value"] * 255}) + "\n" for e in lines))
    run("convert", root / "caps", root / "cat", "--clip-seconds", 2, "--workers", 1, "--quiet")
    return root / "cat", json.loads((paths[1] / "session.json").read_text())["session_id"]


def test_a_version_built_from_mostly_dropped_actions_is_rejected_with_the_counts_in_every_report(dropped, tmp_path):
    cat, sid = dropped
    p = run(
        "validate",
        cat,
        "--save",
        tmp_path / "r.json",
        "--junit",
        tmp_path / "r.xml",
        "--html",
        tmp_path / "r.html",
        check=1,
    )
    assert "rejected: 1 check(s) failed (dropped_lines)" in p.stderr, p.stderr
    [row] = [line for line in p.stdout.splitlines() if line.startswith("dropped_lines\t")]
    assert "\tFAIL\tlines dropped by convert: actions " in row and f"{sid}/actions: " in row, row
    check = next(c for c in json.loads((tmp_path / "r.json").read_text())["checks"] if c["name"] == "dropped_lines")
    assert (
        check["status"] == "fail" and check["measured"] > 0.5 and check["threshold"] == {"max_dropped_fraction": 0.01}
    )
    [offender] = check["offenders"]
    assert (
        offender["item"] == f"{sid}/actions"
        and "lines; first: line 2: 'value' must be a finite number in [-1, 1]" in offender["detail"]
    )
    _, lines, dropped_lines, fraction = next(r for r in check["table"]["rows"] if r[0] == "actions")
    assert 0 < dropped_lines < lines and fraction == round(dropped_lines / lines, 6)
    assert f"actions {dropped_lines} of {lines}" in check["message"]
    case = next(c for c in ET.parse(tmp_path / "r.xml").iter("testcase") if c.get("name") == "dropped_lines")
    assert f"actions {dropped_lines} of {lines}" in case.find("failure").get("message")
    html = (tmp_path / "r.html").read_text()
    assert "dropped_lines" in html and f"actions {dropped_lines} of {lines}" in html


def test_a_project_that_accepts_the_loss_raises_max_dropped_fraction(dropped, tmp_path):
    cat, _ = dropped
    (tmp_path / "spec.toml").write_text("[thresholds]\nmax_dropped_fraction = 1.0\n")
    report = json.loads(run("validate", cat, "--acceptance", tmp_path / "spec.toml", "--json").stdout)
    check = next(c for c in report["checks"] if c["name"] == "dropped_lines")
    assert check["status"] == "pass" and check["offenders"] == [] and "actions" in check["message"]


def test_a_clean_version_passes_with_nothing_dropped(wds_catalog):
    cat, _ = wds_catalog
    report = json.loads(run("validate", cat, "--json").stdout)
    check = next(c for c in report["checks"] if c["name"] == "dropped_lines")
    assert check["status"] == "pass" and check["measured"] == 0.0
    assert check["message"].startswith("lines dropped by convert: actions 0 of ")

"""The reports of a rejected version whose captures carry hostile text: JSON, JUnit XML, the terminal table
(capture text is data, never markup) and the self-contained HTML page (rendered in headless Chromium)."""

from __future__ import annotations

import io
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from dsbuild.core.errors import CheckFailed
from dsbuild.core.executor import ExecutorSpec
from dsbuild.split import SplitOptions, make_split
from dsbuild.validators import (
    ValidateOptions,
    parse_spec,
    render_html,
    report_table,
    to_json,
    to_junit,
    validate,
    verdict_line,
    write_html,
)
from dsbuild.validators.images import jpeg, strip
from dsbuild.validators.registry import CHECKS
from tests.validators.support import build, canonical_meta, reseal, rows, write_moving_session

CHROMIUM = Path("/usr/bin/chromium")
NAMES = [c.name for c in CHECKS]
TITLE = "[bold red]x <script>alert(1)</script>"
HOSTILE = (TITLE, "[/]", "[link=file:///etc]")
SPEC = (
    '[thresholds]\nrequired_conditions = ["weather=rain"]\nmin_hours_per_title = 1.0\n'
    'min_hours_per_condition = 1.0\n[severity]\nconditions = "warn"\n'
)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A version whose titles, player and conditions look like markup and HTML, with one undecodable clip
    and one sample whose metadata disagrees with the index, validated at level full with a split set."""
    root = tmp_path_factory.mktemp("hostile")
    caps = root / "caps"
    write_moving_session(caps, "s-a", TITLE, "[link=file:///etc]", seed=1, conditions={"note": "[link=file:///etc]"})
    write_moving_session(caps, "s-b", "[/]", "p-2", seed=2, conditions={"note": "[/]"})
    write_moving_session(caps, "s-c", "Kart Storm", "p-3", seed=3)
    cat, vid = build(caps, root / "cat", clip_seconds=1.0)
    keys = [r.key for r in rows(cat, vid)]

    def edit(key, members):
        if key == keys[0]:
            return [(e, b"\0" * len(p) if e == "mp4" else p) for e, p in members]
        if key == keys[1]:
            return canonical_meta(members, lambda doc: doc["clip"].update(t_end=doc["clip"]["t_end"] + 1))
        return members

    vid = reseal(cat, vid, edit)
    make_split(cat, vid, "main", SplitOptions(by="player", ratios="train=0.5,val=0.5"))
    calls = []
    report = validate(
        cat,
        vid,
        parse_spec(SPEC, "spec.toml"),
        ValidateOptions(level="full", split="main"),
        executor=ExecutorSpec(workers=1),
        progress=lambda *a: calls.append(a),
    )
    return cat, report, keys, calls


def test_a_rejected_version_says_why_in_its_json(hostile):
    _, report, keys, _ = hostile
    doc = json.loads(to_json(report))
    assert doc["format"] == "dsbuild.validate/2" and doc["verdict"] == "rejected" and not doc["accepted"]
    assert [c["name"] for c in doc["checks"]] == NAMES
    by = {c["name"]: c for c in doc["checks"]}
    assert by["decode"]["status"] == "fail" and by["decode"]["offenders"][0]["item"] == keys[0]
    assert by["decode"]["threshold"] == {"max_decode_failures": 0} and by["decode"]["measured"] == 1
    assert by["index"]["offenders"][0]["item"] == keys[1]
    assert by["conditions"]["status"] == "warn" and by["split_coverage"]["table"]["columns"][0] == "title"
    assert doc["spec_source"] == "spec.toml" and doc["spec"]["thresholds"]["required_conditions"] == ["weather=rain"]
    assert doc["counts"]["fail"] == sum(c["status"] == "fail" for c in doc["checks"])
    assert doc["summary"]["decoded_frames"] > 0 and doc["summary"]["durations"]["values"]


def test_the_gate_raises_check_failed_naming_the_failed_checks(hostile, wds_catalog):
    _, report, _, _ = hostile
    with pytest.raises(CheckFailed, match=r"rejected: \d+ check\(s\) failed \(.*decode.*\)"):
        report.raise_if_rejected()
    line = verdict_line(report)
    assert line.startswith(f"REJECTED {report.version_id[:12]}") and "decode" in line and "\n" not in line
    accepted = validate(*wds_catalog, executor=ExecutorSpec(workers=1))
    accepted.raise_if_rejected()
    assert verdict_line(accepted).startswith("ACCEPTED")


def test_progress_reports_hashing_and_samples_each_up_to_its_total(hostile):
    _, report, _, calls = hostile  # the two stages run at once on a local catalog: each counts up on its own
    for stage, total in (("shards", report.summary.shards), ("samples", report.summary.samples)):
        done = [d for d, t, s in calls if s == stage]
        assert done == sorted(done) and done[-1] == total and {t for d, t, s in calls if s == stage} == {total}


def test_junit_has_one_testcase_per_check_and_failures_with_messages(hostile):
    _, report, keys, _ = hostile
    root = ET.fromstring(to_junit(report))
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == NAMES
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert {"decode", "index"} <= set(failed) and keys[0] in failed["decode"].text
    assert int(root.get("failures")) == len(failed) == report.counts()["fail"]
    warned = next(c for c in cases if c.get("name") == "conditions")
    assert warned.find("system-out").text.startswith("WARNING")


def test_the_terminal_table_prints_capture_text_literally(hostile):
    from rich.console import Console

    _, report, _, _ = hostile
    out = io.StringIO()
    console = Console(file=out, width=80, record=True, color_system=None)
    console.print(report_table(report))  # markup in the data would raise MarkupError or vanish
    text = out.getvalue()
    for s in ("[bold red]x", "[/]", "note=[link=file:///etc]", "required_conditions = [weather=rain]"):
        assert s in text.replace("\n│", ""), s
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_terminal_table_escapes_control_sequences_from_the_catalog(hostile):
    """A quarantine reason (or any catalog text in a check's message, item or detail) carrying ANSI or OSC
    sequences (clear the screen, write the clipboard) or a bidi override reached the terminal raw."""
    import dataclasses

    from rich.console import Console

    from dsbuild.validators.model import Offender

    _, report, _, _ = hostile
    evil = "a\x1b[2Jb\x1b]52;c;ZXZpbA==\x07c\u202ed"
    check = dataclasses.replace(
        report.checks[0], status="fail", message=evil, offenders=(Offender(evil, evil, "sample"),), offender_count=1
    )
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=True, color_system=None).print(
        report_table(dataclasses.replace(report, checks=(check, *report.checks[1:])))
    )
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\x1b]52" not in text and "\u202e" not in text
    assert "a\\x1b[2Jb" in text  # shown escaped, as every other command shows catalog text


def test_html_is_self_contained_escaped_and_explains_every_failing_check(hostile):
    _cat, report, keys, _ = hostile
    page = render_html(report, {keys[0]: None, keys[1]: jpeg(np.zeros((4, 8, 3), np.uint8))})
    for forbidden in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert forbidden not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "[link=file:///etc]" in page
    for c in report.checks:
        assert (f'id="visual-{c.name}"' in page) == (c.status in ("fail", "warn"))
    visual = page.split('id="visual-conditions"')[1].split("</section>")[0]
    assert "stroke-dasharray" in visual and "min_hours_per_condition = 1 h" in visual  # threshold marked, legend
    decode = page.split('id="visual-decode"')[1].split("</section>")[0]
    assert "no frame decodes" in decode and keys[0] in decode
    index = page.split('id="visual-index"')[1].split("</section>")[0]
    assert "data:image/jpeg;base64," in index and keys[1] in index
    assert "Split main: samples and hours per split and title" in page and "train samples" in page


@pytest.fixture(scope="module")
def page(hostile, tmp_path_factory):
    _cat, report, _, _ = hostile
    return write_html(report, tmp_path_factory.mktemp("html") / "report.html", catalog=None)


def test_written_html_carries_thumbnail_strips_decoded_from_the_catalog(page, hostile):
    _, _report, _keys, _ = hostile
    html = page.read_text()
    index = html.split('id="visual-index"')[1].split("</section>")[0]
    assert "data:image/jpeg;base64," in index and "four frames spread" in index
    assert "no frame decodes" in html.split('id="visual-decode"')[1].split("</section>")[0]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (make test installs it)")
def test_html_renders_in_headless_chromium_and_the_screenshot_is_not_blank(page, tmp_path):
    import av

    shot = tmp_path / "shot.png"
    r = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,1600",
            f"--screenshot={shot}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    with av.open(str(shot)) as c:
        img = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert img.shape[:2] == (1600, 1200)
    ink = (img.astype(int).sum(axis=2) < 600).mean()  # share of pixels that are not near-white
    colours = len(np.unique(img.reshape(-1, 3)[::97], axis=0))
    assert ink > 0.02 and colours > 20, (ink, colours)


def test_thumbnails_are_jpegs_that_decode_back_and_an_undecodable_clip_has_none():
    import av

    img = np.zeros((7, 11, 3), np.uint8)
    img[:, 5:] = 200
    with av.open(io.BytesIO(jpeg(img)), format="mjpeg") as c:
        frame = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert (
        frame.shape == (8, 12, 3) and abs(int(frame[3, 1].mean()) - 0) < 12 and abs(int(frame[3, 9].mean()) - 200) < 12
    )
    assert strip(b"not a video", 10) is None


def test_a_report_reads_back_from_its_record_json():
    """``Report.check(name)`` (find a check's result) once overrode the hook every record runs after it is
    read from JSON, so reading a report back raised KeyError: the hook is now ``check_fields``."""
    from dsbuild.core.records import Record
    from dsbuild.validators.model import CheckResult, Report, Summary, per_sample

    decode = CheckResult("decode", "content", "pass", "0 sample(s)", "fail", measured=0)
    summary = Summary(1, 1, 10, 0.1, "webdataset", 0, 0, {"total": 1.0}, per_sample("clip seconds", [1.0]))
    report = Report("cat", "v" * 64, "structural", None, "defaults", {"thresholds": {}}, (decode,), summary)
    assert Report.from_json(Record.to_json(report), "report") == report

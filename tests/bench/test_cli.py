"""`dsbuild bench` as a user and a CI job run it: the real executable in a subprocess. --json/--save/--html,
the gate's exit codes (0 pass, 1 regression, 2 incomparable), progress naming the round and the baseline,
Ctrl-C keeping the finished rounds (exit 130), and the HTML page rendered in headless Chromium.

Load-proof: a real run on a busy machine may finish fewer rounds than it asked for (the budget is wall
time), so runs through the executable assert only what holds whatever the load. The gate's decisions, which
need three rounds in both runs, are checked on runs made in-process with a stepping clock: the budget then
grants every round asked for, while each measurement inside its slice still runs on real time.

Cheap: a run starts a loader process per round (seconds of CPU each), so the module measures the gated
settings twice (the session's ``baseline`` and ``now``) and judges ``now`` against each doctored baseline;
refusals are checked where they happen, before anything is measured; the executable's runs take the fewest
rounds and seconds that what they check needs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from dsbuild.bench import Against, BenchReport, enforce, load_report, run_bench
from dsbuild.bench.measure import Measured
from dsbuild.bench.options import parse_compare, parse_resize
from dsbuild.bench.stats import paired_ratios, summarise
from dsbuild.core.errors import CheckFailed, UsageError
from tests.bench.conftest import BYTES, DEVICE, measured, options
from tests.cli.clitools import argv, env, run
from tests.helpers import alive, children

CHROMIUM = Path("/usr/bin/chromium")


def gated(duration: str = "3", rounds: str = "3") -> list[str]:
    """The gated settings (``BYTES``) as flags of the executable."""
    return [
        "--decode", "bytes", "--batch-size", "2", "--step-ms", "0", "--device", DEVICE,
        "--duration", duration, "--rounds", rounds, "--compare", "raw,sha256",
    ]  # fmt: skip


GATED = gated()


class Started(Exception):
    """Raised by ``stop_at_start``."""


def stop_at_start(event) -> None:
    """A progress callback that ends a run where it starts its loader processes: past the comparability
    check against its baseline (made first, see ``run_bench``), before anything is measured."""
    if event.what.startswith("starting "):
        raise Started(event.what)


def passes_the_check(cat: Path, against: Against, **kw) -> None:
    """``run_bench`` with the gated settings (and ``kw``) finds nothing that differs from ``against``: it
    gets to start-up instead of refusing (``UsageError``), and is ended there."""
    with pytest.raises(Started):
        run_bench(options(cat, **{**BYTES, **kw}), progress=stop_at_start, against=against)


@pytest.fixture(scope="module")
def now(bench_catalog, baseline) -> BenchReport:
    """A second run of the gated settings, judged against the session's ``baseline``. Two short runs in the
    suite, beside the other test process's bursts, have differed by up to 2.8x (ours/sha256 0.552, then
    0.198), so this gate is at 0.25: a 4x drop still fails."""
    cat, _ = bench_catalog
    return measured(cat, Against(load_report(baseline), str(baseline), fail_below=0.25))


@pytest.fixture(scope="module")
def now_saved(now, tmp_path_factory) -> Path:
    """``now`` as ``--save`` writes it: the tests that doctor a report judge ``now`` against a doctored
    copy of itself, so that what they check never rests on two runs agreeing."""
    from dsbuild.cli.render import json_text

    path = tmp_path_factory.mktemp("bench-now") / "now.json"
    path.write_text(json_text(now.to_json()) + "\n")
    return path


def judged(now: BenchReport, saved: Path) -> BenchReport:
    """``now`` judged against another saved report as ``run_bench`` judges a run once measured (the
    settings are the same: nothing differs)."""
    return dataclasses.replace(now, gate=Against(load_report(saved), saved.name).judge(now, ()))


@pytest.fixture(scope="module")
def saved(bench_catalog, tmp_path_factory):
    """A report saved by the CLI (with --json and --html), and what it printed: two rounds give every chart
    a spread; nothing gates against it."""
    cat, _ = bench_catalog
    out = tmp_path_factory.mktemp("bench-cli")
    p = run("bench", cat, *gated("1", "2"), "--json", "--save", out / "base.json", "--html", out / "page.html")
    return cat, out, p


def test_json_save_and_html_are_the_same_report(saved):
    _, out, p = saved
    printed = json.loads(p.stdout)
    assert p.stderr == "" and printed == json.loads((out / "base.json").read_text())
    assert printed["format"] == "dsbuild.bench/2" and 1 <= printed["time"]["rounds_done"] <= 2
    page = (out / "page.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and printed["dataset"]["version_id"] in page
    assert "<script" not in page and "src=" not in page and "href=" not in page and "url(" not in page
    assert "cat&lt;b&gt;&amp;x" in page and "cat<b>" not in page  # the catalog's name is text, not markup
    for chart in ("throughput over time", "ours against each baseline", "data wait histogram", "stage decomposition"):
        assert f'aria-label="{chart}"' in page, chart


def test_a_report_that_cannot_be_written_whole_leaves_the_previous_one_and_prints_the_results(saved, tmp_path):
    """--save and --html were written in place before the results were printed: a full disk left a cut-off
    baseline (every later --baseline failed on it) and printed nothing."""
    import resource
    import shutil

    cat, out, _ = saved
    base, page = tmp_path / "base.json", tmp_path / "page.html"
    shutil.copy(out / "base.json", base)
    shutil.copy(out / "page.html", page)
    good, good_page = base.read_bytes(), page.read_bytes()
    assert len(good) > 4096 and len(good_page) > 4096

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    # one short round: the report (over 6 kB of settings, machine and figures) still cannot be written whole
    p = run("bench", cat, *gated("0.2", "1"), "--json", "--save", base, "--html", page, check=3, preexec_fn=small_files)
    assert json.loads(p.stdout)["time"]["rounds_done"] >= 1 and "base.json: cannot write" in p.stderr
    assert base.read_bytes() == good and page.read_bytes() == good_page
    assert sorted(x.name for x in tmp_path.iterdir()) == ["base.json", "page.html"]  # no temp file left


def test_a_baseline_that_is_not_a_regular_file_is_refused_not_waited_on(saved, tmp_path):
    """A FIFO as --baseline blocked the command until killed (open() waits for a writer)."""
    import os

    cat, _, _ = saved
    fifo = tmp_path / "base.json"
    os.mkfifo(fifo)
    p = run("bench", cat, *GATED, "--baseline", fifo, check=2, timeout=120)  # (a hang guard, not a timing)
    assert "is a FIFO" in p.stderr


def test_a_run_that_finished_too_few_rounds_to_judge_is_refused_not_passed(bench_catalog, baseline):
    """The gate checked the rounds asked for, not the rounds done: a budget that fit one round was judged on
    it (no spread) and passed with exit 0."""
    cat, _ = bench_catalog
    p = run("bench", cat, *gated("0.1"), "--json", "--baseline", baseline, check=None)
    done = json.loads(p.stdout)["time"]["rounds_done"]
    assert done < 3 and p.returncode == 2, (done, p.returncode, p.stderr)
    assert f"{done} of 3 round(s) finished within --duration 0.1" in p.stderr


def test_more_ranks_than_batches_is_a_usage_error_naming_the_way_out(bench_catalog):
    """A rank that gets no batch raised a plain DsbuildError, which crossed from the rank as a
    RuntimeError: exit 70, "internal error". (One batch of every clip: the second rank gets none.)"""
    cat, _ = bench_catalog
    p = run(
        "bench", cat, "--decode", "bytes", "--batch-size", "100000", "--ranks", "2",
        "--duration", "0.5", "--rounds", "1", "--compare", "none", check=2,
    )  # fmt: skip
    assert "fewer batches than there are ranks" in p.stderr and "--ranks" in p.stderr


def test_the_same_settings_pass_the_gate(now):
    enforce(now)
    assert {v.baseline for v in now.gate.verdicts} == {"raw", "sha256"} and now.gate.differences == ()
    assert not now.gate.regressed


def doctor(saved: Path, name: str, factor: dict[str, float]) -> Path:
    """The saved report as if ours had been ``factor`` times better against some baselines, in a steady run:
    their rounds re-measured so that ours / them is ``factor`` times the saved median in every round, and
    the figures and ratios that follow (a report whose ratios are not what its rounds give is refused as
    edited). Steady, because a scaled noisy run scales its spread too: a cold first round of ``raw`` once
    made the saved spread wider than the whole drop, and the gate rightly called that noise."""
    doc = json.loads(saved.read_text())
    decode = doc["options"]["decode"]

    def figures(who: str) -> dict[int, float]:
        return {m["round"]: Measured.from_json(m, who).figure(decode) for m in doc["rounds"] if m["name"] == who}

    mine = figures("ours")
    for b in doc["baselines"]:
        if b["name"] not in factor:
            continue
        wanted = factor[b["name"]] * b["ratio"]["median"]
        theirs = figures(b["name"])
        for m in doc["rounds"]:
            if m["name"] == b["name"]:
                scale = mine[m["round"]] / wanted / theirs[m["round"]]
                m.update({f: m[f] * scale for f in ("samples", "frames", "bytes") if m[f] is not None})
        rounds = sorted(figures(b["name"]).items())
        b["figure"] = summarise([v for _, v in rounds]).to_json()
        b["ratio"] = summarise(paired_ratios([mine[r] for r, _ in rounds], [v for _, v in rounds])).to_json()
    path = saved.with_name(name)
    path.write_text(json.dumps(doc))
    return path


def test_the_baselines_named_in_another_order_are_the_same_run(bench_catalog, baseline):
    """--compare sha256,raw against a baseline saved with raw,sha256 was refused as not comparable."""
    cat, _ = bench_catalog
    passes_the_check(cat, Against(load_report(baseline), "base.json"), compare=parse_compare("sha256,raw"))
    older = json.loads(baseline.read_text())  # saved before the names were sorted
    older["options"]["compare"] = ["sha256", "raw"]
    unsorted = baseline.with_name("unsorted.json")
    unsorted.write_text(json.dumps(older))
    passes_the_check(cat, Against(load_report(unsorted), "unsorted.json"))


def steady(now_saved: Path) -> BenchReport:
    """``now`` with every round at its median ratio: a run whose own rounds swing wider than a drop is
    rightly not judged to have dropped (one suite run's did: a round's ratio far off the others), which is
    not what the tests of the verdict's logic are about."""
    return load_report(doctor(now_saved, "steady.json", {"raw": 1, "sha256": 1}))


def test_a_drop_against_every_baseline_is_a_regression_naming_the_ratios(now_saved):
    slower = doctor(now_saved, "slower.json", {"raw": 20, "sha256": 20})
    with pytest.raises(CheckFailed, match="regression against slower.json") as e:
        enforce(judged(steady(now_saved), slower), Against(load_report(slower), "slower.json"))
    assert "ours/sha256" in str(e.value) and "ours/raw" in str(e.value)


def test_a_regression_exits_1_from_the_command(bench_catalog, baseline):
    """The executable's side of the gate: exit 1, one error line naming the ratios. A 20x drop is beyond any
    noise; a machine too loaded to finish three rounds gets exit 2 naming the rounds instead, never 0."""
    cat, _ = bench_catalog
    slower = doctor(baseline, "slower-cli.json", {"raw": 20, "sha256": 20})
    # 0.56 s a measurement: runs of 3 s and 4.5 s finished three rounds at a load of 10 to 22 on two cores
    p = run("bench", cat, *gated("5"), "--baseline", slower, check=None)
    error = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    if p.returncode == 2:
        assert len(error) == 1 and "round(s) finished within --duration 5" in error[0], p.stderr
        return
    assert p.returncode == 1 and len(error) == 1 and error[0].startswith("error: regression against"), p.stderr
    assert "ours/sha256" in error[0] and "ours/raw" in error[0] and "dropped" in p.stdout


def test_a_drop_against_one_baseline_alone_is_not_a_regression(now_saved):
    # raw's saved ratio a twentieth of what it was: ours cannot drop against it
    one = doctor(now_saved, "one.json", {"sha256": 20, "raw": 0.05})
    rep = judged(steady(now_saved), one)
    enforce(rep)
    dropped = {v.baseline: v.dropped for v in rep.gate.verdicts}
    assert dropped == {"raw": False, "sha256": True} and not rep.gate.regressed


def test_incomparable_runs_exit_2_before_measuring_naming_what_differs(bench_catalog, baseline):
    cat, _ = bench_catalog
    p = run("bench", cat, *GATED, "--resize", "64x64", "--baseline", baseline, check=2)
    assert "setting resize: saved None, now [64, 64]" in p.stderr and "--allow-different" in p.stderr
    assert "round 1/" not in p.stderr  # refused at start-up
    p = run("bench", cat, *GATED, "--split", "main/train", "--baseline", baseline, check=2)
    assert "dataset split: saved None, now 'main/train'" in p.stderr
    # judged, not refused, with --allow-different (what is judged does not matter here: a short run)
    against = Against(load_report(baseline), "base.json", fail_below=0.5, allow_different=True)
    rep = measured(cat, against, resize=parse_resize("64x64"), duration=0.3)
    assert rep.gate.differences == ("setting resize: saved None, now [64, 64]",)
    with pytest.raises(UsageError, match="not comparable"):
        measured(cat, Against(load_report(baseline), "base.json"), resize=parse_resize("64x64"))


def test_usage_errors_are_one_line_and_exit_2(bench_catalog, tmp_path):
    cat, _ = bench_catalog
    (tmp_path / "junk.json").write_text('{"format": "something else"}')
    for args, says in (
        (["--resize", "12"], "HEIGHTxWIDTH"),
        (["--compare", "raw"], "not comparable with --decode frames"),
        (["--decode", "pixels"], "--decode"),
        (["--baseline", tmp_path / "missing.json"], "cannot read"),
        (["--baseline", tmp_path / "junk.json"], "format"),
        (["--split", "main"], "NAME/SPLIT"),
    ):
        p = run("bench", cat, "--duration", "1", *args, check=2)
        error = p.stderr.splitlines()  # (refused from the options alone: before any start-up line)
        assert error[0].startswith("error:") and says in p.stderr and len(error) <= 2, (args, p.stderr)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_or_sigterm_reports_and_saves_the_finished_rounds(bench_catalog, tmp_path, sig, code, word):
    """SIGINT (SIGTERM: a CI timeout) once the second round has begun: the rounds finished are kept, printed
    and saved. SIGTERM in the rounds exited 130, "interrupted", like Ctrl-C."""
    cat, _ = bench_catalog
    save = tmp_path / "partial.json"
    p = subprocess.Popen(
        argv(
            "bench",
            cat,
            "--decode",
            "bytes",
            "--batch-size",
            "2",
            "--step-ms",
            "0",
            "--device",
            DEVICE,
            "--compare",
            "raw",
            "--duration",
            "20",  # (0.5 s a measurement: the signal comes long before the 20th round)
            "--rounds",
            "20",  # (more than bench.ranks.FRESH_LIMIT: one loader process serves every round)
            "--save",
            save,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    seen = ""
    # plain progress lines (one at most every 2 s) name the round and the measurement
    named = re.compile(r"^bench round (\d+)/20: (?:ours|raw): ", re.MULTILINE)
    try:
        while all(int(n) < 2 for n in named.findall(seen)):  # until a line says the second round (or a later one) began
            line = p.stderr.readline()
            assert line, seen
            seen += line
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == code, err
    assert f"{word}; the rounds finished before it were reported" in err and "kept" in err
    rep = json.loads(save.read_text())
    assert rep["time"]["interrupted"] and 1 <= rep["time"]["rounds_done"] < 20
    assert {m["round"] for m in rep["rounds"]} == set(range(rep["time"]["rounds_done"]))
    assert f"{rep['time']['rounds_done']} of 20 rounds" in out and "interrupted" in out


def test_a_killed_loader_process_is_named_and_the_run_ends_with_exit_3(bench_catalog):
    """The OOM killer taking our loader's processes mid-run: one line naming the rank and how it ended,
    exit 3, nothing left running (the fork server goes with the run)."""
    cat, _ = bench_catalog
    cmd = argv("bench", cat, *gated("60"), "--compare", "raw")  # (20 s a round: the kill comes in the first)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        seen = ""
        while "bench round 1/3" not in seen:
            line = p.stderr.readline()
            assert line, seen
            seen += line
        (server,) = [pid for pid in children(p.pid) if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        ranks = children(server)
        assert len(ranks) == 3, ranks  # one fresh process per round, all started before round 1
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=120)  # (a hang guard, not a timing)
    finally:
        p.kill()
    assert p.returncode == 3, err
    assert "bench rank 0 exited (code -9)" in err and "Traceback" not in err, err
    for _ in range(300):  # the fork server notices its parent's exit (a guard against a hang, not a timing)
        if not alive(server):
            break
        time.sleep(0.1)
    assert not alive(server) and not any(alive(pid) for pid in ranks)


def test_quiet_prints_nothing_and_a_terminal_gets_a_live_bar(bench_catalog):
    from tests.cli.clitools import run_tty

    cat, _ = bench_catalog
    q = run(
        "bench",
        cat,
        "--decode",
        "bytes",
        "--duration",
        "0.2",
        "--rounds",
        "1",
        "--compare",
        "none",
        "--step-ms",
        "0",
        "--quiet",
    )
    assert q.stdout == "" and q.stderr == ""
    rc, text = run_tty(
        "bench", cat, "--decode", "bytes", "--duration", "0.2", "--rounds", "1", "--compare", "raw", "--step-ms", "0"
    )
    assert rc == 0 and "1 of 1 rounds" in text and "ours / run" in text, text
    assert "one round: its ranges are one value, no spread" in " ".join(text.split())  # not a spread of one


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (make test installs it)")
def test_the_html_page_renders_in_headless_chromium_and_is_not_blank(saved, tmp_path):
    import av

    _, out, _ = saved
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
            "--window-size=1000,2200",
            f"--screenshot={shot}",
            (out / "page.html").resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    with av.open(str(shot)) as c:
        img = next(c.decode(video=0)).to_ndarray(format="rgb24")
    ink = (img.astype(int).sum(axis=2) < 600).mean()  # share of pixels that are not near-white
    colours = len(np.unique(img.reshape(-1, 3)[::97], axis=0))
    assert ink > 0.02 and colours > 20, (ink, colours)


def test_the_decoder_choice_and_short_epochs_are_said_in_piped_output(bench_catalog):
    cat, _ = bench_catalog
    p = run(
        "bench",
        cat,
        "--decode-backend",
        "auto",
        "--resize",
        "16x16",
        "--batch-size",
        "64",
        "--threads",
        "2",
        "--duration",
        "0.3",
        "--rounds",
        "1",
        "--step-ms",
        "0",
        "--compare",
        "none",
    )
    assert "decoder: auto: no CUDA GPU, decoding with PyAV on CPU" in p.stdout, p.stdout
    assert "note 1 batch per epoch for 2 threads: the pipeline reads ahead into the next epoch only" in p.stdout, (
        p.stdout
    )


def test_nvdec_without_a_gpu_is_an_environment_error_naming_what_is_missing(bench_catalog):
    from dsbuild.loader.backends import probe

    if probe()[0]:
        pytest.skip("a CUDA GPU is present: nvdec runs there")
    cat, _ = bench_catalog
    p = run("bench", cat, "--decode-backend", "nvdec", "--resize", "16x16", "--duration", "1", check=3)
    assert "error: decode_backend='nvdec' needs a CUDA GPU" in p.stderr and "decode_backend='pyav'" in p.stderr


def test_a_run_with_the_peers_leaves_no_shared_memory_behind(bench_catalog):
    """Mosaic frees its shared memory in atexit handlers, which the CLI's os._exit does not run: every
    bytes-mode run printed the resource tracker's warning of 6 leaked blocks."""
    pytest.importorskip("litdata", reason="the peers extra is not installed")
    if find_spec("streaming") is None:  # (installed is enough: the bench imports Mosaic's reader modules alone)
        pytest.skip("the peers extra (mosaicml-streaming) is not installed")
    cat, _ = bench_catalog
    p = run(
        "bench",
        cat,
        "--decode",
        "bytes",
        "--batch-size",
        "2",
        "--step-ms",
        "0",
        "--device",
        DEVICE,
        "--duration",
        "0.5",
        "--rounds",
        "1",
        "--compare",
        "litdata,mosaic",
        "--json",
    )
    assert p.stderr == "" and json.loads(p.stdout)["format"] == "dsbuild.bench/2", p.stderr

"""`dsbuild bench CATALOG --model NAME` through the real executable: a real training step, measured.

One sweep (DDP, --ranks 1,2 in three interleaved rounds, a data delay injected on rank 1) and one FSDP2 run (a compute delay on rank
0) serve the structure tests: each is a few 2-rank gloo jobs of the tiny model on 32x32 crops. Tests
assert structure and consistency (MFU in (0, 1), parts that add up, communication with 2 ranks, the
injected rank and component named), never wall-clock limits. The injected delays are 1.2 s: beside two
busy loops a 0.4-s compute delay was named but not flagged (under 10% of the step once the other rank's
own work had swung by as much).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from dsbuild.bench.train.decompose import PARTS
from dsbuild.bench.train.report import TrainReport
from tests.cli.clitools import argv, env, run

pytest.importorskip("torch")

SMALL = (
    "--model",
    "tiny",
    "--resize",
    "32x32",
    "--clip-frames",
    "4",
    "--batch-size",
    "2",
    "--warmup",
    "1",
    "--steps",
    "2",
    "--timeout",
    "60",
)


def bench_json(cat: Path, *extra) -> TrainReport:
    import json

    p = run("bench", cat, "--split", "main/train", *SMALL, *extra, "--json")
    return TrainReport.from_json(json.loads(p.stdout), "bench --model --json")


@pytest.fixture(scope="module")
def swept(bench_catalog, tmp_path_factory) -> tuple[TrainReport, str, Path]:
    """(report saved with --save, the table printed, the --history folder) of one sweep."""
    import json

    cat, _ = bench_catalog
    work = tmp_path_factory.mktemp("sweep")
    p = run(
        "bench",
        cat,
        "--split",
        "main/train",
        *SMALL,
        "--steps",
        "3",
        "--ranks",
        "1,2",
        "--inject-delay",
        "1:data:1200",
        "--price-per-hour",
        "2.5",
        "--save",
        work / "run.json",
        "--html",
        work / "run.html",
        "--history",
        work / "history",
    )
    saved = json.loads((work / "run.json").read_text())
    return TrainReport.from_json(saved, "--save"), p.stdout, work


@pytest.fixture(scope="module")
def sweep(swept) -> TrainReport:
    return swept[0]


@pytest.fixture(scope="module")
def fsdp(bench_catalog) -> TrainReport:
    cat, _ = bench_catalog
    return bench_json(
        cat, "--ranks", "2", "--parallel", "fsdp", "--inject-delay", "0:1200", "--dtype", "fp32", "--restart"
    )


def test_the_report_names_model_layout_dtype_device_versions_and_dataset(sweep, bench_catalog):
    _, vid = bench_catalog
    assert sweep.dataset.version_id == vid and sweep.dataset.split == "main/train"
    assert (sweep.model.name, sweep.model.parallel, sweep.model.dtype) == ("tiny", "ddp", "bf16")
    assert sweep.device == "cpu" and sweep.peak.source == "measured"
    assert sweep.software["torch"].startswith("2.") and sweep.software["dsbuild"]
    assert 0.5e6 < sweep.model.params < 2e6


def test_mfu_is_a_fraction_counted_and_analytic(sweep, fsdp):
    for p in (*sweep.points, *fsdp.points):
        assert 0 < p.mfu < 1 and 0 < p.mfu_analytic < 1
        # FlopCounterMode's count includes attention; 6ND counts the dense part: the same order
        assert 0.3 < p.flops_per_step / p.analytic_flops_per_step < 3


def test_the_parts_add_up_to_the_measured_step(sweep, fsdp):
    for p in (*sweep.points, *fsdp.points):
        for r in p.ranks:
            assert len(r.parts) == len(r.step_s) >= 2
            for parts, clock in zip(r.parts, r.step_s):
                assert abs(sum(getattr(parts, k) for k in PARTS) - parts.step) <= 1e-6
                assert abs(parts.step - clock) <= 0.05 * clock  # the profiler's window against the clock


def test_two_ranks_communicate_and_one_rank_does_not_wait_for_peers(sweep, fsdp):
    for p in (*sweep.points, *fsdp.points):
        if p.world == 2:
            assert all(sum(x.comm for x in r.parts) > 0 for r in p.ranks)
    assert [(p.kind, p.world, p.batch_size) for p in sweep.points] == [("base", 1, 2), ("weak", 2, 2), ("strong", 2, 1)]


def test_the_points_run_interleaved_and_efficiency_is_the_median_of_paired_rounds(sweep):
    """--steps 3 under the default --rounds 5: three rounds of one profiled step, the points taking turns."""
    base, weak, strong = sweep.points
    assert all(r.round_steps == (1, 1, 1) for p in sweep.points for r in p.ranks)
    for p in sweep.points:  # a round's step: the slowest rank's in that round
        assert p.round_step_s == pytest.approx([max(r.parts[k].step for r in p.ranks) for k in range(3)])
    assert base.efficiency is None
    pairs = list(zip(base.round_step_s, weak.round_step_s, strong.round_step_s))
    assert weak.efficiency == pytest.approx(statistics.median(b / w for b, w, _ in pairs))
    assert strong.efficiency == pytest.approx(statistics.median(b / (2 * s) for b, _, s in pairs))


def test_an_injected_data_delay_is_named_by_rank_and_component(sweep):
    weak = sweep.points[1]
    s = weak.straggler
    assert (s.rank, s.component, s.flagged) == (1, "data_wait", True)
    assert [sum(r.frames) / len(r.frames) for r in weak.ranks] == [8, 8]  # same batches: not an imbalance
    assert sweep.verdict.input_bound and sweep.verdict.workers_per_rank >= 1


def test_an_injected_compute_delay_under_fsdp_is_named(fsdp):
    (p,) = fsdp.points
    assert (fsdp.model.parallel, fsdp.model.dtype) == ("fsdp", "fp32")
    assert (p.straggler.rank, p.straggler.component, p.straggler.flagged) == (0, "compute", True)


def test_restart_is_timed_by_component_and_trains_each_sample_once(fsdp):
    r = fsdp.restart
    assert (r.killed_rank, r.signal, r.killed_after_step) == (1, "SIGKILL", 1)
    assert set(r.components) >= {
        "process start and process-group init",
        "index and catalog load",
        "loader restore",
        "model and optimizer restore",
        "first batch",
    }
    assert all(v >= 0 for v in r.components.values()) and r.total_s >= max(r.components.values())
    assert r.exactly_once and 0 < r.samples_checked <= fsdp.dataset.samples, r.detail


def test_cost_per_steps_and_epoch(sweep):
    c = sweep.cost
    assert c.price_per_hour == 2.5 and c.devices == 2
    assert c.per_1000_steps == pytest.approx(2.5 * 2 * sweep.points[1].step_s / 3.6)
    assert c.steps_per_epoch == sweep.dataset.samples / 4 and c.data_wait_share == sweep.verdict.data_wait_share


def test_the_table_shows_points_parts_and_the_straggler(swept):
    _, out, work = swept
    for text in (
        "MFU counted",
        "exposed_comm",
        "data_wait",
        "straggler: rank 1",
        "mostly data_wait",
        "frames/step",
        "input-bound",
        "per 1,000 steps",
        "take turns over 3 round(s)",
        "by round",
    ):
        assert text in out, out
    page = (work / "run.html").read_text()
    assert "<svg" in page and "data_wait" in page and "<script" not in page


def test_model_list_prints_each_size_with_its_parameters():
    out = run("bench", "anything", "--model", "list").stdout
    for name in ("tiny", "small", "medium", "base"):
        assert name in out
    assert "0.83 M" in out and "99.45 M" in out


def test_an_unknown_model_lists_the_known_ones(bench_catalog):
    p = run("bench", bench_catalog[0], "--model", "huge", check=2)
    assert "known: tiny, small, medium, base" in p.stderr


def test_without_torch_the_extra_is_named(tmp_path, bench_catalog):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torch here')\n")
    p = run("bench", bench_catalog[0], "--model", "tiny", check=3, extra_env={"PYTHONPATH": str(tmp_path)})
    assert "dsbuild[torch]" in p.stderr


def test_a_model_too_big_for_memory_is_one_line(bench_catalog):
    p = run("bench", bench_catalog[0], "--model", "base", "--resize", "1024x1024", "--clip-frames", "64", check=3)
    line = p.stderr.strip().splitlines()[0]
    assert "model base" in line and "GB available" in line and "needs about" in line


def test_a_rank_that_dies_is_named_with_its_signal_never_a_hang(bench_catalog):
    cat, _ = bench_catalog
    proc = subprocess.Popen(
        argv("bench", cat, "--split", "main/train", *SMALL, "--ranks", "2", "--steps", "50"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    victim = None
    for _ in range(600):
        victim = next(iter(_workers(proc.pid)), None)
        if victim is not None or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert victim is not None, proc.communicate()
    _past_startup(victim)  # killed in its run, not while it imports
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "died (signal SIGKILL)" in err and "collective timeout 60 s" in err


def _past_startup(pid: int, cpu_seconds: float = 1.0) -> None:
    """Return once process ``pid`` has used ``cpu_seconds`` of CPU (its own clock: a state, not a wait for
    the wall clock), or has ended."""
    tick = os.sysconf("SC_CLK_TCK")
    while True:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return
        if fields[0] == "Z" or (int(fields[11]) + int(fields[12])) / tick >= cpu_seconds:
            return
        time.sleep(0.02)  # a poll


def _workers(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if b"dsbuild.bench.train.worker" in cmd and int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def _copy_run(src: Path, dst_dir: Path, n: int, slower: float = 1.0) -> None:
    """Run ``src`` again as run ``n`` of ``dst_dir``: its rounds unchanged, or each figure's rounds moved
    past their worst and then made ``slower`` times worse, so that every doctored round is worse than
    every original one (a run on a loaded machine spreads its rounds wider than any fixed factor)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(src).to_pylist()
    for r in rows:
        r["run_id"] = f"29990101T0000{n:02d}.000000Z-copy{n}"
        r["started_at"] = r["run_id"][:22]
        lo, hi = min(r["rounds"]), max(r["rounds"])
        if slower != 1.0 and r["better"] == "lower":
            r["rounds"] = [(v + hi - lo) * slower for v in r["rounds"]]
        elif slower != 1.0 and hi > 0:
            r["rounds"] = [v * (lo / hi) / slower for v in r["rounds"]]
        r["median"] = sorted(r["rounds"])[len(r["rounds"]) // 2]
    pq.write_table(pa.Table.from_pylist(rows), dst_dir / f"run-{rows[0]['run_id']}.parquet")


def test_the_history_passes_an_unchanged_run_and_flags_a_doctored_slower_one(swept, tmp_path):
    import json

    _, _, work = swept
    (real,) = (work / "history").glob("run-*.parquet")
    history = tmp_path / "history"
    history.mkdir()
    for n in range(5):
        _copy_run(real, history, n)
    judged = json.loads(run("bench", "history", history, "--json").stdout)
    assert judged and not any(j["regressed"] for j in judged) and all(j["trailing_runs"] == 4 for j in judged)
    _copy_run(real, history, 9, slower=1.5)
    p = run("bench", "history", history, "--html", tmp_path / "h.html", check=1)
    flagged = {line.split("\t")[1] for line in p.stdout.splitlines() if line.endswith("REGRESSED")}
    assert {"step_s", "mfu", "samples_per_s"} <= flagged and "regression" in p.stderr
    assert "<svg" in (tmp_path / "h.html").read_text()

"""`dsbuild bench` on real converted sample data: every figure present, positive and consistent; the
step-time decomposition adds up; the regression gate fails on a doctored baseline; --json, --save,
--html and --ranks work. Runs are a second or two per measurement; no test asserts a speed."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest

from dsbuild.bench import BenchOptions, run_bench
from dsbuild.bench.report import regressions
from dsbuild.bench.summary import paired_ratio, percentiles, rate_series, rotate, spread
from dsbuild.core.errors import UsageError
from dsbuild.loader import Loader
from tests.helpers import index_rows

SMALL = {"batch_size": 2, "workers": 2, "resize": (32, 32), "device": "cpu", "rounds": 2, "duration": 1.0}


def dsbuild(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from dsbuild.cli.app import main; main()", *map(str, args)],
                          capture_output=True, text=True, check=False)


def positive(s: dict | None) -> bool:
    return s is not None and 0 < s["min"] <= s["median"] <= s["max"] and math.isfinite(s["max"])


@pytest.fixture(scope="module")
def report(wds_catalog):
    path, _ = wds_catalog
    return run_bench(BenchOptions(ref=str(path), step_ms=20, **SMALL))


# -- the report -----------------------------------------------------------------------------------
def test_report_names_the_version_machine_and_software(report, wds_catalog):
    _, version_id = wds_catalog
    assert report["version_id"] == version_id and report["dataset"]["ref"].endswith("@" + version_id)
    m = report["machine"]
    assert m["cores"] >= 1 and m["memory_bytes"] > 0 and m["gpu"] is None
    assert all(report["versions"][k] for k in ("dsbuild", "av", "torch", "webdataset"))
    assert report["config"]["device_resolved"] == "cpu" and report["config"]["rounds"] == 2
    json.dumps(report, allow_nan=False)  # every figure is plain JSON


def test_every_throughput_and_latency_figure_is_positive(report):
    for figure in ("samples_per_s", "frames_per_s", "mb_per_s", "batches_per_s"):
        assert positive(report["throughput"][figure]), figure
        assert report["throughput"][figure]["rounds"] == 2
    for figure in ("first_batch_s", "resume_s", "open_s"):
        assert positive(report["latency"][figure]), figure
    assert report["batch_interval_ms"] > 0 and report["corrupt"] == 0


def test_figures_agree_with_the_data(report, wds_catalog):
    rows = index_rows(*wds_catalog)
    frames = [r["frames"] for r in rows]
    sizes = [r["length"] for r in rows]
    for r in report["rounds"]["ours"]:
        per_sample_frames = r["frames_per_s"] / r["samples_per_s"]
        per_sample_bytes = r["mb_per_s"] * 1e6 / r["samples_per_s"]
        assert min(frames) <= per_sample_frames + 1e-6 and per_sample_frames <= max(frames) + 1e-6
        assert min(sizes) <= per_sample_bytes + 1e-3 and per_sample_bytes <= max(sizes) + 1e-3
        assert r["samples_per_s"] <= r["batches_per_s"] * 2 + 1e-9  # batch_size 2, the last may be short


def test_training_simulation_reports_waits_and_fractions(report):
    tr = report["training"]
    assert tr["step"] == {"kind": "sleep", "ms": 20}
    w = tr["data_wait_ms"]
    assert 0 <= w["p50"] <= w["p95"] <= w["max"]
    assert 0 <= tr["wait_fraction"]["min"] <= tr["wait_fraction"]["max"] <= 1
    assert tr["fed"] == (tr["wait_fraction"]["median"] < tr["fed_below"])
    assert tr["gpu_idle_fraction"] is None and "CUDA" in tr["gpu_idle_reason"]
    assert positive(tr["samples_per_s"]) and tr["steps"] >= 2 * 3  # at least three steps per round
    h = report["h2d"]
    assert h["pinned_gb_per_s"] is None and h["pageable_gb_per_s"] is None and "CUDA" in h["reason"]


def test_training_wall_time_is_data_wait_plus_step_plus_rest(report):
    c = report["decomposition"]["training"]["consumer"]
    assert c["data_wait"] + c["step"] + c["other"] == pytest.approx(c["wall"])
    assert c["other"] >= -1e-9 and c["step"] > 0
    assert c["data_wait"] >= c["wait"] + c["h2d"] - 1e-6  # next() includes the loader's wait and copy
    assert 0 <= c["fractions"]["data_wait"] <= 1


def test_pipeline_time_is_attributed_to_named_worker_threads(report):
    for phase in ("throughput", "training"):
        p = report["decomposition"][phase]["pipeline"]
        assert sorted(p["workers"]) == ["dsbuild-load_0", "dsbuild-load_1"]
        for w in p["workers"].values():
            assert w["busy"] == pytest.approx(w["read"] + w["decode"] + w["collate"])
            assert w["decode"] > 0 and 0 < w["utilisation"] <= 1.05 and w["batches"] >= 1
        assert p["busy"] == pytest.approx(sum(w["busy"] for w in p["workers"].values()))
        assert sum(p["fractions"].values()) == pytest.approx(1)


def test_baselines_and_ratios_are_measured_in_the_same_rounds(report):
    for name in ("raw", "pyav", "webdataset"):
        b = report["baselines"][name]
        assert positive(b["samples_per_s"]) and positive(b["mb_per_s"]), name
        assert positive(b["frames_per_s"]) or (name == "raw" and b["frames_per_s"] is None), name
        assert len(report["rounds"][name]) == 2
    assert set(report["ratios"]) == {"raw", "pyav", "webdataset"}
    assert set(report["ratios"]["raw"]) == {"samples_per_s", "mb_per_s"}
    assert set(report["ratios"]["pyav"]) == {"frames_per_s"}
    for figures in report["ratios"].values():
        assert all(positive(r) for r in figures.values())
    per_round = [a["samples_per_s"] / b["samples_per_s"]
                 for a, b in zip(report["rounds"]["ours"], report["rounds"]["raw"])]
    assert report["ratios"]["raw"]["samples_per_s"]["median"] == pytest.approx(statistics.median(per_round))


def test_timeline_has_a_rate_series_per_round(report):
    assert len(report["timeline"]) == 2
    for series in report["timeline"]:
        assert series and all(t > 0 and v >= 0 for t, v in series)


# -- the decomposition where it must add up -------------------------------------------------------
def test_stage_times_sum_to_wall_with_one_worker_and_no_step(wds_catalog):
    """One loader thread with batches always queued is never idle: read + decode + collate ~ its wall;
    the consumer does nothing but wait: wait + h2d ~ its wall."""
    path, _ = wds_catalog
    rep = run_bench(BenchOptions(ref=str(path), step_ms=0, compare=(), **{**SMALL, "workers": 0}))
    d = rep["decomposition"]["throughput"]
    p = d["pipeline"]
    assert list(p["workers"]) == ["dsbuild-load_0"]
    assert p["read"] + p["decode"] + p["collate"] == pytest.approx(p["wall"], rel=0.10)
    c = d["consumer"]
    assert c["wait"] + c["h2d"] == pytest.approx(c["wall"], rel=0.10)
    assert rep["training"]["skipped"] and rep["decomposition"]["training"] is None
    assert rep["baselines"] == {} and rep["ratios"] == {}


def test_loader_stats_attribute_every_second_to_a_thread(wds_catalog):
    path, _ = wds_catalog
    loader = Loader(str(path), batch_size=2, num_workers=2, decode="bytes", seed=1)
    n = sum(1 for _ in loader)
    stats = loader.stats()
    threads = stats["threads"]
    for stage in ("read", "decode", "collate", "wait"):
        assert sum(t.get(stage, 0) for t in threads.values()) == pytest.approx(stats["seconds"][stage])
    assert sum(t.get("batches", 0) for t in threads.values()) == stats["batches"] == n
    assert threads["MainThread"]["wait"] > 0 and "read" not in threads["MainThread"]
    assert {k for k in threads if k != "MainThread"} <= {"dsbuild-load_0", "dsbuild-load_1"}


# -- other shapes of run --------------------------------------------------------------------------
def test_bytes_mode_on_parquet_skips_baselines_that_do_not_apply(parquet_catalog):
    path, version_id = parquet_catalog
    rep = run_bench(BenchOptions(ref=str(path), step_ms=0, decode="bytes", **SMALL))
    assert rep["version_id"] == version_id
    assert "decode=bytes" in rep["baselines"]["pyav"]["skipped"]
    assert "parquet" in rep["baselines"]["webdataset"]["skipped"]
    assert set(rep["ratios"]) == {"raw"} and positive(rep["ratios"]["raw"]["samples_per_s"])
    assert positive(rep["throughput"]["samples_per_s"])


def test_two_simulated_ranks_report_each_rank_and_their_skew(wds_catalog):
    path, version_id = wds_catalog
    rep = run_bench(BenchOptions(ref=str(path), step_ms=10, ranks=2, compare=("raw",), **SMALL))
    rk = rep["ranks"]
    assert rk["world_size"] == 2 and [r["rank"] for r in rk["per_rank"]] == [0, 1]
    for r in rk["per_rank"]:
        assert positive(r["samples_per_s"]) and positive(r["first_batch_s"])
        assert 0 <= r["wait_fraction"]["min"] <= r["wait_fraction"]["max"] <= 1
    assert 0 < rk["skew"] <= 1 and rk["slowest"] in ("rank 0", "rank 1")
    assert set(rk["stragglers"]) <= {"rank 0", "rank 1"}
    medians = [r["samples_per_s"]["median"] for r in rk["per_rank"]]
    assert rk["skew"] == pytest.approx(min(medians) / max(medians))
    assert positive(rep["throughput"]["samples_per_s"]) and len(rep["rounds"]["ours"]) == 2
    workers = rep["decomposition"]["throughput"]["pipeline"]["workers"]
    assert {w.split("/")[0] for w in workers} == {"rank0", "rank1"}
    assert 0 <= rep["training"]["wait_fraction"]["median"] <= 1
    assert rep["version_id"] == version_id and positive(rep["ratios"]["raw"]["samples_per_s"])


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_json_save_html_and_the_regression_gate(wds_catalog, tmp_path):
    path, version_id = wds_catalog
    saved, page = tmp_path / "bench.json", tmp_path / "bench.html"
    common = ["bench", path, "--decode", "bytes", "--batch-size", "2", "--duration", "1", "--rounds", "2",
              "--step-ms", "5", "--compare", "raw,webdataset", "--device", "cpu"]
    r = dsbuild(*common, "--json", "--save", saved, "--html", page)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed == json.loads(saved.read_text())
    assert printed["version_id"] == version_id and printed["format"] == "dsbuild.bench/1"
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 2 and version_id in html
    assert "<script" not in html and "src=" not in html and "href=" not in html  # self-contained

    doctored = json.loads(saved.read_text())
    for figures in doctored["ratios"].values():
        for s in figures.values():
            s["median"] *= 1000  # a baseline run claiming we used to be 1000x better
    (tmp_path / "doctored.json").write_text(json.dumps(doctored))
    r = dsbuild(*common, "--baseline", tmp_path / "doctored.json", "--fail-below", "0.9")
    assert r.returncode == 1, r.stderr
    assert "regression" in r.stderr and "raw/samples_per_s" in r.stderr


def test_cli_usage_errors_exit_2_with_one_line(wds_catalog, tmp_path):
    path, _ = wds_catalog
    for args in (["--resize", "12"], ["--compare", "raw,tfrecord"], ["--decode", "pixels"],
                 ["--baseline", tmp_path / "missing.json"]):
        r = dsbuild("bench", path, "--duration", "1", *args)
        assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.splitlines()) == 1, args
    import torch

    if not torch.cuda.is_available():
        r = dsbuild("bench", path, "--device", "cuda", "--duration", "1")
        assert r.returncode == 2 and "CUDA is not available" in r.stderr


# -- the gate and the arithmetic (pure) -----------------------------------------------------------
def test_gate_passes_at_or_above_the_floor_and_fails_below_or_when_missing():
    saved = {"ratios": {"raw": {"samples_per_s": {"median": 0.5}, "mb_per_s": {"median": 0.4}}}}
    now = {"ratios": {"raw": {"samples_per_s": {"median": 0.45}, "mb_per_s": {"median": 0.30}}}}
    failed = regressions(now, saved, 0.9)
    assert [f["ratio"] for f in failed] == ["raw/mb_per_s"] and failed[0]["floor"] == pytest.approx(0.36)
    assert regressions(saved, saved, 0.9) == []
    assert [f["problem"] for f in regressions({"ratios": {}}, saved, 0.9)] == ["not measured in this run"] * 2


def test_summary_arithmetic():
    assert spread([3.0, 1.0, 2.0, None]) == {"median": 2.0, "min": 1.0, "max": 3.0, "rounds": 3}
    assert spread([None]) is None
    assert percentiles([float(i) for i in range(1, 101)]) == {"p50": 50.0, "p95": 95.0, "max": 100.0}
    ours = [{"x": 2.0}, {"x": 3.0}, {"x": 8.0}]
    theirs = [{"x": 4.0}, {"x": 3.0}, {"x": 4.0}]
    assert paired_ratio(ours, theirs, "x")["median"] == 1.0
    assert rate_series([(0.4, 10), (1.0, 20)], bins=2) == [[0.25, 20.0], [0.75, 20.0]]
    assert rate_series([(0.6, 10), (1.0, 40)], bins=2) == [[0.25, 0.0], [0.75, 80.0]]
    assert [rotate(["a", "b", "c"], r)[0] for r in range(4)] == ["a", "b", "c", "a"]


def test_options_refuse_bad_values():
    for bad in ({"decode": "pixels"}, {"device": "tpu"}, {"compare": ("nope",)}, {"batch_size": 0},
                {"duration": 0}):
        with pytest.raises(UsageError):
            BenchOptions(ref="x", **bad)

"""`dsbuild bench --workers 1,2` / `--threads 1,2`: a scaling sweep, interleaved, baselines at the same N,
throughput and efficiency per point in the table, the JSON and the HTML page."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.bench.options import BenchOptions
from dsbuild.bench.sweep import efficiencies, parse_counts, point_options, run_sweep
from dsbuild.core.errors import UsageError
from tests.cli.clitools import run


def test_counts_are_whole_numbers_without_repeats():
    assert parse_counts("1,2, 4", "--workers") == [1, 2, 4]
    for bad in ("0", "1,,2", "a", "2,2", "-1"):
        with pytest.raises(UsageError, match="--workers"):
            parse_counts(bad, "--workers")


@given(st.lists(st.floats(1, 1e6), min_size=1, max_size=6), st.floats(0.5, 4))
def test_linear_scaling_is_efficiency_one_whatever_the_first_count(rates, per):
    counts = sorted({int(r) % 64 + 1 for r in rates})
    eff = efficiencies({n: per * n for n in counts})
    assert all(abs(e - 1.0) < 1e-9 for e in eff.values())


def test_a_point_runs_its_workers_and_the_baselines_with_as_many_threads():
    o = BenchOptions(ref="x", threads=2, rounds=3, duration=9.0)
    p = point_options(o, "process", 4, 1.5)
    assert (p.workers, p.threads, p.rounds, p.duration) == (4, 4, 1, 1.5)
    assert point_options(o, "thread", 3, 1.0).workers is None


class FakeReport:
    """What ``run_sweep`` reads of a bench report."""

    def __init__(self, figure: float, base: float):
        fig = type("S", (), {"median": figure})
        bfig, ratio = type("S", (), {"median": base}), type("S", (), {"median": figure / base})
        self.unit = "MB/s"
        self.ours = type("O", (), {"figure": fig, "notes": ()})
        self.baselines = [type("B", (), {"name": "raw", "skipped": None, "figure": bfig, "ratio": ratio})]
        self.time = type("T", (), {"startup_s": 0.5})


def test_rounds_interleave_every_count_and_points_take_medians():
    ran: list[tuple[int, int]] = []

    def fake(opts: BenchOptions) -> FakeReport:
        ran.append((opts.workers, opts.threads))
        return FakeReport(100.0 * opts.threads * (0.9 if len(ran) > 2 else 1.0), 1000.0)

    s = run_sweep(BenchOptions(ref="x", rounds=2, duration=4.0), "process", [1, 2], fake)
    assert ran == [(1, 1), (2, 2), (1, 1), (2, 2)]  # round by round, every N once in each
    assert [p.n for p in s.points] == [1, 2] and all(p.rounds == 2 for p in s.points)
    assert s.points[1].figure == pytest.approx(190.0) and s.points[0].efficiency == 1.0
    assert s.points[1].ratios["raw"] == pytest.approx(0.19)


def test_bad_counts_and_a_sweep_against_a_baseline_are_usage_errors(bench_catalog):
    cat, _ = bench_catalog
    p = run("bench", cat, "--workers", "0", check=2)
    assert "--workers '0'" in p.stderr
    p = run("bench", cat, "--threads", "1,2", "--baseline", "x.json", check=2)
    assert "--baseline gates one run, not a sweep" in p.stderr


def test_frames_sweeps_compare_worker_processes_with_as_many_pyav_processes_and_threads_with_threads():
    from dsbuild.bench.compare import applicable

    assert applicable(BenchOptions(ref="x", workers=2)) == ("pyav-procs",)
    assert applicable(BenchOptions(ref="x", threads=2)) == ("pyav",)


def test_the_cli_sweeps_worker_processes_against_as_many_pyav_processes_into_a_table_json_and_a_plot(
    bench_catalog, tmp_path
):
    cat, _ = bench_catalog
    page = tmp_path / "sweep.html"
    p = run(
        "bench", cat, "--workers", "1,2", "--resize", "32x32", "--batch-size", "2", "--duration", "2",
        "--rounds", "1", "--step-ms", "0", "--json", "--html", page,
    )  # fmt: skip
    sweep = json.loads(p.stdout)["sweep"]
    assert sweep["mode"] == "process" and sweep["unit"] == "frames/s"
    assert [pt["n"] for pt in sweep["points"]] == [1, 2]
    for pt in sweep["points"]:  # (the bare loop in N processes, each its share of the clips)
        assert pt["figure"] > 0 and pt["efficiency"] > 0
        assert list(pt["baselines"]) == ["pyav-procs"] and pt["baselines"]["pyav-procs"] > 0
        assert pt["ratios"]["pyav-procs"] > 0
    assert sweep["points"][0]["efficiency"] == 1.0
    html = page.read_text()
    assert "<svg" in html and "worker processes" in html and "ours / pyav-procs" in html


def test_a_pyav_process_that_dies_is_an_error_naming_it_never_a_hang(bench_catalog, tmp_path):
    from dsbuild.bench.baselines import PyAVProcs
    from dsbuild.bench.dataset import describe
    from dsbuild.bench.measure import Meter
    from dsbuild.core.errors import WorkerDied

    cat, _ = bench_catalog
    procs = PyAVProcs(describe(str(cat), BenchOptions(ref="x").split), 2, (32, 32), tmp_path)
    procs.prepare()
    try:
        procs.procs[1].kill()
        with pytest.raises(WorkerDied, match="pyav-procs: process 1 of 2 exited"):
            procs.run(Meter("pyav-procs", 0, 0.0, 30.0, decodes=True))
    finally:
        procs.close()
    assert not procs.procs


def _main_thread_waits_on_its_input(pid: int) -> bool:
    """Whether process ``pid``'s main thread sleeps in select (reading its input), not decoding."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{pid}/wchan") as f:
            wchan = f.read()
    except OSError:
        return False
    return state == "S" and ("select" in wchan or "poll" in wchan)


def test_a_pyav_process_stops_decoding_by_itself_once_its_seconds_have_passed(bench_catalog, tmp_path):
    """Its decoders can keep the bench parent from the CPU, and the parent's ``stop`` with it: a process
    stops decoding by itself once the seconds of its ``go`` have passed, then waits for the ``stop``."""
    import time

    from dsbuild.bench import pyavproc
    from dsbuild.bench.baselines import PyAVProcs
    from dsbuild.bench.dataset import describe

    cat, _ = bench_catalog
    procs = PyAVProcs(describe(str(cat), BenchOptions(ref="x").split), 1, (32, 32), tmp_path)
    procs.prepare()
    try:
        p = procs.procs[0]
        assert p.stdin is not None
        p.stdin.write(pyavproc.go_line(0.3))
        p.stdin.flush()
        assert procs._receive(0, pyavproc.STOPPED) is not None  # it decodes...
        idle = 0
        while idle < 5:  # ...then sleeps on its input, seen 5 times in a row, with no stop sent
            idle = idle + 1 if _main_thread_waits_on_its_input(p.pid) else 0
            time.sleep(0.02)
        p.stdin.write(pyavproc.STOP)
        p.stdin.flush()
        while procs._receive(0, pyavproc.STOPPED) is not None:
            pass
        assert p.poll() is None  # and waits for the next go
    finally:
        procs.close()


def test_pyav_process_messages_are_validated_json():
    import os

    from dsbuild.bench.pyavproc import Commands, go_line, parse_answer, parse_go, parse_spec
    from dsbuild.core.errors import FormatError, WorkerDied

    assert parse_spec('{"clips": "c.bin", "share": [[0, 10, 7]], "resize": [32, 32], "decoders": 2}') == (
        "c.bin",
        [(0, 10, 7)],
        (32, 32),
        2,
    )
    for bad in (
        '{"clips": "c", "share": [], "decoders": 1}',
        '{"clips": "c", "share": [[0, -1, 1]], "decoders": 1}',
        '{"share": [[0, 1, 1]], "decoders": 1}',
        '{"clips": "c", "share": [[0, 1, 1]], "decoders": 0}',
        '{"clips": "c", "share": [[0, 1, 1]]}',
    ):
        with pytest.raises(FormatError):
            parse_spec(bad)
    assert parse_go(go_line(2.5)) == 2.5 and parse_go(b"stop\n") is None
    for bad in (b"go\n", b"go x\n", b"go -1\n", b"go nan\n", b"go 1e9\n"):
        with pytest.raises(FormatError, match="go"):
            parse_go(bad)
    r, w = os.pipe()
    os.write(w, b"go 1\nstop\n" + b"x" * 2000)
    os.close(w)
    lines = Commands(r)
    assert lines.next() == b"go 1\n" and lines.arrived() and lines.next() == b"stop\n"
    with pytest.raises(FormatError, match="longer than"):  # (no line without end is held in memory)
        lines.next()
    os.close(r)
    assert parse_answer(b'{"n": [1, 30, 900]}\n', "stopped", "p") == [1.0, 30.0, 900.0]
    assert parse_answer(b'{"stopped": true}\n', "stopped", "p") is None
    with pytest.raises(FormatError):
        parse_answer(b'{"n": [1, -2, 3]}\n', "stopped", "p")
    with pytest.raises(WorkerDied, match="p: OSError: gone"):
        parse_answer(b'{"error": "OSError: gone"}\n', "stopped", "p")

"""`run_bench` on real converted data: the report records what, on what, where and how long; every
figure is consistent with the data and with the rounds it summarises; each mode is compared only with
baselines doing the same work. Runs are a second or so per measurement; no test asserts a speed."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys

import pytest

from dsbuild.bench import BenchOptions, BenchReport, run_bench
from dsbuild.bench.compare import applicable, choose
from dsbuild.bench.dataset import describe
from dsbuild.bench.peers import PEERS
from dsbuild.core.errors import UsageError
from tests.bench.conftest import BYTES, DEVICE, FRAMES, options
from tests.cli.clitools import env
from tests.helpers import index_rows


@pytest.fixture(scope="module")
def frames(bench_catalog):
    cat, _ = bench_catalog
    return run_bench(options(cat, split="main/train", **FRAMES))


@pytest.fixture(scope="module")
def peers(bench_catalog):
    missing = [why for peer in PEERS.values() if (why := peer.missing())]
    if missing:
        pytest.skip("; ".join(missing))
    cat, _ = bench_catalog
    # one round (one loader process) of each: what is checked is which baselines ran, and that each measured
    return run_bench(options(cat, **{**BYTES, "compare": None, "duration": 1.5, "rounds": 1}))


def positive(s) -> bool:
    return s is not None and 0 < s.min <= s.q1 <= s.median <= s.q3 <= s.max


def test_the_report_records_settings_dataset_machine_and_time(frames, bench_catalog):
    cat, vid = bench_catalog
    ds = frames.dataset
    train = list(index_rows(cat, vid))
    assert ds.version_id == vid and ds.split == "main/train" and 0 < ds.samples < len(train)
    assert ds.shard_format == "webdataset" and ds.resolutions and all("x" in r for r in ds.resolutions)
    assert (
        frames.options.resize == (32, 32)
        and frames.resolved.device == {"cpu": "cpu", "auto": "numpy"}[DEVICE]
        and frames.resolved.decoder == "pyav"
    )
    m = frames.machine
    assert m.cpu_count >= 1 and m.python and all(m.packages[p] for p in ("av", "dsbuild"))
    assert bool(m.packages["torch"]) == (DEVICE == "cpu")  # recorded where installed, None where not
    t = frames.time
    assert 1 <= t.rounds_done <= t.rounds_planned == 3 and t.startup_s > 0 and not t.interrupted
    assert BenchReport.from_json(json.loads(json.dumps(frames.to_json())), "report") == frames  # saved == read back


def test_frames_mode_is_compared_with_a_decode_loop_only(frames):
    assert [b.name for b in frames.baselines] == ["pyav"] and frames.unit == "frames/s"
    assert positive(frames.ours.figure) and frames.ours.figure == frames.ours.frames_per_s
    assert frames.ours.decoder_note == "pyav: requested"
    with pytest.raises(UsageError, match="not comparable with --decode frames"):
        choose(BenchOptions("x", compare=("raw",)), None, None)
    assert "raw" not in applicable(BenchOptions("x")) and "pyav" not in applicable(BenchOptions("x", decode="bytes"))
    assert "sha256" not in applicable(BenchOptions("x", decode="bytes", verify="none"))


def test_figures_agree_with_the_data_and_the_rounds(frames, bench_catalog):
    cat, vid = bench_catalog
    per_clip = [r["frames"] for r in index_rows(cat, vid)]
    ours = [m for m in frames.rounds if m.name == "ours"]
    pyav = [m for m in frames.rounds if m.name == "pyav"]
    assert len(ours) == len(pyav) == frames.time.rounds_done
    for m in ours:
        assert min(per_clip) <= m.frames / m.samples <= max(per_clip)  # whole clips, no padding counted
        assert m.points[-1][1:] == (m.samples, m.frames, m.bytes)  # the last sample is the total
    ratios = [a.frames / a.seconds / (b.frames / b.seconds) for a, b in zip(ours, pyav)]
    assert frames.baselines[0].ratio.median == pytest.approx(statistics.median(ratios))
    assert frames.ours.figure.median == pytest.approx(statistics.median(m.frames / m.seconds for m in ours))


def test_rounds_start_only_while_budget_is_left(frames):
    starts: dict[int, float] = {}
    for m in frames.rounds:
        starts[m.round] = min(starts.get(m.round, m.start_s), m.start_s)
    assert sorted(starts) == list(range(frames.time.rounds_done))
    assert all(s < frames.options.duration for s in starts.values())
    assert sum(m.seconds for m in frames.rounds) <= frames.time.measured_s + 1e-6
    assert [m.start_s for m in frames.rounds] == sorted(m.start_s for m in frames.rounds)


def test_training_loop_and_stages_add_up(frames):
    tr = frames.training
    assert tr.step.kind == "sleep" and tr.step.ms == 5 and tr.steps >= frames.time.rounds_done
    assert 0 <= tr.wait_fraction.min <= tr.wait_fraction.max <= 1 and tr.fed == (tr.wait_fraction.median < tr.fed_below)
    assert tr.gpu_idle_fraction is None and "CUDA" in tr.gpu_idle_reason and frames.waits_of == "per training step"
    assert len(frames.waits_ms) == tr.steps - frames.time.rounds_done  # a wait before every step but the first
    for phase in ("throughput", "training"):
        st = frames.stages[phase]
        assert sorted(st.workers) == ["dsbuild-load_0", "dsbuild-load_1"]
        assert st.decode > 0 and st.decode == pytest.approx(sum(w.decode for w in st.workers.values()))
        assert st.wait + st.h2d + st.step + st.other == pytest.approx(st.wall) or st.other == 0
        ends = 2 * frames.time.rounds_done  # a phase per round, each with a build straddling either end
        for w in st.workers.values():  # each thread's stages fit its wall time but for those builds (see
            busy = w.read + w.decode + w.collate  # bench.stages); a build there may take twice the mean
            assert w.wall >= st.wall and busy <= w.wall + ends * 2 * busy / max(1, w.batches)
            assert busy + w.idle == pytest.approx(max(w.wall, busy))
    assert frames.stages["training"].step > 0 and frames.stages["throughput"].step == 0


def test_the_html_page_says_whether_the_step_was_fed_as_the_text_report_does(frames):
    from dsbuild.bench.html import render
    from dsbuild.bench.tables import verdict

    word, sentence = verdict(frames)
    assert word == ("fed" if frames.training.fed else "starved")
    assert f"{frames.training.wait_fraction.median * 100:.1f}% of the time" in sentence
    assert f'<b style="color:#{"1a7f37" if word == "fed" else "cf222e"}">{word}</b>: {sentence}' in render(frames)


def test_bytes_mode_compares_with_reads_hashing_and_the_peer_loaders(peers):
    assert peers.unit == "MB/s"
    names = {b.name: b for b in peers.baselines}
    assert set(names) == {"raw", "sha256", "webdataset", "litdata", "mosaic"}
    for b in names.values():
        assert b.skipped is None and positive(b.figure) and positive(b.ratio), b.name
    assert names["litdata"].version and names["mosaic"].version and names["webdataset"].version
    assert names["raw"].version is None and "sha256" in names["sha256"].description
    assert peers.ours.frames_per_s is None and peers.ours.figure == peers.ours.mb_per_s


def test_what_cannot_run_is_skipped_with_the_reason_or_refused_when_asked_for(parquet_catalog):
    cat, _ = parquet_catalog
    rep = run_bench(BenchOptions(ref=str(cat), **{**BYTES, "compare": None, "duration": 0.5, "rounds": 1}))
    skipped = {b.name: b.skipped for b in rep.baselines if b.skipped}
    assert "parquet, not tar" in skipped["webdataset"] and {b.name for b in rep.baselines if b.ratio} >= {
        "raw",
        "sha256",
    }
    with pytest.raises(UsageError, match="--compare webdataset: the version's shards are parquet"):
        run_bench(BenchOptions(ref=str(cat), **{**BYTES, "compare": ("webdataset",)}))
    with pytest.raises(UsageError, match="unknown baseline 'tfrecord'"):
        choose(BenchOptions("x", decode="bytes", compare=("tfrecord",)), describe(str(cat), None), None)


def test_two_simulated_ranks_report_each_rank(bench_catalog):
    """One round of two ranks (two loader processes): per-rank figures taken per round instead of per rank
    would show one rank."""
    cat, vid = bench_catalog
    rep = run_bench(
        options(cat, **{**BYTES, "ranks": 2, "compare": ("raw",), "rounds": 1, "step_ms": 2, "duration": 1.5})
    )
    rk = rep.ranks
    assert rk.world_size == 2 and [r.rank for r in rk.per_rank] == [0, 1]
    assert all(positive(r.figure) and positive(r.first_batch_s) for r in rk.per_rank)
    medians = [r.figure.median for r in rk.per_rank]
    assert rk.skew == pytest.approx(min(medians) / max(medians)) and set(rk.stragglers) <= {0, 1}
    assert {w.split("/")[0] for w in rep.stages["throughput"].workers} == {"rank0", "rank1"}
    assert rep.dataset.version_id == vid and positive(rep.baselines[0].ratio)


def test_a_bytes_run_leaves_torch_to_its_loader_processes(bench_catalog):
    """The run's own process asks a process of its fork server (which has imported torch) whether CUDA is
    there, so a bytes run against reads and hashing never imports torch itself (1.5 s of CPU a command)."""
    pytest.importorskip("torch")
    cat, _ = bench_catalog
    code = (
        "import sys; from dsbuild.bench import BenchOptions, run_bench; "
        f"r = run_bench(BenchOptions(ref={str(cat)!r}, decode='bytes', device='auto', duration=0.5, rounds=1, "
        "compare=('raw',), step_ms=0)); print(r.resolved.device, r.ours.figure.median > 0, 'torch' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["cpu", "True", "False"]


def test_options_refuse_bad_values():
    for bad in (
        {"decode": "pixels"},
        {"device": "tpu"},
        {"verify": "some"},
        {"batch_size": 0},
        {"duration": 0},
        {"threads": 0},
        {"resize": (0, 3)},
        {"decode_backend": "gpu"},
    ):
        with pytest.raises(UsageError):
            BenchOptions(ref="x", **bad)
    assert "ref" not in BenchOptions("x").settings() and "duration" not in BenchOptions("x").settings()
    assert dataclasses.replace(BenchOptions("a"), ref="b").settings() == BenchOptions("a").settings()


def test_epochs_too_short_for_the_threads_are_named(frames, bench_catalog):
    from dsbuild.bench.harness import SHORT_EPOCH, loader_kwargs, short_epochs
    from dsbuild.loader import Loader

    cat, _ = bench_catalog
    per_epoch = len(Loader(str(cat), "main/train", **loader_kwargs(frames.options, None, None, 0, 1)))
    assert per_epoch < SHORT_EPOCH * frames.options.threads  # this small set is such a case
    assert [n for n in frames.ours.notes if " per epoch for " in n] == short_epochs(per_epoch, frames.options.threads)
    assert short_epochs(8, 2) == [] and short_epochs(1, 2)[0].startswith("1 batch per epoch for 2 threads: ")


def test_a_window_that_start_up_left_too_short_is_named():
    from dsbuild.bench.harness import SHORT_WINDOW, short_window

    assert short_window(SHORT_WINDOW * 10, 10) == [] and short_window(3, 3) == []
    (note,) = short_window(0.4, 3.3)
    assert note.startswith("throughput measured over 0.4 s of a 3.3 s slice") and "--duration" in note

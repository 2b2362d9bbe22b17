"""`dsbuild bench --ranks N [--parallel ...]`: the per-rank frame spread with and without ``balance`` in one run (issue 40),
in the text, JSON and HTML reports, through the real executable on the loader's mixed-length catalog; and its pure summary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsbuild.bench.balance import rank_work
from dsbuild.bench.tables import num
from dsbuild.loader import Loader, Parallel
from dsbuild.loader.parallel import straggler
from tests.cli.clitools import run


def test_straggler_cost_is_the_busiest_rank_s_time_beyond_an_even_split():
    s = straggler(np.array([[30, 60], [45, 45]]))
    assert (s["min"], s["max"], s["max_over_min"]) == (37.5, 52.5, 1.5)
    assert s["max_over_mean"] == pytest.approx((60 / 45 + 1) / 2) and s["straggler_cost"] == pytest.approx(105 / 90 - 1)
    assert straggler(np.array([[0, 10]]))["max_over_min"] is None


def test_the_spread_is_over_data_parallel_ranks_of_the_layout(cat):
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 3, "world_size": 8, "rank": 5}
    plain = rank_work(Loader(ref, parallel=Parallel(tp=2, cp=2), **kw))
    assert plain is not None and plain.dp == 2 and plain.balanced is not None
    assert plain == rank_work(Loader(ref, parallel=Parallel(tp=4), **kw))  # (any rank: the same figures)
    assert rank_work(Loader(ref, parallel=Parallel(tp=8), **kw)) is None  # one data-parallel rank


def test_bench_shows_the_per_rank_spread_as_drawn_and_balanced(cat, tmp_path):
    ref, _ = cat
    args = ["--ranks", "2", "--batch-size", "3", "--decode", "bytes", "--step-ms", "0"]
    p = run(
        "bench", ref, *args, "--duration", "1", "--rounds", "1", "--compare", "none",
        "--save", tmp_path / "r.json", "--html", tmp_path / "r.html",
    )  # fmt: skip
    work = json.loads((tmp_path / "r.json").read_text())["rank_work"]
    assert work["dp"] == 2 and work["unit"] == "frames" and work["steps"] >= 1
    drawn, balanced = work["drawn"], work["balanced"]
    assert balanced["straggler_cost"] < drawn["straggler_cost"] and balanced["max"] <= drawn["max"]
    assert "frames per data-parallel rank per step, 2 ranks" in p.stdout
    assert f"+{100 * balanced['straggler_cost']:.1f}%" in p.stdout and 'balance="frames"' in p.stdout
    page = (tmp_path / "r.html").read_text()  # the same table on the page, and the two deals drawn
    assert "<h2>Work per data-parallel rank</h2>" in page and 'aria-label="work per data-parallel rank"' in page
    assert f"<td>+{100 * balanced['straggler_cost']:.1f}%</td>" in page and "balance=&quot;frames&quot;" in page
    assert f"<title>busiest rank: {num(drawn['max'])} frames</title>" in page

"""How often does `dsbuild bench history` cry wolf? Repeated `bench --model` runs of one config, nothing
changed between them, judged by the history's rule (``dsbuild.bench.train.history``).

    .venv/bin/python benchmarks/bench_history_false_alarms.py [--runs 8] [--ref REF] [--work DIR]
        [--orderings 500] [--model tiny] [--ranks 1]

Runs the real command ``--runs`` times with ``--history`` (``--runs 0`` with ``--work`` judges the history
already there). Then, as ``bench_false_alarms.py`` judges every
ordered pair of saved runs, it judges ``--orderings`` random orderings of the runs: the last run of an
ordering against the trailing runs before it (up to the rule's window), every figure, by the rule as CI
uses it (exit 1 on any figure). A call on unchanged runs is a false alarm. Its power: the same orderings
with the last run's rounds made 1.2x and 1.5x worse (step times longer, MFU and clips/s lower). Without
``--ref`` it makes a catalog first (6 synthetic sessions of 6 s, 3 s clips). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsbuild.bench.train.history import WINDOW, judge, read

WORSE = (1.2, 1.5)


def make_catalog(work: Path) -> str:
    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.core.executor import ExecutorSpec
    from dsbuild.samples.synthetic import generate

    generate(work / "caps", sessions=6, seconds=6.0, seed=11)
    convert(
        work / "caps",
        work / "cat",
        ConvertConfig(format="webdataset", clip_seconds=3.0),
        executor=ExecutorSpec(workers=1),
    )
    return str(work / "cat")


def worse(rows: list[dict], factor: float) -> list[dict]:
    out = []
    for r in rows:
        scale = factor if r["better"] == "lower" else 1 / factor
        out.append({**r, "rounds": [v * scale for v in r["rounds"]]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--orderings", type=int, default=500)
    ap.add_argument("--ref")
    ap.add_argument("--work")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", default="1")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="history-fa-"))
    ref = args.ref or make_catalog(work)
    history = work / "history"
    cmd = [
        str(Path(sys.executable).parent / "dsbuild"),
        "bench",
        ref,
        "--model",
        args.model,
        "--ranks",
        args.ranks,
        "--resize",
        "32x32",
        "--clip-frames",
        "4",
        "--batch-size",
        "2",
        "--steps",
        "5",
        "--history",
        str(history),
        "--quiet",
    ]
    for i in range(args.runs):
        subprocess.run(cmd, check=True)
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    rows = read(str(history))
    runs: dict[str, list[dict]] = {}
    for r in rows:
        runs.setdefault(r["run_id"], []).append(r)
    ids = sorted(runs)
    rng = random.Random(0)
    calls = {1.0: 0, **dict.fromkeys(WORSE, 0)}
    figures: dict[str, int] = {}
    for _ in range(args.orderings):
        order = rng.sample(ids, k=min(len(ids), WINDOW + 1))
        last = order[-1]
        for factor in calls:
            history_rows = [
                {**r, "started_at": f"{i:04d}"}
                for i, rid in enumerate(order)
                for r in (runs[rid] if rid != last or factor == 1.0 else worse(runs[rid], factor))
            ]
            judged = judge(history_rows)
            bad = [j for j in judged if j.regressed]
            calls[factor] += bool(bad)
            if factor == 1.0:
                for j in bad:
                    figures[j.figure] = figures.get(j.figure, 0) + 1
    n = args.orderings
    print(f"\n{len(ids)} runs of `{' '.join(cmd[1:])}`, {n} orderings of {min(len(ids), WINDOW + 1)} runs\n")
    print("| last run | runs called regressed |")
    print("|---|---|")
    print(f"| unchanged (false alarms) | {calls[1.0]}/{n} = {calls[1.0] / n:.3f} |")
    for f in WORSE:
        print(f"| {f}x worse (power) | {calls[f]}/{n} = {calls[f] / n:.3f} |")
    if figures:
        print("\nfalse alarms by figure: " + ", ".join(f"{k} {v}" for k, v in sorted(figures.items())))


if __name__ == "__main__":
    main()

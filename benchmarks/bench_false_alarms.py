"""How often does the `dsbuild bench` gate cry wolf? Repeated runs of one config, nothing changed between them.

    .venv/bin/python benchmarks/bench_false_alarms.py [--runs 20] [--duration S] [--ref REF] [--work DIR]
        [--config frames|bytes ...]

Without ``--ref`` it makes a catalog first (8 synthetic sessions of 20 s, 4 s clips: the demo's shape). Per
config it runs the real command ``--runs`` times: run 1 with ``--save``, runs 2..N with ``--baseline`` run 1
(each exit 1 is a false alarm of the gate as CI uses it). Then every ordered pair of the saved reports is
judged in-process (N x (N-1) comparisons): by the gate (ours dropped against every baseline, a drop being
below --fail-below x saved *and* beyond the larger IQR of the two runs), and for comparison by "any one
ratio dropped" and by medians alone (any ratio below --fail-below x saved). Its power: the same pairs with
the current run's ratios scaled as for a 0.8x and a 0.5x slower loader. Prints a markdown table and the
command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsbuild.bench import Against, load_report
from dsbuild.bench.gate import decide

# (flags, seconds): the rest at the defaults (5 rounds, 2 threads, 50 ms step, verify sample). Frames of 4 s
# clips at up to 640x360 decode in ~0.5 s per batch of 4 per thread: 20 s hold 5 rounds of 3 measurements.
CONFIGS = {
    "frames": (["--resize", "64x64", "--batch-size", "4"], 20.0),  # against the bare PyAV loop
    "bytes": (["--decode", "bytes", "--step-ms", "0"], 10.0),  # raw, sha256, webdataset, LitData, Mosaic
}
FAIL_BELOW = 0.9
SLOWDOWNS = (0.8, 0.5)  # simulated slower loaders: how often the gate catches them (its power)
SCALED = ("median", "q1", "q3", "min", "max")


def dsbuild(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from dsbuild.cli.app import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
    )


def make_catalog(work: Path) -> str:
    caps, cat = work / "captures", work / "catalog"
    if not cat.exists():
        shutil.rmtree(caps, ignore_errors=True)  # `samples` refuses a folder that holds something
        for args in (
            ("samples", caps, "--sessions", 8, "--seconds", 20, "--seed", 7, "--quiet"),
            ("convert", caps, cat, "--clip-seconds", 4, "--quiet"),
        ):
            p = dsbuild(*args)
            if p.returncode:
                sys.exit(p.stderr)
    return str(cat)


def slower(report, k: float):
    """The report as if our loader had been ``k`` times as fast: every per-round ratio scaled by k."""
    return dataclasses.replace(
        report,
        baselines=tuple(
            dataclasses.replace(b, ratio=dataclasses.replace(b.ratio, **{f: getattr(b.ratio, f) * k for f in SCALED}))
            if b.ratio
            else b
            for b in report.baselines
        ),
    )


def rules(saved, now) -> dict[str, bool]:
    """Each rule's verdict for one ordered pair: the gate (ours dropped against every baseline), the rule
    that fires on any one ratio, and medians alone (any ratio's median below FAIL_BELOW x saved)."""
    verdicts = Against(saved, "saved", FAIL_BELOW).judge(now, ()).verdicts
    return {
        "gate": decide(verdicts),
        "any": any(v.dropped for v in verdicts),
        "medians": any(v.now.median < FAIL_BELOW * v.saved.median for v in verdicts),
    }


def measure(ref: str, name: str, runs: int, duration: float | None, work: Path) -> dict:
    duration = duration or CONFIGS[name][1]
    flags = [*CONFIGS[name][0], "--duration", duration]
    files, codes, walls = [], [], []
    for i in range(runs):
        out = work / f"{name}-{i:02d}.json"
        gate = ["--baseline", files[0]] if files else []
        t0 = time.monotonic()
        p = dsbuild("bench", ref, *flags, *gate, "--save", out, "--quiet")
        walls.append(time.monotonic() - t0)
        if p.returncode not in (0, 1):
            sys.exit(f"run {i}: exit {p.returncode}: {p.stderr}")
        codes.append(p.returncode)
        files.append(out)
        print(f"{name} run {i + 1}/{runs}: exit {p.returncode}", file=sys.stderr)
    reports = [load_report(f) for f in files]
    pairs = [(a, b) for i, a in enumerate(reports) for j, b in enumerate(reports) if i != j]
    alarms = {k: sum(rules(a, b)[k] for a, b in pairs) for k in ("gate", "any", "medians")}
    caught = {k: sum(rules(a, slower(b, k))["gate"] for a, b in pairs) for k in SLOWDOWNS}
    ratios = {b.name: [] for b in reports[0].baselines if b.ratio}
    for r in reports:
        for b in r.baselines:
            if b.ratio and b.name in ratios:
                ratios[b.name].append(b.ratio.median)
    return {
        "flags": " ".join(map(str, flags)),
        "gated": runs - 1,
        "cli_alarms": sum(codes[1:]),
        "pairs": len(pairs),
        "alarms": alarms,
        "caught": caught,
        "ratios": ratios,
        "rounds": [r.time.rounds_done for r in reports],
        "measured": [r.time.measured_s for r in reports],
        "wall": walls,
        "duration": duration,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--duration", type=float, default=None, help="seconds per run (default: per config)")
    ap.add_argument("--ref", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS))
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="dsbuild-false-alarms-"))
    work.mkdir(parents=True, exist_ok=True)
    ref = a.ref or make_catalog(work)
    lines = [
        f"command: {' '.join(sys.argv)}",
        f"catalog: {ref}",
        "",
        "| config | gated CLI runs that exited 1 | pairs judged | false alarms: the gate (every reference) | "
        "any one ratio dropped | medians only | a 0.8x slower loader caught | 0.5x caught | rounds done | "
        "measured s (budget) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for name in a.config or ["frames", "bytes"]:
        r = measure(ref, name, a.runs, a.duration, work)
        n = r["pairs"]
        share = lambda x, n=n: f"{x} ({x / n:.1%})"  # noqa: E731
        lines.append(
            f"| `{r['flags']}` | {r['cli_alarms']} of {r['gated']} | {n} | {share(r['alarms']['gate'])} | "
            f"{share(r['alarms']['any'])} | {share(r['alarms']['medians'])} | {share(r['caught'][0.8])} | "
            f"{share(r['caught'][0.5])} | {min(r['rounds'])}-{max(r['rounds'])} | "
            f"{min(r['measured']):.1f}-{max(r['measured']):.1f} ({r['duration']:g}) |"
        )
        for base, values in r["ratios"].items():
            details.append(
                f"- {name}, ours / {base}: per-run medians {min(values):.3g}-{max(values):.3g} "
                f"(spread {max(values) / min(values) - 1:.0%})"
            )
        details.append(f"- {name}: command wall time {min(r['wall']):.1f}-{max(r['wall']):.1f} s per run")
    print("\n".join(lines + [""] + details))
    (work / "summary.json").write_text(json.dumps({"lines": lines, "details": details}, indent=1))


if __name__ == "__main__":
    main()

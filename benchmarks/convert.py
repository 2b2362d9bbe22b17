"""Convert throughput against the floor of the same work without our logic, measured in one run.

    .venv/bin/python benchmarks/convert.py [--out bench-out/convert] [--rounds 3]

Generates (once, cached) >= 200 MB of 720p30 H.264 captures with grain, then per round, interleaved:
  floor : read every source byte + sha256 + write a copy (one process)
  w1    : dsbuild convert --workers 1   (timed inside convert; interpreter start reported separately)
  w2    : dsbuild convert --workers 2
Reports medians, ratios (w1/floor, w2/w1) and peak RSS of each convert (bounded by shard size, not data).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.samples.synthetic import generate, session_spec  # noqa: E402
from dsbuild.samples.writer import VideoSpec  # noqa: E402

SESSIONS, SECONDS = 8, 6.0


def make_captures(root: Path) -> int:
    marker = root / ".complete"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        specs = [dataclasses.replace(session_spec(9, i, SECONDS), video=VideoSpec(1280, 720, 30, 60))
                 for i in range(SESSIONS)]
        generate(root, sessions=SESSIONS, seconds=SECONDS, seed=9, specs=specs, noise=40)
        marker.touch()
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def floor(src: Path, dst: Path) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    t = time.perf_counter()
    for i, p in enumerate(sorted(x for x in src.rglob("*") if x.is_file())):
        h = hashlib.sha256()
        with open(p, "rb") as f, open(dst / f"{i}", "wb") as out:
            while chunk := f.read(4 << 20):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    return time.perf_counter() - t


def run_convert(src: Path, out: Path, workers: int) -> tuple[float, float, int, dict]:
    """(seconds inside convert, wall seconds incl. interpreter start, peak RSS of the tree, result)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-c", "from dsbuild.cli.app import main; main()", "convert", str(src), str(out),
           "--workers", str(workers), "--clip-seconds", "2", "--json"]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"convert failed with status {status}")
    result = json.loads(stdout)
    return result["seconds"], elapsed, usage.ru_maxrss * 1024, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "convert"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    src = out / "captures"
    total = make_captures(src)
    times = {"floor": [], "w1": [], "w2": []}
    wall = {"w1": [], "w2": []}
    rss = {"w1": 0, "w2": 0}
    result = {}
    for _ in range(args.rounds):
        times["floor"].append(floor(src, out / "copy"))
        for w in (1, 2):
            inside, elapsed, peak, result = run_convert(src, out / f"catalog-w{w}", w)
            times[f"w{w}"].append(inside)
            wall[f"w{w}"].append(elapsed)
            rss[f"w{w}"] = max(rss[f"w{w}"], peak)
    med = {k: statistics.median(v) for k, v in times.items()}
    mbps = {k: total / v / 1e6 for k, v in med.items()}
    report = {
        "input_bytes": total, "rounds": args.rounds, "samples": result["samples"], "shards": result["shards"],
        "seconds_median": med, "seconds_all": times, "mb_per_s": mbps,
        "wall_with_interpreter_start_median": {k: statistics.median(v) for k, v in wall.items()},
        "ratio_w1_over_floor": mbps["w1"] / mbps["floor"], "ratio_w2_over_floor": mbps["w2"] / mbps["floor"],
        "speedup_w2_over_w1": med["w1"] / med["w2"], "peak_rss_bytes": rss, "cores": os.cpu_count(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Peak disk use of `dsbuild convert` against the version it writes, as a whole command.

    .venv/bin/python benchmarks/convert_disk.py [--sets small,720p] [--shard-size 16MB] [--out bench-out/convert]

The capture sets are benchmarks/convert.py's (made there). While the command runs, the catalog folder's
bytes are summed every 20 ms (its staging folder included); reported: the peak, the finished catalog,
and their ratio — what free space a convert needs beyond the version it makes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import DSBUILD, SETS, make_captures  # noqa: E402


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # (moved or removed while walked)
                pass
    return total


def peak_of(captures: Path, out: Path, clip: float, shard_size: str) -> tuple[int, int, float]:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [
            DSBUILD,
            "convert",
            str(captures),
            str(out),
            "--clip-seconds",
            str(clip),
            "--shard-size",
            shard_size,
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_bytes(out))
        time.sleep(0.02)
    if proc.returncode:
        raise SystemExit(f"convert failed ({proc.returncode})")
    return peak, tree_bytes(out), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "convert"))
    ap.add_argument("--sets", default="small,720p")
    ap.add_argument("--shard-size", default="16MB")
    args = ap.parse_args()
    out, results = Path(args.out), {}
    for name in args.sets.split(","):
        if not make_captures(out / name / "captures", name):
            continue
        peak, final, seconds = peak_of(
            out / name / "captures", out / name / "disk-catalog", SETS[name], args.shard_size
        )
        results[name] = {
            "peak_bytes": peak,
            "catalog_bytes": final,
            "peak_over_catalog": round(peak / final, 3),
            "seconds": round(seconds, 2),
        }
        shutil.rmtree(out / name / "disk-catalog", ignore_errors=True)
    print(
        json.dumps(
            {
                "shard_size": args.shard_size,
                "sets": results,
                "command": "benchmarks/convert_disk.py " + " ".join(sys.argv[1:]),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

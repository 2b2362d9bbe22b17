"""Ray executor overhead on one machine: convert with --executor ray (2 local CPUs) vs local --workers 2,
same captures (the 244 MB set of benchmarks/convert.py), interleaved rounds, medians.

    .venv/bin/python benchmarks/ray_convert.py [--rounds 5]

Ray is started once (as a user's cluster would already be running); its start-up time is reported
separately. Both executors must produce the same version id.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import make_captures  # noqa: E402

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.core.executor import ExecutorSpec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "convert"))
    args = ap.parse_args()
    out = Path(args.out)
    src = out / "720p" / "captures"  # the convert benchmark's 720p set
    make_captures(src, "720p")
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.name.startswith("."))
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup = time.perf_counter() - t
    config = ConvertConfig(clip_seconds=2.0)
    times = {"local": [], "ray": []}
    ids = set()
    for _ in range(args.rounds):
        for ex in ("local", "ray"):
            cat = out / f"catalog-{ex}"
            shutil.rmtree(cat, ignore_errors=True)
            t = time.perf_counter()
            r = convert(src, cat, config, executor=ExecutorSpec(kind=ex, workers=2))
            times[ex].append(time.perf_counter() - t)
            ids.add(r.version_id)
    ray.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "input_bytes": total,
                "rounds": args.rounds,
                "ray_startup_s": startup,
                "seconds_median": med,
                "seconds_all": times,
                "mb_per_s": {k: total / v / 1e6 for k, v in med.items()},
                "ratio_ray_over_local_w2": med["local"] / med["ray"],
                "same_version_id": len(ids) == 1,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

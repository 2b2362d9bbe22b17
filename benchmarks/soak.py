"""Soak: many more faults and hostile inputs than `make test` runs, with a tally for docs/reliability.md.

    .venv/bin/python benchmarks/soak.py [--kills 200] [--damaged 200] [--out bench-out/soak]

1. kill -9 of `dsbuild convert` at seeded random moments; after each: no partial version listed, every
   listed version verifies; finally a re-run must give the clean version id.
2. every damage kind of the sample generator, many seeds: convert must finish, quarantine or repair.
3. loader bit flips: a random byte of a random shard flipped; the loader must finish the epoch with every
   other sample delivered exactly once and the damaged one counted.
Prints JSON: faults injected, bad inputs tried, versions checked, data lost (must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.core.errors import DsbuildError  # noqa: E402
from dsbuild.lineage.catalog import Catalog  # noqa: E402
from dsbuild.lineage.verify import verify  # noqa: E402
from dsbuild.loader import Loader  # noqa: E402
from dsbuild.samples.synthetic import DAMAGE, generate  # noqa: E402

CLI = [sys.executable, "-c", "from dsbuild.cli.app import main; main()"]
ARGS = ["--clip-seconds", "1", "--shard-size", "300000"]


def kills(caps: Path, out: Path, n: int, rng: random.Random) -> dict:
    t = time.monotonic()
    clean = json.loads(subprocess.run(CLI + ["convert", str(caps), str(out / "clean"), *ARGS, "--json"],
                                      capture_output=True, text=True, check=True).stdout)["version_id"]
    duration = time.monotonic() - t
    cat, interrupted, checked, bad = out / "killed", 0, 0, 0
    for _ in range(n):
        if (cat / "catalog.json").exists() and Catalog.open(cat).versions():
            shutil.rmtree(cat)
        p = subprocess.Popen(CLI + ["convert", str(caps), str(cat), *ARGS, "--workers", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0, duration))
        if p.poll() is None:
            interrupted += 1
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        if (cat / "catalog.json").exists():
            for v in Catalog.open(cat).versions():
                checked += 1
                bad += v.version_id != clean or not verify(Catalog.open(cat), v.version_id).ok
    final = json.loads(subprocess.run(CLI + ["convert", str(caps), str(cat), *ARGS, "--json"],
                                      capture_output=True, text=True, check=True).stdout)["version_id"]
    return {"kills": n, "interrupted": interrupted, "versions_checked": checked, "bad_versions": bad,
            "rerun_matches_clean": final == clean}


def damaged(out: Path, n: int, rng: random.Random) -> dict:
    tried = crashed = refused = 0
    for i in range(n):
        kind = DAMAGE[i % len(DAMAGE)]
        caps = out / f"damaged-{i}"
        generate(caps, sessions=2, seconds=2, seed=rng.randrange(1 << 30), damage={1: kind})
        tried += 1
        try:
            convert(caps, out / f"damaged-cat-{i}", ConvertConfig(clip_seconds=1.0), workers=1)
        except DsbuildError:
            refused += 1  # e.g. both holders of a duplicated id quarantined: nothing left, a clear exit 1
        except Exception as e:  # noqa: BLE001 - a soak counts every escape
            crashed += 1
            print(f"{kind}: {type(e).__name__}: {e}", file=sys.stderr)
        shutil.rmtree(caps, ignore_errors=True)
        shutil.rmtree(out / f"damaged-cat-{i}", ignore_errors=True)
    return {"damaged_captures": tried, "refused_with_clear_error": refused, "escaped_errors": crashed}


def flips(caps: Path, out: Path, n: int, rng: random.Random) -> dict:
    lost = 0
    for i in range(n):
        cat = out / f"flip-{i}"
        r = convert(caps, cat, ConvertConfig(clip_seconds=1.0), workers=1)
        m = Catalog.open(cat).manifest(r.version_id)
        shard = cat / rng.choice(m.shards).path
        data = bytearray(shard.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        loader = Loader(str(cat), decode="bytes", batch_size=4, seed=i)
        keys = [k for b in loader for k in b["keys"]]
        lost += len(keys) != r.samples or len(set(keys)) + loader.stats()["corrupt"] < r.samples
        shutil.rmtree(cat)
    return {"bit_flips": n, "epochs_with_lost_or_repeated_samples": lost}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--damaged", type=int, default=200)
    ap.add_argument("--flips", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "soak"))
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(7)
    caps = out / "captures"
    generate(caps, sessions=6, seconds=6, seed=11)
    report = {**kills(caps, out, args.kills, rng), **damaged(out, args.damaged, rng), **flips(caps, out, args.flips, rng)}
    report["data_lost"] = report["bad_versions"] + report["epochs_with_lost_or_repeated_samples"] + (
        0 if report["rerun_matches_clean"] else 1) + report["escaped_errors"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

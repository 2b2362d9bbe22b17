"""Catalog commands against their floors, as users run them, in one run.

    .venv/bin/python benchmarks/catalog.py [--rounds 5] [--sets 720p,small] [--big bench-out/scale/catalog]
                                           [--also CATALOG,...]

verify : `dsbuild verify CATALOG` (a whole command: start-up, manifest, index framing, every shard
         proven by its recorded BLAKE3) against the floor: hashlib sha256 of the same shard files in one
         thread per core, in-process (no start-up at all); also reported: the bare `blake3` library over
         the same files on every core, in-process (the hash verify uses). Catalogs: the sets of
         benchmarks/convert.py (built if missing), and any given with --also (e.g. the 983 MB catalog B
         of benchmarks/validate.py, to see the ratio once start-up is not most of the command).
query  : `dsbuild query` (a GROUP BY over the index) against the same SQL in bare duckdb on the
         version's index.parquet, both as commands; on --big (the 10,000-session catalog of
         benchmarks/scale.py) when it exists, else on the small set.
missing: `dsbuild verify` of a copy of --big whose shard files are all gone: every row reports its
         missing shard, in time linear in the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import DSBUILD, SETS, as_installed, make_captures  # noqa: E402

SQL = "select title, count(*) as clips, sum(frames) as frames, avg(action_events) as events from samples group by title"


def command(*args: str, ok: tuple[int, ...] = (0,)) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(list(args), capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return wall, proc


def sha256_floor(files: list[Path], threads: int) -> float:
    from dsbuild.core.hashing import sha256_file  # hashlib over 4 MiB reads, nothing else

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(sha256_file, files))
    return time.perf_counter() - t


def catalog_of(out: Path, name: str) -> Path:
    cat = out / name / "catalog"
    if not (cat / "catalog.json").exists():
        src = out / name / "captures"
        if not make_captures(src, name):
            raise SystemExit(f"cannot build the {name} set here")
        command(DSBUILD, "convert", str(src), str(cat), "--clip-seconds", str(SETS[name]), "-q")
    return cat


def blake3_floor(files: list[Path]) -> float:
    from blake3 import blake3

    t = time.perf_counter()
    for p in files:
        blake3(max_threads=blake3.AUTO).update_mmap(p).hexdigest()
    return time.perf_counter() - t


def shard_files(cat: Path) -> list[Path]:
    _, proc = command(DSBUILD, "shards", str(cat), "--json")
    doc = json.loads(proc.stdout)
    return [Path(s["path"]) for s in doc["shards"]]


def verify_vs_floor(cat: Path, rounds: int, threads: int) -> dict:
    files = shard_files(cat)
    size = sum(p.stat().st_size for p in files)
    floor, b3, verify = [], [], []
    for _ in range(rounds):
        floor.append(sha256_floor(files, threads))
        b3.append(blake3_floor(files))
        verify.append(command(DSBUILD, "verify", str(cat), "--json")[0])
    med_f, med_b, med_v = statistics.median(floor), statistics.median(b3), statistics.median(verify)
    return {
        "shards": len(files),
        "shard_bytes": size,
        "floor_seconds": med_f,
        "verify_seconds": med_v,
        "ratio_verify_over_floor": med_f / med_v,
        "blake3_floor_seconds": med_b,
        "all": {"floor": floor, "blake3_floor": b3, "verify": verify},
    }


def index_of(cat: Path) -> Path:
    _, proc = command(DSBUILD, "log", str(cat), "--json")
    vid = json.loads(proc.stdout)["versions"][0]["version_id"]
    return cat / "versions" / vid / "index.parquet"


def query_vs_duckdb(cat: Path, rounds: int) -> dict:
    bare = (
        f"import duckdb; duckdb.sql(\"create view samples as select * from read_parquet('{index_of(cat)}')\"); "
        f"print(duckdb.sql({SQL!r}).fetchall())"
    )
    ours, theirs = [], []
    for _ in range(rounds):
        theirs.append(command(sys.executable, "-c", bare)[0])
        ours.append(command(DSBUILD, "query", str(cat), SQL, "--json")[0])
    info = json.loads(command(DSBUILD, "info", str(cat), "--json")[1].stdout)
    return {
        "catalog": str(cat),
        "samples": info["stats"]["samples"],
        "query_seconds": statistics.median(ours),
        "bare_duckdb_command_seconds": statistics.median(theirs),
        "all": {"query": ours, "duckdb": theirs},
    }


def verify_missing(cat: Path, out: Path) -> dict:
    copy = out / "missing-shards"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(cat, copy, ignore=lambda d, names: ["shards"] if Path(d) == cat else [])
    wall, proc = command(DSBUILD, "verify", str(copy), "--json", ok=(1,))
    problems = len(json.loads(proc.stdout)["problems"])
    shutil.rmtree(copy)
    return {"catalog": str(cat), "seconds": wall, "problems_reported": problems}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sets", default="720p,small")
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "convert"))
    ap.add_argument("--big", default=str(ROOT / "bench-out" / "scale" / "catalog"))
    ap.add_argument("--also", default="", help="more catalogs to verify, comma-separated")
    args = ap.parse_args()
    as_installed()
    out, threads = Path(args.out), os.cpu_count() or 1
    report: dict = {"cores": threads, "rounds": args.rounds, "verify": {}}
    for name in args.sets.split(","):
        report["verify"][name] = verify_vs_floor(catalog_of(out, name), args.rounds, threads)
    for path in filter(None, args.also.split(",")):
        report["verify"][path] = verify_vs_floor(Path(path), args.rounds, threads)
    big = Path(args.big)
    big = big if (big / "catalog.json").exists() else catalog_of(out, "small")
    report["query"] = query_vs_duckdb(big, args.rounds)
    report["verify_all_shards_missing"] = verify_missing(big, out)
    report["command"] = "benchmarks/catalog.py " + " ".join(sys.argv[1:])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

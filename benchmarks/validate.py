"""Validation cost against the floor of the same work without our logic, measured in one run.

    .venv/bin/python benchmarks/validate.py [--out bench-out/validate] [--rounds 3] [--workers 2]

Generates (once, cached) 720p30 H.264 captures with grain and converts them to WebDataset shards; then
per round, interleaved, all from the page cache (a warm-up read comes first):
  sha256      : sha256 over every shard's bytes (one thread)                    floor of --level structural
  structural  : validate --level structural --workers W (library call)
  decode      : a plain PyAV loop decoding every clip's frames, W processes        floor of --level full
  full        : validate --level full --workers W (library call; includes the structural work)
Both decoders use thread_type AUTO. Prints medians and the ratios full/decode and structural/sha256 (of the
medians, and the median of per-round ratios). Versions under 1 GB validate structurally in one process
(run.POOL_MIN), so --workers only matters for the decode half at this size.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import make_captures  # noqa: E402

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.formats.sample import VIDEO_EXTS  # noqa: E402
from dsbuild.formats.webdataset import BLOCK, parse_members  # noqa: E402
from dsbuild.lineage.catalog import Catalog  # noqa: E402
from dsbuild.lineage.index import read_index  # noqa: E402
from dsbuild.validators import ValidateOptions, validate  # noqa: E402

def make_catalog(out: Path) -> tuple[Path, str]:
    """The 245 MB capture set of benchmarks/convert.py (shared), converted once into ``out``."""
    cat = out / "catalog"
    if not (cat / "catalog.json").exists():
        caps = ROOT / "bench-out" / "convert" / "captures"
        make_captures(caps)
        shutil.rmtree(cat, ignore_errors=True)
        convert(caps, cat, ConvertConfig(format="webdataset", clip_seconds=2.0), workers=2)
    return cat, Catalog.open(cat).resolve(None)


def clip_ranges(cat: Path, vid: str) -> list[tuple[str, int, int]]:
    """(shard path, byte offset, length) of every clip's video payload (located once, outside the timing)."""
    c = Catalog.open(cat)
    rows = read_index(c.version_dir(vid) / "index.parquet").to_pylist()
    out = []
    for r in rows:
        with open(cat / r["shard"], "rb") as f:
            f.seek(r["offset"])
            buf = f.read(r["length"])
        pos = 0
        for name, payload in parse_members(buf, key=r["key"]):  # one 512-byte USTAR header per member
            start = pos + BLOCK
            if name.split(".", 1)[1] in VIDEO_EXTS:
                out.append((str(cat / r["shard"]), r["offset"] + start, len(payload)))
            pos = start + len(payload) + (-len(payload) % BLOCK)
    return out


def decode_clips(ranges: list[tuple[str, int, int]]) -> int:
    import av

    frames = 0
    for path, offset, length in ranges:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            for _ in c.decode(s):
                frames += 1
    return frames


def decode_floor(ranges: list, workers: int) -> tuple[float, int]:
    t = time.perf_counter()
    chunks = [ranges[i::workers * 4] for i in range(workers * 4)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        frames = sum(pool.map(decode_clips, chunks))
    return time.perf_counter() - t, frames


def sha256_floor(shards: list[Path]) -> float:
    t = time.perf_counter()
    for p in shards:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(4 << 20):
                h.update(chunk)
    return time.perf_counter() - t


def run_validate(cat: Path, vid: str, level: str, workers: int) -> tuple[float, dict]:
    t = time.perf_counter()
    report = validate(cat, vid, options=ValidateOptions(level=level, workers=workers))
    elapsed = time.perf_counter() - t
    if not report.accepted:
        raise SystemExit(f"the benchmark version was rejected: {[c.name for c in report.checks if c.failed]}")
    return elapsed, report.summary


def _ratio(a: list[float], b: list[float]) -> float:
    return round(statistics.median(x / y for x, y in zip(a, b)), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "validate"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cat, vid = make_catalog(Path(args.out))
    m = Catalog.open(cat).manifest(vid)
    shards = [cat / s.path for s in m.shards]
    total = sum(s.bytes for s in m.shards)
    ranges = clip_ranges(cat, vid)
    sha256_floor(shards)  # warm the page cache
    times: dict[str, list[float]] = {"sha256": [], "structural": [], "decode": [], "full": []}
    frames = decoded = 0
    for _ in range(args.rounds):
        times["sha256"].append(sha256_floor(shards))
        times["structural"].append(run_validate(cat, vid, "structural", args.workers)[0])
        t, frames = decode_floor(ranges, args.workers)
        times["decode"].append(t)
        t, summary = run_validate(cat, vid, "full", args.workers)
        times["full"].append(t)
        decoded = summary["decoded_frames"]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "shard_bytes": total, "shards": len(shards), "clips": len(ranges), "frames": frames,
        "frames_decoded_by_validate": decoded, "workers": args.workers, "rounds": args.rounds,
        "cores": os.cpu_count(), "seconds_median": {k: round(v, 3) for k, v in med.items()},
        "seconds_all": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "mb_per_s": {k: round(total / med[k] / 1e6, 1) for k in ("sha256", "structural")},
        "frames_per_s": {k: round(frames / med[k], 1) for k in ("decode", "full")},
        "ratio_full_over_decode": round(med["full"] / med["decode"], 3),
        "ratio_structural_over_sha256": round(med["structural"] / med["sha256"], 3),
        # each round measures both sides back to back: the median of per-round ratios resists drifting load
        "ratio_full_over_decode_per_round_median": _ratio(times["full"], times["decode"]),
        "ratio_structural_over_sha256_per_round_median": _ratio(times["structural"], times["sha256"]),
    }, indent=2))


if __name__ == "__main__":
    main()

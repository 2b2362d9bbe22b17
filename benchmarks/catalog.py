"""Catalog benchmarks, measured in one run:

    .venv/bin/python benchmarks/catalog.py [--rows 1000000] [--rounds 5]

verify : `dsbuild verify` (library call) vs plain `sha256sum` over the same shard files
         (the 244 MB catalog of benchmarks/convert.py).
query  : a GROUP BY over a synthetic version of 1,000,000 index rows. Its shards do not exist on disk,
         which proves the query reads the index in place and never touches shard payloads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import make_captures  # noqa: E402

from dsbuild import __version__  # noqa: E402
from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.lineage.catalog import Catalog  # noqa: E402
from dsbuild.core.hashing import sha256_bytes  # noqa: E402
from dsbuild.lineage.index import INDEX_SCHEMA  # noqa: E402
from dsbuild.lineage.manifest import Manifest, ShardRecord  # noqa: E402
from dsbuild.lineage.query import run_query  # noqa: E402
from dsbuild.lineage.verify import verify  # noqa: E402


def synthetic_version(root: Path, rows: int) -> tuple[Catalog, str]:
    """A committed version of ``rows`` fake samples over 1,000 (absent) shards."""
    shutil.rmtree(root, ignore_errors=True)
    catalog = Catalog.open(root, create=True)
    rng = np.random.default_rng(0)
    shard_names = [f"shards/{i % 256:02x}/{i:064x}.tar" for i in range(1000)]
    titles = np.array(["Breakout", "Pong", "MsPacman", "Kart Storm", "Sky Rally"])
    n = rows
    cols = {
        "key": pa.array([f"s{i // 100:07d}__{i % 100:06d}" for i in range(n)]),
        "sha256": pa.array(["0" * 64] * n),
        "shard": pa.array([shard_names[i % 1000] for i in range(n)]),
        "offset": pa.array(np.arange(n, dtype=np.int64) * 1000), "length": pa.array(np.full(n, 1000, np.int64)),
        "row_group": pa.array(np.full(n, -1, np.int32)), "row": pa.array(np.full(n, -1, np.int32)),
        "session_id": pa.array([f"s{i // 100:07d}" for i in range(n)]),
        "title": pa.array(titles[rng.integers(0, 5, n)]), "player": pa.array([f"p{i % 997}" for i in range(n)]),
        "platform": pa.array(["pc"] * n), "build": pa.array(["1.0"] * n), "conditions": pa.array(["{}"] * n),
        "clip_index": pa.array(np.arange(n, dtype=np.int32) % 100),
        "t_start": pa.array(np.zeros(n)), "t_end": pa.array(np.full(n, 8.0)),
        "frames": pa.array(rng.integers(200, 480, n, dtype=np.int32)), "fps": pa.array(np.full(n, 60.0)),
        "width": pa.array(np.full(n, 640, np.int32)), "height": pa.array(np.full(n, 360, np.int32)),
        "codec": pa.array(["h264"] * n), "video_bytes": pa.array(np.full(n, 900_000, np.int64)),
        "bytes": pa.array(np.full(n, 1_000_000, np.int64)),
        "action_events": pa.array(rng.integers(0, 50, n, dtype=np.int32)),
        "text_events": pa.array(np.zeros(n, np.int32)), "source_video_sha256": pa.array(["1" * 64] * n),
    }
    table = pa.table(cols, schema=INDEX_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 17, store_schema=False)
    index = sink.getvalue().to_pybytes()
    manifest = Manifest(
        tool_version=__version__, config={}, config_hash="0" * 64, shard_format="webdataset",
        sources=({"session": "s0000000", "role": "video", "path": "s0000000/video.mp4", "sha256": "1" * 64, "bytes": 1},),
        shards=tuple(ShardRecord(p, p.split("/")[-1][:64], 10**9, n // 1000, "s") for p in shard_names),
        sessions=(), quarantined=(), index={"path": "index.parquet", "sha256": sha256_bytes(index), "rows": n,
                                            "bytes": len(index)},
        schema={}, vocabulary={"controls": [], "telemetry": []}, stats={"samples": n, "bytes": n * 10**6,
                                                                       "hours": n * 8 / 3600},
        content_id="0" * 64)
    with catalog.build_area() as area:
        vid, _ = catalog.commit(area, [], manifest, index, {"parent": None})
    return catalog, vid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "catalog"))
    args = ap.parse_args()
    out = Path(args.out)
    src = ROOT / "bench-out" / "convert" / "captures"
    make_captures(src)
    cat_path = out / "real"
    if not (cat_path / "catalog.json").exists():
        convert(src, cat_path, ConvertConfig(clip_seconds=2.0), workers=2)
    catalog = Catalog.open(cat_path)
    vid = catalog.resolve(None)
    files = [str(cat_path / s.path) for s in catalog.manifest(vid).shards]
    total = sum(Path(f).stat().st_size for f in files)
    t_verify, t_sum = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        subprocess.run(["sha256sum", *files], check=True, capture_output=True)
        t_sum.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert verify(catalog, vid).ok
        t_verify.append(time.perf_counter() - t)
    synth, sid = synthetic_version(out / "synthetic", args.rows)
    sql = "select title, count(*) as clips, sum(frames) as frames, avg(action_events) from samples group by title"
    run_query(synth, sid, sql)  # warm
    t_query = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        _, rows = run_query(synth, sid, sql)
        t_query.append(time.perf_counter() - t)
    med = statistics.median
    print(json.dumps({
        "verify": {"shard_bytes": total, "seconds_sha256sum": med(t_sum), "seconds_verify": med(t_verify),
                   "ratio_verify_over_sha256sum": med(t_sum) / med(t_verify),
                   "all": {"sha256sum": t_sum, "verify": t_verify}},
        "query": {"rows": args.rows, "sql": sql, "seconds_median": med(t_query), "all": t_query,
                  "groups": len(rows), "shards_on_disk": sum(1 for _ in (synth.root / "shards").rglob("*.tar"))},
    }, indent=2))


if __name__ == "__main__":
    main()

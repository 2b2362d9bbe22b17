"""The loader against the floors of the same work, measured in one run on the same shards.

    .venv/bin/python benchmarks/loader.py CATALOG[@VERSION] [--rounds 3] [--seconds 3] [--workers 2]
                                          [--resize 128x128] [--restore-samples 1000000] [--out FILE]

Per round, interleaved in a rotated order, each for --seconds:
  bytes_verify   : Loader(decode="bytes", verify=True)  samples/s, MB/s
  bytes_noverify : Loader(decode="bytes", verify=False) samples/s, MB/s
  raw            : a plain sequential read of the same shard files (the I/O floor)
  webdataset     : the webdataset library's pipeline iterating the same tar shards
  frames         : Loader(decode="frames", resize) frames/s
  pyav           : a plain PyAV decode loop over the same clips, as many threads as the loader's workers
Then restore: a synthetic version of --restore-samples samples (an index in convert's Parquet schema and
writer settings with unique keys and hashes, committed through the catalog; see ``synthetic_version``)
restored from a mid-epoch state to its first batch. Medians with min/max; ratios are
medians of per-round ratios. Prints one JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.bench.baselines import PyAV, Raw, WebDatasetLib
from dsbuild.bench.dataset import describe
from dsbuild.bench.harness import measure_ours
from dsbuild.bench.options import BenchOptions, parse_resize
from dsbuild.bench.report import machine, versions
from dsbuild.bench.step import Step
from dsbuild.bench.summary import paired_ratio, rotate, spread

FIGURES = ("samples_per_s", "frames_per_s", "mb_per_s")
BYTES = ("samples_per_s", "mb_per_s", "first_batch_s", "resume_s")
FIGURES_OF = {"bytes_verify": BYTES, "bytes_noverify": BYTES, "raw": BYTES[:2], "webdataset": BYTES[:2],
              "frames": ("frames_per_s", *BYTES), "pyav": ("frames_per_s", "samples_per_s", "mb_per_s")}


READABLE_BATCHES = 16  # batches around the restore point whose samples are real, readable bytes


def synthetic_version(ref: str, n: int, batch_size: int, work: Path) -> tuple[str, int]:
    """(ref, restore position) of a catalog at ``work`` whose one version indexes ``n`` samples.

    The index has convert's schema and writer settings, with unique keys and unique sha256 values (so
    reading it costs what a real one does). The rows a restore at the middle of epoch 0 reads (with
    shuffle="none", which is what makes them known before the version id exists) point at real copies
    of the version's smallest sample, re-keyed, in a second shard; every other row points at that
    sample in the original shard and is never read."""
    import dataclasses
    import hashlib
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsbuild.formats.webdataset import parse_members
    from dsbuild.lineage.catalog import Catalog, open_ref
    from dsbuild.core.hashing import sha256_bytes
    from dsbuild.lineage.index import INDEX_FILE, INDEX_SCHEMA, read_index
    from dsbuild.lineage.manifest import ShardRecord, content_id

    catalog, version = open_ref(ref)
    manifest = catalog.manifest(version)
    if manifest.shard_format != "webdataset":
        raise SystemExit("the restore benchmark needs a webdataset (tar) version")
    rows = read_index(catalog.version_dir(version) / manifest.index["path"]).to_pylist()
    real = min(rows, key=lambda r: r["length"])
    with open(catalog.root / real["shard"], "rb") as f:
        f.seek(real["offset"])
        members = parse_members(f.read(real["length"]), real["key"])
    position = (n // batch_size) // 2
    first = position * batch_size
    readable = range(first, min(n, first + READABLE_BATCHES * batch_size))
    keys = [f"syn-{i:07d}" for i in range(n)]
    # The second shard: the smallest sample under each readable key (USTAR, like convert's shards).
    buf = io.BytesIO()
    spans = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in readable:
            start = buf.tell()
            for name, payload in members:
                info = tarfile.TarInfo(f"{keys[i]}.{name.split('.', 1)[1]}")
                info.size, info.mode = len(payload), 0o644
                tar.addfile(info, io.BytesIO(payload))
            spans[i] = (start, buf.tell() - start)
    extra = buf.getvalue()
    extra_sha = sha256_bytes(extra)
    extra_path = catalog.shard_path(extra_sha, "tar")
    original = next(s for s in manifest.shards if s.path == real["shard"])
    cols = {f.name: pa.repeat(pa.scalar(real[f.name], f.type), n) for f in INDEX_SCHEMA}
    cols["key"] = pa.array(keys, pa.string())
    sha = [hashlib.sha256(k.encode()).hexdigest() for k in keys]  # unique, like real ones (unread rows)
    shard, offset, length = [real["shard"]] * n, [real["offset"]] * n, [real["length"]] * n
    for i, (start, size) in spans.items():
        sha[i], shard[i], offset[i], length[i] = real["sha256"], extra_path, start, size
    cols.update(sha256=pa.array(sha, pa.string()), shard=pa.array(shard, pa.string()),
                offset=pa.array(offset, pa.int64()), length=pa.array(length, pa.int64()))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(cols, schema=INDEX_SCHEMA), sink, compression="zstd", row_group_size=1 << 17,
                   store_schema=False)  # the writer settings of dsbuild.lineage.index.index_bytes
    index = sink.getvalue().to_pybytes()
    synthetic = dataclasses.replace(
        manifest,
        shards=(ShardRecord(original.path, original.sha256, original.bytes, n - len(spans), "syn"),
                ShardRecord(extra_path, extra_sha, len(extra), len(spans), "syn")),
        index={"path": INDEX_FILE, "sha256": sha256_bytes(index), "rows": n, "bytes": len(index)},
        content_id=content_id(list(zip(keys, sha))))
    target = Catalog.open(work, create=True)
    with target.build_area() as area:
        (area.path / "a").write_bytes((catalog.root / original.path).read_bytes())
        (area.path / "b").write_bytes(extra)
        version_id, _ = target.commit(area, [(area.path / "a", original.path), (area.path / "b", extra_path)],
                                      synthetic, index, {"synthetic": True})
    return f"{work}@{version_id}", position


def restore(ref: str, position: int, batch_size: int, rounds: int) -> dict:
    """The state after global step ``position`` -> new loader -> load_state_dict -> first batch."""
    from dsbuild.loader import Loader

    kw = {"decode": "bytes", "batch_size": batch_size, "seed": 0, "num_workers": 2, "shuffle": "none"}
    probe = Loader(ref, **kw)
    state = probe.state_dict()
    state["position"], state["cursors"] = position, [[0, position]]  # what state_dict() says after that step
    out: dict[str, list[float]] = {"restore_s": [], "open_s": [], "first_batch_s": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        loader = Loader(ref, **kw)
        loader.load_state_dict(state)
        t1 = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        t2 = time.perf_counter()
        it.close()
        if loader.stats()["corrupt"] or len(batch["keys"]) != batch_size:
            raise SystemExit(f"restore read {loader.stats()['corrupt']} corrupt samples")
        out["restore_s"].append(t2 - t0)
        out["open_s"].append(t1 - t0)
        out["first_batch_s"].append(t2 - t1)
    return {"samples": len(probe.sources[0]), "position": position, "state_bytes": len(json.dumps(state)),
            "shuffle": "none", **{k: spread(v) for k, v in out.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--resize", default="128x128")
    ap.add_argument("--restore-samples", type=int, default=1_000_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    resize = parse_resize(args.resize)
    data = describe(args.ref, None)
    common = {"ref": data.ref, "batch_size": args.batch_size, "workers": args.workers, "step_ms": 0, "device": "cpu"}
    opts = {"bytes_verify": BenchOptions(decode="bytes", verify=True, **common),
            "bytes_noverify": BenchOptions(decode="bytes", verify=False, **common),
            "frames": BenchOptions(decode="frames", resize=resize, **common)}
    no_step = Step(0, None)
    threads = max(1, args.workers)
    baselines = {"raw": Raw(data), "webdataset": WebDatasetLib(data, threads, None, "bytes"),
                 "pyav": PyAV(data, threads, resize, "frames")}
    results: dict[str, list[dict]] = {name: [] for name in [*opts, *baselines]}
    for r in range(args.rounds):
        for name in rotate(list(results), r):
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr)
            if name in opts:
                x = measure_ours(opts[name], data, None, no_step, args.seconds, 0, round_=r)
                results[name].append({k: x[k] for k in (*FIGURES, "first_batch_s", "resume_s", "seconds")})
            else:
                results[name].append(baselines[name].run(args.seconds))
    pairs = [("bytes_verify", "raw", ("samples_per_s", "mb_per_s")),
             ("bytes_noverify", "raw", ("samples_per_s", "mb_per_s")),
             ("bytes_verify", "webdataset", ("samples_per_s", "mb_per_s")),
             ("bytes_noverify", "webdataset", ("samples_per_s", "mb_per_s")),
             ("frames", "pyav", ("frames_per_s",))]
    work = Path(tempfile.mkdtemp(prefix="dsbuild-restore-"))
    try:
        t = time.perf_counter()
        big, position = synthetic_version(data.ref, args.restore_samples, args.batch_size, work)
        build_s = time.perf_counter() - t
        restored = {**restore(big, position, args.batch_size, args.rounds), "synthetic_build_s": build_s}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "format": "dsbuild.bench.loader/1", "version_id": data.version_id, "dataset": data.to_json(),
        "machine": machine(None), "versions": versions(),
        "config": {"rounds": args.rounds, "seconds": args.seconds, "workers": args.workers,
                   "batch_size": args.batch_size, "resize": list(resize) if resize else None},
        "figures": {name: {f: spread([x.get(f) for x in rounds]) for f in FIGURES_OF[name]}
                    for name, rounds in results.items()},
        "ratios": {f"{a}/{b}": {f: paired_ratio(results[a], results[b], f) for f in figs} for a, b, figs in pairs},
        "restore_1m": restored,
    }
    text = json.dumps(report, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""One epoch in bytes mode, open included: what a short job or an evaluation pass pays, against the peers.

    .venv/bin/python benchmarks/epoch.py CATALOG [--rounds 5] [--work DIR]

In interleaved rounds (each round in another order, shuffled with a fixed seed: a contender that
always followed the same one inherited its caches and allocator state), each contender is built from nothing and reads
every sample of the version once, in key order; the time runs from its constructor to the end of the
epoch, so opening (our index and manifest, LitData's index) is counted, and each round starts fresh:
  ours_sample  : Loader(CATALOG, decode="bytes", batch_size=B, shuffle="none"), the defaults otherwise
                 (verify="sample": every sample's BLAKE3 checked on every read, into copies)
  ours_shard   : verify="shard" on a machine that has read the version before (the proof cache
                 vouches for each unchanged shard: its hash and its safety checks are not run again;
                 and it keeps the columns opening derived from the index: the Parquet is not read)
  ours_first   : verify="shard" with the proof cache off (DSBUILD_HASH_CACHE=0): what the first job on
                 a machine pays, the index read and checked, every shard hashed and checked
  ours_none    : verify="none" (what the peers check: nothing; the safety checks still run once per
                 machine, and the index is read once per machine, as for ours_shard)
  litdata      : litdata.StreamingDataset over the same member bytes, written once by LitData's own
                 writer before the rounds (dsbuild.bench.peers; the peers extra)
  webdataset   : webdataset.WebDataset over the same tars
Every contender's pages are warm (one untimed epoch each first). Prints samples/s and MB/s (sample
payload) per round, the median of the per-round ratios ours / peer, and the command line.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsbuild.bench.dataset import describe
from dsbuild.bench.peers import LitData
from dsbuild.loader import Loader


def contenders(ref: str, work: Path) -> tuple[dict, int, int]:
    """({name: one epoch, built from nothing -> samples}, samples, payload bytes)."""
    data = describe(ref, None)
    n, payload = data.facts.samples, data.facts.bytes
    batch = max(1, min(32, n // 16))
    urls = [str(s.path) for s in data.shards]

    def ours(verify: str | None, proofs: bool = True):
        def epoch() -> int:
            kw = {} if verify is None else {"verify": verify}
            before = os.environ.get("DSBUILD_HASH_CACHE")
            if not proofs:
                os.environ["DSBUILD_HASH_CACHE"] = "0"
            try:
                with Loader(ref, decode="bytes", batch_size=batch, shuffle="none", **kw) as loader:
                    return sum(len(b["keys"]) for b in loader)
            finally:
                if before is None:
                    os.environ.pop("DSBUILD_HASH_CACHE", None)
                else:
                    os.environ["DSBUILD_HASH_CACHE"] = before

        return epoch

    def webdataset() -> int:
        import webdataset as wds

        return sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False))

    runs = {
        "ours_sample": ours(None),
        "ours_shard": ours("shard"),
        "ours_first": ours("shard", proofs=False),
        "ours_none": ours("none"),
        "webdataset": webdataset,
    }
    missing = LitData.missing()
    if missing:
        print(f"litdata skipped: {missing}")
    else:
        peer = LitData(data, work)
        peer.prepare()  # its copy, written by its own writer (untimed)
        peer.close()

        def litdata() -> int:
            import litdata as ld

            return sum(1 for _ in ld.StreamingDataset(input_dir=str(peer.folder)))

        runs["litdata"] = litdata
    return runs, n, payload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("catalog")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    if a.work:
        Path(a.work).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dsbuild-epoch-", dir=a.work))
    runs, n, payload = contenders(a.catalog, work)
    for name, epoch in runs.items():
        got = epoch()  # warm, untimed
        if got != n:
            raise SystemExit(f"{name} read {got} samples of {n}")
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(a.rounds):
        for name in random.Random(r).sample(names, len(names)):
            t0 = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - t0)
    print(f"{n} samples, {payload / n / 1e3:.0f} KB each on average; one epoch, open included; {a.rounds} rounds")
    for name, ts in seconds.items():
        med = statistics.median(ts)
        print(f"{name:12s} {med * 1e3:8.1f} ms  {n / med:9.0f} samples/s  {payload / med / 1e6:8.1f} MB/s")
    for ours in ("ours_sample", "ours_shard", "ours_first", "ours_none"):
        for peer in ("litdata", "webdataset"):
            if peer in seconds:
                ratios = [p / o for o, p in zip(seconds[ours], seconds[peer])]
                shown = ", ".join(f"{x:.2f}" for x in ratios)
                print(f"{ours} / {peer}: median {statistics.median(ratios):.2f} ({shown})")
    print("command: .venv/bin/python benchmarks/epoch.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()

"""torch's DataLoader over ``as_torch_dataset()`` against the loader's own process mode, at the same N.

    .venv/bin/python benchmarks/dataloader.py CATALOG [--workers 2] [--rounds 3] [--seconds 3]
        [--batch-size 8] [--resize 64x64] [--verify shard] [--modes bytes,frames]

Per mode (bytes: encoded clips; frames: decoded and resized), in interleaved rounds (the order rotated each
round), each contender runs whole epochs for --seconds after one untimed warm epoch (which also starts its
persistent workers), once the other's workers are idle (``settle``: process mode's look-ahead into its
next epoch otherwise ran during the DataLoader's time, 0.89x where alone they read alike):
  process    : Loader(..., worker_mode="process", num_workers=N), ``for batch in loader``
  dataloader : DataLoader(Loader(...).as_torch_dataset(), batch_size=None, num_workers=N,
               persistent_workers=True, prefetch_factor=<the loader's prefetch>)
Prints samples/s per round, the median of the per-round ratios dataloader / process, the load average
before and after, and the command line.

    .venv/bin/python benchmarks/dataloader.py --handover [--rounds 3]

What the transport costs alone: a DataLoader worker yielding ready batches (a few strings and 0, 1 or 2
tensors in shared memory, reused: nothing is built or copied), as the main process receives them: torch
hands each shared storage over by file descriptor through the worker's ``resource_sharer`` thread. Then
the same with dsbuild's hand-over (``dsbuild.loader.torch``): a 100-byte array and a 1 MiB one written
into the worker's two rings (copied each batch) and opened by the main process through /proc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from dsbuild.loader import Loader


def contenders(ref: str, mode: str, args) -> dict:
    kw = {"decode": mode, "batch_size": args.batch_size, "verify": args.verify, "num_workers": args.workers}
    if mode == "frames" and args.resize:
        h, w = (int(x) for x in args.resize.split("x"))
        kw["resize"] = (h, w)
    procs = Loader(ref, worker_mode="process", **kw)
    loader = Loader(ref, **kw)
    dl = torch.utils.data.DataLoader(
        loader.as_torch_dataset(),
        batch_size=None,
        num_workers=args.workers,
        persistent_workers=True,
        prefetch_factor=loader.options.prefetch,
    )
    return {"process": procs, "dataloader": dl}


def epoch(source) -> int:
    return sum(len(b["keys"]) for b in source)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (process mode's workers are the forkserver's children, not ours)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except FileNotFoundError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out


def descendants_cpu() -> float:
    """CPU seconds used so far by the processes below this one (ticks of /proc/PID/stat)."""
    total = 0
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def settle(quiet: float = 0.2, limit: float = 30.0) -> None:
    """Wait until the workers below this process have used no CPU for ``quiet`` seconds: process mode
    builds the next epoch's first batches ahead once an epoch is under way, and a contender timed while
    they were built lost that CPU to the other (a training job runs one loader: that overlap is not
    its)."""
    end, last = time.monotonic() + limit, descendants_cpu()
    while time.monotonic() < end:
        time.sleep(quiet)
        now = descendants_cpu()
        if now == last:
            return
        last = now


def timed(source, seconds: float) -> float:
    """Samples a second over whole epochs lasting at least ``seconds``."""
    n, t0 = 0, time.perf_counter()
    while True:
        n += epoch(source)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


class Ready(torch.utils.data.IterableDataset):
    """``n`` batches of 8 keys and ``storages`` small shared tensors (made once)."""

    def __init__(self, storages: int, n: int = 2000):
        super().__init__()
        self.storages, self.n = storages, n

    def __iter__(self):
        blocks = [torch.zeros(4096, dtype=torch.uint8).share_memory_() for _ in range(self.storages)]
        keys = [f"key{j}" for j in range(8)]
        for _ in range(self.n):
            yield {"keys": keys, **{f"t{j}": b[:100] for j, b in enumerate(blocks)}}


class ReadyRings(torch.utils.data.IterableDataset):
    """``n`` batches of 8 keys, a 100-byte array and a 1 MiB one, as ``as_torch_dataset()`` sends them."""

    def __init__(self, n: int = 2000):
        super().__init__()
        self.n = n

    def __iter__(self):
        from dsbuild.loader.torch import BIG, PAGE, Ring, shared_batch

        rings = Ring(), Ring(PAGE)
        small, big = np.zeros(100, np.uint8), np.zeros(BIG, np.uint8)
        keys = [f"key{j}" for j in range(8)]
        for _ in range(self.n):
            yield shared_batch({"keys": keys, "small": small, "big": big}, *rings)


def handover(rounds: int) -> None:
    for r in range(rounds):
        shown = []
        for name, ds in [(f"{n} torch storages", Ready(n)) for n in (0, 1, 2)] + [("dsbuild's 2 blocks", ReadyRings())]:
            it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
            next(it)
            t0, k = time.perf_counter(), sum(1 for _ in it)
            shown.append(f"{name} {(time.perf_counter() - t0) / k * 1e3:.2f} ms")
        print(f"round {r}: a batch with {'; '.join(shown)}; load {os.getloadavg()[0]:.1f}")


def main() -> None:
    if "--handover" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--handover", action="store_true")
        ap.add_argument("--rounds", type=int, default=3)
        handover(ap.parse_args().rounds)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("catalog")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--resize", default="64x64")
    ap.add_argument("--verify", default="shard")
    ap.add_argument("--modes", default="bytes,frames")
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()[0]:.1f}")
    for mode in args.modes.split(","):
        runs = contenders(args.catalog, mode, args)
        for source in runs.values():
            epoch(source)  # warm: workers started, pages cached
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.rounds):
            names = list(runs)
            for name in names[r % 2 :] + names[: r % 2]:
                settle()
                rates[name].append(timed(runs[name], args.seconds))
        ratios = [d / p for d, p in zip(rates["dataloader"], rates["process"])]
        shown = {n: ", ".join(f"{x:.0f}" for x in v) for n, v in rates.items()}
        print(
            f"{mode}: process {shown['process']} samples/s; dataloader {shown['dataloader']} samples/s; "
            f"ratio median {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)}); "
            f"load {os.getloadavg()[0]:.1f}"
        )
        runs["process"].close()
        del runs
    print("command: .venv/bin/python benchmarks/dataloader.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()

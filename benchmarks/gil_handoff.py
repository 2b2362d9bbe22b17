"""What two Python threads that alternate hashing and Python can reach on this machine, with nothing else.

    .venv/bin/python benchmarks/gil_handoff.py [--rounds 3] [--python-us 5,20]

The loader's `verify="sample"` path does, per sample, a BLAKE3 of ~88 KB (the GIL released) and some
microseconds of Python (the GIL held). Here the same shape is reduced to its bones: per "sample" one
`blake3(88 KB)` and a Python loop of about --python-us microseconds, in batches of 22, either
interleaved (hash, Python, hash, Python...) or grouped (22 hashes, then 22 Python stretches: what the
loader does per read). Ideal 2-thread scaling is min(2, (hash + Python) / Python): every handoff of
the GIL between the threads costs a wake-up of the waiting thread, which a virtual machine pays dearly.
Prints samples/s at 1 and 2 threads and the scaling, per round and as medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from blake3 import blake3

BATCH, BATCHES, SIZE = 22, 600, 88_000


def _python(n: int) -> None:
    x = 0
    for i in range(n):
        x += i


def interleaved(view: memoryview, batches: int, n: int) -> None:
    for _ in range(batches):
        for _ in range(BATCH):
            blake3(view).digest()
            _python(n)


def grouped(view: memoryview, batches: int, n: int) -> None:
    for _ in range(batches):
        for _ in range(BATCH):
            blake3(view).digest()
        for _ in range(BATCH):
            _python(n)


def rate(fn, threads: int, view: memoryview, n: int) -> float:
    per = BATCHES // threads
    workers = [threading.Thread(target=fn, args=(view, per, n)) for _ in range(threads)]
    t = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per * threads * BATCH / (time.perf_counter() - t)


def loop_iterations_per_us() -> float:
    t = time.perf_counter()
    _python(200_000)
    return 200_000 / ((time.perf_counter() - t) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python-us", default="5,20")
    args = ap.parse_args()
    view = memoryview(os.urandom(SIZE))
    per_us = loop_iterations_per_us()
    t = time.perf_counter()
    for _ in range(200):
        blake3(view).digest()
    hash_us = (time.perf_counter() - t) / 200 * 1e6
    print(f"blake3 of {SIZE:,} bytes: {hash_us:.1f} us; Python loop: {per_us:.0f} iterations/us\n")
    print("| Python a sample | schedule | 1 thread, samples/s | 2 threads, samples/s | scaling | ideal |")
    print("|---|---|---|---|---|---|")
    for us in (float(x) for x in args.python_us.split(",")):
        n = max(1, round(us * per_us))
        for fn in (interleaved, grouped):
            one, two = [], []
            for _ in range(args.rounds):
                one.append(rate(fn, 1, view, n))
                two.append(rate(fn, 2, view, n))
            scale = statistics.median(b / a for a, b in zip(one, two))
            ideal = min(2.0, (hash_us + us) / us)
            print(
                f"| {us:.0f} us | {fn.__name__} | {statistics.median(one):,.0f} | {statistics.median(two):,.0f} "
                f"| {scale:.2f} (rounds {', '.join(f'{b / a:.2f}' for a, b in zip(one, two))}) | {ideal:.2f} |"
            )
    print("\ncommand: .venv/bin/python benchmarks/gil_handoff.py " + " ".join(os.sys.argv[1:]))


if __name__ == "__main__":
    main()

"""--ranks W: W processes on this machine as simulated data-parallel ranks.

Each rank is a spawned process running ``measure_ours`` as rank r of W (its own loader, threads and
step). A barrier of W ranks + the parent starts every round on all ranks together and holds the parent
until all have finished it, so rank rounds interleave with the baselines exactly as the single-process
``ours`` does. Ranks report through JSON files (nothing is pickled but the process arguments).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from dsbuild.bench.summary import percentiles, spread
from dsbuild.core.errors import DsbuildError

START_TIMEOUT_S = 900.0  # a rank's start (imports, opening the index) on a loaded machine
STRAGGLER = 0.9  # a rank below 90% of the ranks' median throughput is named a straggler


def rank_main(options: str, rank: int, world: int, device: str | None, seconds: float, rounds: int,
              outdir: str, barrier) -> None:
    """Entry point of one rank process (module level, so spawn can import it)."""
    from dsbuild.bench.dataset import describe
    from dsbuild.bench.harness import measure_ours
    from dsbuild.bench.options import BenchOptions
    from dsbuild.bench.step import Step

    out = Path(outdir)
    try:
        o = BenchOptions.from_json(json.loads(options))
        data = describe(o.ref, o.split)
        step = Step(o.step_ms, device)
        step.prepare()
        results = []
        for r in range(rounds):
            barrier.wait(START_TIMEOUT_S)
            results.append(measure_ours(o, data, device, step, seconds, seconds, rank=rank, world=world, round_=r))
            barrier.wait(START_TIMEOUT_S + 20 * seconds)
        (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "rounds": results}))
    except threading.BrokenBarrierError:
        return  # another rank failed and said why
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        (out / f"rank-{rank}.error").write_text(f"{type(e).__name__}: {e}")
        barrier.abort()
        raise SystemExit(1)


class RankGroup:
    """Spawns the ranks; ``round(r)`` runs round r on all of them; ``finish()`` returns their results."""

    def __init__(self, options: dict, world: int, device: str | None, seconds: float, rounds: int, workdir: Path):
        self.options, self.world, self.device = options, world, device
        self.seconds, self.rounds, self.workdir = seconds, rounds, Path(workdir)
        self.procs: list = []
        self._watching = False

    def start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(self.world + 1)
        self.workdir.mkdir(parents=True, exist_ok=True)
        for r in range(self.world):
            p = ctx.Process(target=rank_main, name=f"bench-rank-{r}",
                            args=(json.dumps(self.options), r, self.world, self.device, self.seconds, self.rounds,
                                  str(self.workdir), self.barrier))
            p.start()
            self.procs.append(p)
        self._watching = True
        threading.Thread(target=self._watch, name="bench-rank-watch", daemon=True).start()

    def _watch(self) -> None:
        """A rank that dies without a word (killed, out of memory) breaks the barrier instead of hanging it."""
        while self._watching:
            if any(p.exitcode not in (None, 0) for p in self.procs):
                self.barrier.abort()
                return
            time.sleep(0.5)

    def _wait(self, timeout: float) -> None:
        try:
            self.barrier.wait(timeout)
        except threading.BrokenBarrierError:
            self._fail()

    def _fail(self) -> None:
        for p in self.procs:
            p.join(10)
        errors = sorted(self.workdir.glob("rank-*.error"))
        why = "; ".join(f"{e.stem.replace('.error', '')}: {e.read_text()}" for e in errors)
        codes = {p.name: p.exitcode for p in self.procs if p.exitcode not in (0, None)}
        raise DsbuildError(f"a simulated rank failed ({why or codes or 'timed out'})")

    def round(self, r: int) -> None:
        self._wait(START_TIMEOUT_S)
        self._wait(START_TIMEOUT_S + 20 * self.seconds)

    def finish(self) -> list[list[dict]]:
        for p in self.procs:
            p.join()
        self._watching = False
        if any(p.exitcode != 0 for p in self.procs):
            self._fail()
        return [json.loads((self.workdir / f"rank-{r}.json").read_text())["rounds"] for r in range(self.world)]

    def stop(self) -> None:
        """Abandon the ranks (the parent is failing or interrupted)."""
        self._watching = False
        if self.procs:
            self.barrier.abort()
            for p in self.procs:
                p.join(30)
                if p.is_alive():
                    p.terminate()


def _sum_split(parts: list[tuple[int, dict]]) -> dict:
    """Merge per-rank pipeline splits: seconds and walls add up, workers are named rank<r>/<thread>."""
    out = {"wall": 0.0, "read": 0.0, "decode": 0.0, "collate": 0.0, "busy": 0.0, "workers": {}}
    for r, p in parts:
        for k in ("wall", "read", "decode", "collate", "busy"):
            out[k] += p[k]
        for name, w in p["workers"].items():
            out["workers"][f"rank{r}/{name}"] = w
    return out


def _sum(dicts: list[dict]) -> dict:
    return {k: sum(d[k] for d in dicts) for k in dicts[0]}


def _merge_timelines(lines: list[list]) -> list[tuple[float, float]]:
    steps = []
    for points in lines:
        prev = 0.0
        for t, n in points:
            steps.append((t, n - prev))
            prev = n
    steps.sort()
    total, out = 0.0, []
    for t, d in steps:
        total += d
        out.append((t, total))
    return out


def combine(rounds: list[dict]) -> dict:
    """One round across ranks (they ran at the same time): rates add up, latencies take the slowest."""
    out = {k: sum(x[k] for x in rounds) for k in ("samples", "frames", "bytes", "batches", "corrupt")}
    for k in ("samples_per_s", "frames_per_s", "mb_per_s", "batches_per_s"):
        out[k] = sum(x[k] or 0.0 for x in rounds)
    for k in ("seconds", "first_batch_s", "open_s", "resume_s"):
        out[k] = max(x[k] for x in rounds)
    out["timeline"] = _merge_timelines([x["timeline"] for x in rounds])
    out["throughput"] = {"consumer": _sum([x["throughput"]["consumer"] for x in rounds]),
                         "pipeline": _sum_split([(r, x["throughput"]["pipeline"]) for r, x in enumerate(rounds)])}
    if rounds[0].get("training") is None:
        out["training"] = None
        return out
    tr = [x["training"] for x in rounds]
    waits = [w for t in tr for w in t["waits"]]
    consumer = _sum([t["consumer"] for t in tr])
    busy = [t["gpu_busy_s"] for t in tr]
    out["training"] = {
        "steps": sum(t["steps"] for t in tr), "seconds": max(t["seconds"] for t in tr),
        "samples_per_s": sum(t["samples_per_s"] or 0.0 for t in tr),
        "frames_per_s": sum(t["frames_per_s"] or 0.0 for t in tr), "waits": waits,
        "wait_fraction": consumer["data_wait"] / consumer["wall"],
        "wait_ms": {k: (v * 1000 if v is not None else None) for k, v in percentiles(waits).items()},
        "gpu_busy_s": None if None in busy else sum(busy),
        "gpu_idle_fraction": None if None in busy else max(0.0, 1 - sum(busy) / consumer["wall"]),
        "consumer": consumer,
        "pipeline": _sum_split([(r, t["pipeline"]) for r, t in enumerate(tr)]),
    }
    return out


def rank_summary(per_rank: list[list[dict]]) -> dict:
    """Per-rank throughput (medians over rounds), skew = slowest / fastest, and the stragglers by name."""
    ranks = []
    for r, rounds in enumerate(per_rank):
        tr = [x["training"] for x in rounds if x.get("training")]
        ranks.append({"rank": r, "samples_per_s": spread([x["samples_per_s"] for x in rounds]),
                      "frames_per_s": spread([x["frames_per_s"] for x in rounds]),
                      "first_batch_s": spread([x["first_batch_s"] for x in rounds]),
                      "wait_fraction": spread([t["wait_fraction"] for t in tr])})
    medians = [x["samples_per_s"]["median"] for x in ranks]
    mid = sorted(medians)[len(medians) // 2]
    return {"world_size": len(per_rank), "per_rank": ranks,
            "skew": min(medians) / max(medians) if max(medians) > 0 else None,
            "slowest": f"rank {medians.index(min(medians))}", "fastest": f"rank {medians.index(max(medians))}",
            "stragglers": [f"rank {r}" for r, m in enumerate(medians) if m < STRAGGLER * mid]}

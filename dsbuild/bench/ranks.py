"""Our loader runs in its own processes: ``--ranks W`` processes as data-parallel ranks r of W (W=1: one).

Why processes, even for one rank: a loader's speed varies from process to process more than from round
to round within one (thread placement, memory layout: the reason pyperf measures in worker processes;
here about +-10% in bytes mode against 1-3% within a process). Each round's ranks are fresh processes,
all started before the rounds (start-up), so the spread over rounds includes that variation and the
gate weighs drops against it. Beyond ``FRESH_LIMIT`` processes one set of ranks serves every round.

Each rank is ``python -m dsbuild.bench.ranks``, spoken to in JSON lines: the parent sends the setup, then
one line per round (its slices); the rank answers with progress ticks and its ``OursRound`` as JSON
(validated on arrival, like any record) or with an error. Rounds start on every rank at once and the
parent waits for all of them, so rank rounds interleave with the baselines. Nothing is pickled. A rank
ignores Ctrl-C (the parent handles it and ends the ranks) and exits when its input closes, so none
outlives the parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import IO

from dsbuild.bench.harness import OursRound
from dsbuild.bench.measure import Measured
from dsbuild.bench.stages import total
from dsbuild.bench.stats import Spread, summarise
from dsbuild.core import errors
from dsbuild.core.executor import last_words
from dsbuild.core.jsonio import loads_bounded
from dsbuild.core.records import Record

FRESH_LIMIT = 16  # processes started for fresh ranks per round; more ranks x rounds reuse one set
MAX_LINE = 64 << 20  # one round's record (per-batch waits included) is far smaller
STRAGGLER = 0.9  # a rank below 90% of the ranks' median throughput is named a straggler
ERRORS = {
    c.__name__: c
    for c in (
        errors.UsageError,
        errors.FormatError,
        errors.StorageError,
        errors.LineageError,
        errors.CorruptDataError,
        errors.CheckFailed,
    )
}


@dataclass(frozen=True, slots=True)
class RankFacts(Record):
    rank: int
    figure: Spread | None  # frames/s or MB/s over rounds
    first_batch_s: Spread | None


@dataclass(frozen=True, slots=True)
class Ranks(Record):
    world_size: int
    per_rank: tuple[RankFacts, ...]
    skew: float | None  # slowest / fastest median
    stragglers: tuple[int, ...]  # ranks below STRAGGLER x the median rank


class RankGroup:
    """W processes running our loader as ranks r of W. ``start()`` launches them, ``ready()`` waits until
    they have opened the version (returning each one's step description), ``round(...)`` runs one round on
    all of them and returns their records; ``tick(name, elapsed, frames, bytes)`` hears rank 0's progress."""

    def __init__(self, setup: dict, world: int):
        self.setup, self.world = setup, world
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def start(self) -> None:
        for r in range(self.world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (the rank's stderr, closed in stop())
            p = subprocess.Popen(
                [sys.executable, "-m", "dsbuild.bench.ranks"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
            self.procs.append(p)
            self.logs.append(log)
            self._send(p, {**self.setup, "rank": r, "world": self.world})

    def ready(self) -> list[dict]:
        return [self._receive(r) for r in range(self.world)]

    def round(self, message: dict, tick=None) -> list[OursRound]:
        for p in self.procs:
            self._send(p, message)
        return [
            OursRound.from_json(self._receive(r, tick if r == 0 else None), f"rank {r} round")
            for r in range(self.world)
        ]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                _pipe(p.stdin).close()
                p.terminate()
        for p, log in zip(self.procs, self.logs):
            p.wait()
            _pipe(p.stdout).close()
            log.close()
        self.procs, self.logs = [], []

    def _send(self, p: subprocess.Popen, message: dict) -> None:
        stdin = _pipe(p.stdin)
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()

    def _receive(self, r: int, tick=None):
        while True:
            line = _pipe(self.procs[r].stdout).readline(MAX_LINE)
            if not line:
                self.procs[r].wait()
                said = last_words(self.logs[r])
                raise errors.WorkerDied(
                    f"bench rank {r} exited (code {self.procs[r].returncode})" + (f": {said}" if said else "")
                )
            doc = loads_bounded(line, max_bytes=MAX_LINE, what=f"rank {r}")
            if "tick" in doc:
                if tick is not None:
                    tick(*doc["tick"])
                continue
            if "error" in doc:
                cls = ERRORS.get(doc.get("kind"))
                message = f"rank {r}: {doc['error']}"
                if doc.get("kind") == "MemoryError":  # (its message is empty) exit 3, as in this process
                    raise errors.StorageError(
                        f"rank {r}: out of memory", hint="a smaller --resize or --batch-size, or fewer --ranks"
                    )
                if cls is None:
                    raise RuntimeError(message)
                raise cls(message, hint=doc.get("hint"))
            return doc["result"]


def warm_up(o, data, device: str | None, rank: int, world: int) -> None:
    """Imports (torch, PyAV, the loader) and the index's first read happen at start-up, not in round 1."""
    from dsbuild.bench.harness import loader_kwargs
    from dsbuild.loader import Loader

    Loader(data.ref, o.split, **loader_kwargs(o, data.bucket_by, device, rank, world)).open()
    if o.decode == "frames":
        import av  # noqa: F401


def main() -> None:
    """A rank process: setup line, then one line per round, until its input closes."""
    from dsbuild.bench.dataset import describe
    from dsbuild.bench.harness import measure_ours
    from dsbuild.bench.options import BenchOptions
    from dsbuild.bench.step import Step

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol

    def answer(doc: dict) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    def tick(meter) -> None:
        answer({"tick": [meter.name, meter.elapsed(), meter.frames, meter.bytes]})

    try:
        setup = json.loads(sys.stdin.readline())
        o = BenchOptions.from_json(setup["options"], "bench options")
        data = describe(setup["ref"], o.split)
        step = Step(o.step_ms, setup["device"])
        info = step.prepare()
        warm_up(o, data, setup["device"], setup["rank"], setup["world"])
        answer({"result": info.to_json()})
        for line in sys.stdin:
            msg = json.loads(line)
            rec = measure_ours(
                o,
                data.ref,
                data.bucket_by,
                data.sizes,
                setup["device"],
                step,
                msg["seconds"],
                msg["step_seconds"],
                start_s=msg["start_s"],
                round_=msg["round"],
                rank=setup["rank"],
                world=setup["world"],
                tick=tick,
            )
            answer({"result": rec.to_json()})
    except Exception as e:
        answer({"error": str(e), "kind": type(e).__name__, "hint": getattr(e, "hint", None)})


def _merge_points(parts: list[Measured]) -> tuple[tuple[float, ...], ...]:
    """Ranks' cumulative samples taken at about the same seconds, added up (as many as the shortest has)."""
    n = min(len(p.points) for p in parts)
    return tuple(
        (max(p.points[i][0] for p in parts), *(sum(p.points[i][k] for p in parts) for k in (1, 2, 3))) for i in range(n)
    )


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A rank process's stdin or stdout (each is started with a pipe on both)."""
    if stream is None:
        raise errors.StorageError("a rank process has no pipe to talk through")
    return stream


def _sum_or_none(values: list[float | None]) -> float | None:
    """The sum, or None when one of the values is unknown (a rank that did not measure it)."""
    known = [v for v in values if v is not None]
    return sum(known) if len(known) == len(values) else None


def _merge(parts: list[Measured]) -> Measured:
    return Measured(
        parts[0].name,
        parts[0].round,
        min(p.start_s for p in parts),
        max(p.seconds for p in parts),
        sum(p.samples for p in parts),
        _sum_or_none([p.frames for p in parts]),
        sum(p.bytes for p in parts),
        _merge_points(parts),
    )


def combine(rounds: list[OursRound]) -> OursRound:
    """One round across ranks (they ran at the same time): work adds up, latencies take the slowest."""
    names = [f"rank{r}" for r in range(len(rounds))]
    trained = [x.training for x in rounds if x.training is not None]
    busy = [x.gpu_busy_s for x in rounds]
    throughput_stages = total([x.throughput_stages for x in rounds], names)
    if throughput_stages is None:
        raise errors.UsageError("no rank rounds to combine")
    return OursRound(
        throughput=_merge([x.throughput for x in rounds]),
        training=_merge(trained) if trained else None,
        open_s=max(x.open_s for x in rounds),
        first_batch_s=max(x.first_batch_s for x in rounds),
        resume_s=max(x.resume_s for x in rounds),
        waits_ms=tuple(w for x in rounds for w in x.waits_ms),
        step_waits_ms=tuple(w for x in rounds for w in x.step_waits_ms),
        gpu_busy_s=_sum_or_none(busy),
        corrupt=sum(x.corrupt for x in rounds),
        throughput_stages=throughput_stages,
        training_stages=total([x.training_stages for x in rounds if x.training_stages], names),
        notes=tuple(dict.fromkeys(n for x in rounds for n in x.notes)),
        ranks=sum(x.ranks for x in rounds),
    )


def rank_facts(per_rank: list[list[OursRound]], decode: str) -> Ranks:
    """Per-rank medians (``per_rank[r]`` = rank r's rounds), the skew (slowest / fastest) and the stragglers."""
    facts = [
        RankFacts(
            r, summarise([x.throughput.figure(decode) for x in rounds]), summarise([x.first_batch_s for x in rounds])
        )
        for r, rounds in enumerate(per_rank)
    ]
    medians = [f.figure.median if f.figure else 0.0 for f in facts]
    mid = sorted(medians)[len(medians) // 2]
    return Ranks(
        len(facts),
        tuple(facts),
        min(medians) / max(medians) if max(medians) > 0 else None,
        tuple(r for r, m in enumerate(medians) if m < STRAGGLER * mid),
    )


if __name__ == "__main__":
    main()

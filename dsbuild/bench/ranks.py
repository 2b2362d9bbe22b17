"""Our loader runs in its own processes: ``--ranks W`` processes as data-parallel ranks r of W (W=1: one).

Why processes, even for one rank: a loader's speed varies from process to process more than from round
to round within one (thread placement, memory layout: the reason pyperf measures in worker processes;
here about +-10% in bytes mode against 1-3% within a process). Each round's ranks are fresh processes,
all started before the rounds (start-up), so the spread over rounds includes that variation and the
gate weighs drops against it. Beyond ``FRESH_LIMIT`` processes one set of ranks serves every round.

The ranks are forked by multiprocessing's fork server, which imports torch, PyAV and the loader once
(``PRELOAD``) before it forks any: each round's rank is still a new process, with its own threads, heap
and pages, but a run's start-up pays those imports once, not once a rank and round (torch alone took
1.5 s of CPU a process, and a 2-s run of five rounds spent 8 s on two cores). A server is safe after the
parent has started threads or CUDA; a fork of the parent itself is not. (The forks share the server's
address-space layout and hash seed; their pages, threads and placement are their own.)

Each rank is spoken to over a pipe in JSON documents: the parent sends the setup, then one document per
round (its slices); the rank answers with progress ticks and its ``OursRound`` as JSON (validated on
arrival, like any record) or with an error. Rounds start on every rank at once and the parent waits for
all of them, so rank rounds interleave with the baselines. Nothing of ours is pickled (multiprocessing
pickles its own process object for the fork server: this module's function by name, the pipe's end and
the log's descriptor). A rank ignores Ctrl-C (the parent handles it and ends the ranks), exits when its
pipe closes, and is killed when the fork server goes, which goes with the parent: none outlives it. What
a rank writes to stdout or stderr goes to a log of its own, whose last line names a rank that died.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from multiprocessing import forkserver, get_context, reduction

from dsbuild.bench.harness import OursRound
from dsbuild.bench.measure import Measured
from dsbuild.bench.stages import total
from dsbuild.bench.stats import Spread, summarise
from dsbuild.core import errors
from dsbuild.core.executor import last_words
from dsbuild.core.jsonio import loads_bounded
from dsbuild.core.records import Record

START_METHOD = "forkserver"  # see the module docstring
PRELOAD = ["dsbuild.bench.ranks", "dsbuild.bench.harness", "dsbuild.loader.pipeline", "numpy", "torch", "av"]
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


def start_server() -> None:
    """Start the fork server now (a run does before its own set-up, which the server's imports overlap)."""
    get_context(START_METHOD).set_forkserver_preload(PRELOAD)  # (where this process started one, it is kept)
    forkserver.ensure_running()


def cuda_available() -> bool:
    """Whether torch sees CUDA, asked of a process forked from the fork server, which has imported torch:
    a run whose own process has no other use for torch (bytes mode without the peers) never imports it
    (1.5 s of CPU a command). False where torch is not installed."""
    ctx = get_context(START_METHOD)
    start_server()
    mine, theirs = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_ask_cuda, args=(theirs,), name="dsbuild-bench-cuda")  # type: ignore[attr-defined]
    p.start()
    theirs.close()
    try:
        answer = loads_bounded(mine.recv_bytes(16), max_bytes=16, what="the CUDA probe")
    except (EOFError, OSError):
        p.join()
        raise errors.WorkerDied(f"the bench's CUDA probe exited (code {p.exitcode})") from None
    finally:
        mine.close()
    p.join()
    if not isinstance(answer, bool):
        raise errors.FormatError(f"the bench's CUDA probe answered {answer!r}, not true or false")
    return answer


def _ask_cuda(conn) -> None:
    try:
        import torch

        answer = torch.cuda.is_available()
    except ImportError:
        answer = False
    conn.send_bytes(json.dumps(answer).encode())


class RankGroup:
    """W processes running our loader as ranks r of W. ``start()`` launches them, ``ready()`` waits until
    they have opened the version (returning each one's step description), ``round(...)`` runs one round on
    all of them and returns their records; ``tick(name, elapsed, frames, bytes)`` hears rank 0's progress."""

    def __init__(self, setup: dict, world: int):
        self.setup, self.world = setup, world
        self.procs: list = []
        self.conns: list = []
        self.logs: list = []

    def start(self) -> None:
        ctx = get_context(START_METHOD)
        start_server()
        for r in range(self.world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (the rank's output, closed in stop())
            mine, theirs = ctx.Pipe(duplex=True)
            # (not a daemon: a rank's loader may start worker processes of its own)
            p = ctx.Process(  # type: ignore[attr-defined]
                target=serve, args=(theirs, _Fd(log.fileno())), name=f"dsbuild-bench-rank_{r}"
            )
            self.procs.append(p)
            self.conns.append(mine)
            self.logs.append(log)
            p.start()
            theirs.close()
            self._send(r, {**self.setup, "rank": r, "world": self.world})

    def ready(self) -> list[dict]:
        return [self._receive(r) for r in range(self.world)]

    def round(self, message: dict, tick=None) -> list[OursRound]:
        for r in range(self.world):
            self._send(r, message)
        return [
            OursRound.from_json(self._receive(r, tick if r == 0 else None), f"rank {r} round")
            for r in range(self.world)
        ]

    def stop(self) -> None:
        for p, conn in zip(self.procs, self.conns):
            conn.close()  # (a rank waiting for its next round exits; one measuring is ended)
            if p.is_alive():
                p.terminate()
        for p, log in zip(self.procs, self.logs):
            p.join()
            log.close()
        self.procs, self.conns, self.logs = [], [], []

    def _send(self, r: int, message: dict) -> None:
        try:
            self.conns[r].send_bytes(json.dumps(message).encode())
        except OSError:  # (a rank already gone: the answer awaited next names how it went)
            pass

    def _receive(self, r: int, tick=None):
        while True:
            p = self.procs[r]
            try:
                line = self.conns[r].recv_bytes(MAX_LINE)
            except (EOFError, OSError) as e:
                if not isinstance(e, EOFError):  # (a document past MAX_LINE: the rank is cut off)
                    p.terminate()
                p.join()
                said = last_words(self.logs[r])
                raise errors.WorkerDied(
                    f"bench rank {r} exited (code {p.exitcode})" + (f": {said}" if said else "")
                ) from None
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


class _Fd:
    """A descriptor handed to a process the fork server starts (as multiprocessing hands over a pipe's end)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def warm_up(o, data, device: str | None, rank: int, world: int) -> None:
    """Imports (torch, PyAV, the loader) and the index's first read happen at start-up, not in round 1."""
    from dsbuild.bench.harness import loader_kwargs
    from dsbuild.loader import Loader

    Loader(data.ref, o.split, **loader_kwargs(o, data.bucket_by, device, rank, world)).open()
    if o.decode == "frames":
        import av  # noqa: F401


def serve(conn, log: int) -> None:
    """A rank process: the setup, then one round a document, until its pipe closes."""
    from dsbuild.bench.dataset import describe
    from dsbuild.bench.harness import measure_ours
    from dsbuild.bench.options import BenchOptions
    from dsbuild.bench.step import Step
    from dsbuild.core.executor import _die_with_parent

    _die_with_parent(os.getppid(), ())  # (the fork server, which ends with the bench; Ctrl-C ignored)
    for fd in (1, 2):  # anything it or a library prints goes to its log, never to the parent's terminal
        os.dup2(log, fd)
    os.close(log)

    def answer(doc: dict) -> None:
        conn.send_bytes(json.dumps(doc).encode())

    def tick(meter) -> None:
        answer({"tick": [meter.name, meter.elapsed(), meter.frames, meter.bytes]})

    try:
        setup = json.loads(conn.recv_bytes())
        o = BenchOptions.from_json(setup["options"], "bench options")
        data = describe(setup["ref"], o.split)
        step = Step(o.step_ms, setup["device"])
        info = step.prepare()
        warm_up(o, data, setup["device"], setup["rank"], setup["world"])
        answer({"result": info.to_json()})
        while True:
            try:
                msg = json.loads(conn.recv_bytes())
            except EOFError:
                return
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

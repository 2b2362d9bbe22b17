"""Start W rank processes (``dsbuild.bench.train.worker``), hear them, and never hang on a dead one.

The parent watches every rank at once: the first rank to exit without its result (a signal, a crash, the
OOM killer) ends the run at once, naming its rank and its signal or exit code, and the other ranks (which
would block in their next collective until the collective timeout) are ended. A rank's own error is
reported once no peer has died within ``DEATH_GRACE_S`` (gloo's "connection closed by peer" is the
survivor's view of a death: the death is what gets named). A rank silent for longer
than the collective timeout plus a margin is reported as hung.
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from dsbuild.bench.ranks import ERRORS, MAX_LINE
from dsbuild.core import errors
from dsbuild.core.jsonio import loads_bounded

SILENCE_MARGIN_S = 60.0  # start-up (imports, the first step) beyond the collective timeout
DEATH_GRACE_S = 5.0  # after a rank's error, how long a peer's death (the likely cause) has to show


@dataclass
class Outcome:
    """What the ranks said: each one's result (by rank) and the keys of each step they trained, in order."""

    results: list[dict]
    trained: list[list[list[str]]] = field(default_factory=list)  # trained[rank][step] = that step's keys
    died: tuple[int, int] | None = None  # (rank, returncode) of a rank that died when that was expected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Job:
    """The W rank processes of one job, which may be kept for interleaved rounds: ``start`` spawns them and
    sends the setup (with ``rounds`` in it, waits until every rank says it is ready: warmed up, its peak
    measured, blocked on its input), ``round(k)`` has every rank run its round k and returns once all have,
    ``finish`` closes their input (they end and answer their results), ``close`` ends what is left. While
    it waits the job watches every rank: a death or a silence is named (see the module docstring)."""

    def __init__(self, setup: dict, world: int, timeout_s: float, expect_death: bool = False):
        self.setup, self.world, self.timeout_s, self.expect_death = setup, world, timeout_s, expect_death
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.sel = selectors.DefaultSelector()
        self.trained: list[list[list[str]]] = [[] for _ in range(world)]
        self.results: dict[int, dict] = {}
        self.marks: list[set[str]] = [set() for _ in range(world)]  # "ready", "round K": what each rank said
        self.buffers = dict.fromkeys(range(world), b"")
        self.reading: set[int] = set()
        self.failed: dict[int, Exception] = {}  # a rank's own error: often a peer's death seen from the other side
        self.first_failure: float | None = None

    def start(self) -> None:
        port = free_port()
        for r in range(self.world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
            spawned = time.time()
            p = subprocess.Popen(
                [sys.executable, "-m", "dsbuild.bench.train.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            self.procs.append(p)
            self.logs.append(log)
            self._send(p, {**self.setup, "rank": r, "world": self.world, "port": port, "spawned_at": spawned})
            self.sel.register(p.stdout, selectors.EVENT_READ, r)  # type: ignore[arg-type]  # (a pipe)
            self.reading.add(r)
        if self.setup.get("rounds"):
            self._wait(lambda: all("ready" in m for m in self.marks))

    def round(self, k: int) -> None:
        for p in self.procs:
            self._send(p, {"round": k})
        self._wait(lambda: all(f"round {k}" in m for m in self.marks))

    def finish(self) -> Outcome:
        for p in self.procs:
            if p.stdin is not None and not p.stdin.closed:
                p.stdin.close()
        died = self._wait(lambda: len(self.results) == self.world)
        if died is not None:
            return Outcome([self.results.get(i, {}) for i in range(self.world)], self.trained, died)
        return Outcome([self.results[r] for r in range(self.world)], self.trained)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p, log in zip(self.procs, self.logs):
            p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None and not pipe.closed:
                    try:
                        pipe.close()
                    except BrokenPipeError:
                        pass
            log.close()
        self.sel.close()

    def _send(self, p: subprocess.Popen, doc: dict) -> None:
        """One line to a rank (a rank already dead is named by the wait that follows, not here)."""
        try:
            p.stdin.write(json.dumps(doc).encode() + b"\n")  # type: ignore[union-attr]  # (a pipe)
            p.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass

    def _wait(self, done) -> tuple[int, int] | None:
        """Hear the ranks until ``done()``; with ``expect_death``, a rank's death ends the wait: (rank, code)."""
        last_heard = time.monotonic()
        while not done():
            for key, _ in self.sel.select(timeout=1.0):
                r = key.data
                chunk = key.fileobj.read1(1 << 16)  # type: ignore[union-attr]
                if not chunk:
                    self.sel.unregister(key.fileobj)
                    self.reading.discard(r)
                    continue
                last_heard = time.monotonic()
                self.buffers[r] += chunk
                if len(self.buffers[r]) > MAX_LINE:
                    raise errors.FormatError(f"rank {r}: a line longer than {MAX_LINE} bytes")
                *lines, self.buffers[r] = self.buffers[r].split(b"\n")
                for line in lines:
                    try:
                        _hear(r, loads_bounded(line, max_bytes=MAX_LINE, what=f"rank {r}"), self)
                    except Exception as e:
                        self.failed[r] = e
                        self.first_failure = self.first_failure or time.monotonic()
            for r, p in enumerate(self.procs):
                # dead once its output is read to the end (its result may still be in the pipe)
                if r not in self.results and r not in self.failed and p.poll() is not None and r not in self.reading:
                    if self.expect_death:
                        return r, p.returncode
                    raise errors.WorkerDied(
                        f"rank {r} of {self.world} died ({describe_exit(p.returncode)}) before its result"
                        + _tail(self.logs[r])
                        + f"; the other ranks were stopped (collective timeout {self.timeout_s:g} s, --timeout)",
                        hint="a rank killed by the OOM killer: fewer --ranks, a smaller --model or --batch-size",
                    )
            if self.first_failure is not None and time.monotonic() - self.first_failure > DEATH_GRACE_S:
                raise self.failed[min(self.failed)]
            if time.monotonic() - last_heard > self.timeout_s + SILENCE_MARGIN_S:
                raise errors.WorkerDied(
                    f"ranks silent for {self.timeout_s + SILENCE_MARGIN_S:g} s (collective timeout "
                    f"{self.timeout_s:g} s, --timeout): stopped",
                    hint="a larger --timeout for a slow first step",
                )
        return None


def run_ranks(setup: dict, world: int, timeout_s: float, expect_death: bool = False) -> Outcome:
    """Run one job of ``world`` ranks to its end (no rounds). ``expect_death``: a rank that dies ends the
    job quietly (the restart measurement kills one on purpose), its rank and code in ``Outcome.died``."""
    job = Job(setup, world, timeout_s, expect_death)
    try:
        job.start()
        return job.finish()
    finally:
        job.close()


def _hear(r: int, doc: dict, job: Job) -> None:
    if "trained" in doc:
        job.trained[r].append([str(k) for k in doc["trained"]["keys"]])
    elif "mark" in doc:
        job.marks[r].add(str(doc["mark"]))
    elif "error" in doc:
        if doc.get("kind") == "MemoryError":
            raise errors.StorageError(f"rank {r}: out of memory", hint="a smaller --model or --batch-size")
        cls = ERRORS.get(str(doc.get("kind")))
        message = f"rank {r}: {doc['error']}"
        if "timed out" in message.lower():  # a collective's timeout: a peer stuck or gone
            raise errors.WorkerDied(
                f"rank {r}: a collective timed out (--timeout): {doc['error'][:200]}",
                hint="a peer rank hung or died; a larger --timeout for slow steps",
            )
        if cls is None:
            raise RuntimeError(message)
        raise cls(message, hint=doc.get("hint"))
    else:
        job.results[r] = doc["result"]


def _tail(log) -> str:
    log.seek(0)
    lines = log.read()[-400:].decode(errors="replace").strip().splitlines()
    return f": {lines[-1]}" if lines else ""

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


def run_ranks(setup: dict, world: int, timeout_s: float, expect_death: bool = False) -> Outcome:
    """Run one job of ``world`` ranks to its end. ``expect_death``: a rank that dies ends the job quietly
    (the restart measurement kills one on purpose), its rank and code in ``Outcome.died``."""
    port = free_port()
    procs, logs = [], []
    sel = selectors.DefaultSelector()
    trained: list[list[list[str]]] = [[] for _ in range(world)]
    results: dict[int, dict] = {}
    buffers = dict.fromkeys(range(world), b"")
    try:
        for r in range(world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
            spawned = time.time()
            p = subprocess.Popen(
                [sys.executable, "-m", "dsbuild.bench.train.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            procs.append(p)
            logs.append(log)
            stdin, stdout = p.stdin, p.stdout
            assert stdin is not None and stdout is not None  # (both are pipes)
            stdin.write(json.dumps({**setup, "rank": r, "world": world, "port": port, "spawned_at": spawned}).encode())
            stdin.write(b"\n")
            stdin.close()
            sel.register(stdout, selectors.EVENT_READ, r)
        reading = set(range(world))
        last_heard = time.monotonic()
        failed: dict[int, Exception] = {}  # a rank's own error: often a peer's death seen from the other side
        first_failure = None
        while len(results) < world:
            events = sel.select(timeout=1.0)
            for key, _ in events:
                r = key.data
                chunk = key.fileobj.read1(1 << 16)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(key.fileobj)
                    reading.discard(r)
                    continue
                last_heard = time.monotonic()
                buffers[r] += chunk
                if len(buffers[r]) > MAX_LINE:
                    raise errors.FormatError(f"rank {r}: a line longer than {MAX_LINE} bytes")
                *lines, buffers[r] = buffers[r].split(b"\n")
                for line in lines:
                    try:
                        _hear(r, loads_bounded(line, max_bytes=MAX_LINE, what=f"rank {r}"), results, trained)
                    except Exception as e:
                        failed[r] = e
                        first_failure = first_failure or time.monotonic()
            for r, p in enumerate(procs):
                # dead once its output is read to the end (its result may still be in the pipe)
                if r not in results and r not in failed and p.poll() is not None and r not in reading:
                    if expect_death:
                        return Outcome([results.get(i, {}) for i in range(world)], trained, (r, p.returncode))
                    raise errors.WorkerDied(
                        f"rank {r} of {world} died ({describe_exit(p.returncode)}) before its result"
                        + _tail(logs[r])
                        + f"; the other ranks were stopped (collective timeout {timeout_s:g} s, --timeout)",
                        hint="a rank killed by the OOM killer: fewer --ranks, a smaller --model or --batch-size",
                    )
            if first_failure is not None and time.monotonic() - first_failure > DEATH_GRACE_S:
                raise failed[min(failed)]
            if time.monotonic() - last_heard > timeout_s + SILENCE_MARGIN_S:
                raise errors.WorkerDied(
                    f"ranks silent for {timeout_s + SILENCE_MARGIN_S:g} s (collective timeout {timeout_s:g} s, "
                    "--timeout): stopped",
                    hint="a larger --timeout for a slow first step",
                )
        return Outcome([results[r] for r in range(world)], trained)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p, log in zip(procs, logs):
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
            log.close()
        sel.close()


def _hear(r: int, doc: dict, results: dict, trained: list) -> None:
    if "trained" in doc:
        trained[r].append([str(k) for k in doc["trained"]["keys"]])
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
        results[r] = doc["result"]


def _tail(log) -> str:
    log.seek(0)
    lines = log.read()[-400:].decode(errors="replace").strip().splitlines()
    return f": {lines[-1]}" if lines else ""

"""Running independent pure tasks in parallel: local worker processes or a Ray cluster, one interface.

Validate (shard units), export and derived versions use ``run_tasks``; convert feeds a ``TaskPool``
(sessions, then the shards their samples complete, in one pool). Results come back by index or tag, so
callers merge them in a fixed order and the output never depends on which worker ran what or when.

Process hygiene: no worker outlives its parent. Each local worker asks the kernel for SIGKILL when its
parent dies (``PR_SET_PDEATHSIG`` on Linux; a watcher thread polling ``getppid`` elsewhere), so a
``kill -9`` of the parent, an OOM kill or a supervisor's SIGTERM leaves no process behind, and no
worker keeps holding the build folder's lock. A worker that dies (OOM killer) is a ``WorkerDied``
error naming the task, never a traceback.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import IO, Any, TypeVar, cast

from dsbuild.core.errors import MissingDependency, StorageError, UsageError, WorkerDied
from dsbuild.core.files import PARENT_ONLY_FDS

T = TypeVar("T")  # a task's item
R = TypeVar("R")  # its result

EXECUTORS = ("local", "ray")
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ExecutorSpec:
    kind: str = "local"  # local worker processes, or ray
    workers: int = 0  # processes (or Ray CPUs); 0 = one per core
    ray_address: str | None = None  # None: start a local Ray; "auto" or ray://host:10001 joins a cluster

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise UsageError(f"executor must be one of {', '.join(EXECUTORS)}, not {self.kind!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise UsageError(f"workers must be a whole number >= 0 (0 = one per core), not {self.workers!r}")

    @property
    def count(self) -> int:
        return self.workers or os.cpu_count() or 1


def last_words(log: IO[bytes], limit: int = 400) -> str:
    """The last line a process that died wrote to ``log`` (its stderr, kept in a file), from the file's
    last ``limit`` bytes alone; "" when it wrote none."""
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - limit))
    lines = log.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def _die_with_parent(parent: int, close_fds: tuple[int, ...]) -> None:
    """Worker initializer: SIGKILL when the parent dies; drop descriptors only the parent may hold."""
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):

        def watch() -> None:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="dsbuild-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the request above was in place
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


class TaskPool:
    """Tasks submitted while earlier ones run — a build learns its shard tasks from the sessions that
    finish — on local worker processes, in this process, or on Ray; ``next()`` returns one
    ``(tag, result)`` at a time in completion order (tasks finished together: in submission order).

    ``inline`` (or one local worker) runs each task in this process when it is submitted; ``started()``
    is then called on entry. With ``fork`` the first submit starts every worker, with the modules already
    imported (the caller must run no other threads until then); ``started()`` is called right after it,
    so a thread it starts runs beside the workers without being forked into them. A worker that dies is ``WorkerDied`` naming its task; an
    interrupt kills the workers instead of waiting for a task stuck in a blocking call.
    """

    def __init__(
        self,
        spec: ExecutorSpec,
        *,
        workers: int | None = None,
        inline: bool = False,
        start_method: str = "fork",
        started: Callable[[], None] | None = None,
    ):
        self.spec, self._started = spec, started
        self._workers = min(spec.count, workers or spec.count)
        self._inline = spec.kind == "local" and (inline or self._workers <= 1)
        self._start_method = start_method
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None  # the ray module (untyped), when this pool runs on Ray
        self._ray_started = False  # whether this pool started the local Ray it must stop
        self._remotes: dict[Callable, Any] = {}  # fn -> its (untyped) ray remote function
        self._running: dict[Any, tuple[int, object, str]] = {}  # Future or (untyped) ray ref -> (seq, tag, what)
        self._done: deque[tuple[object, object]] = deque()  # (tag, result) finished, not yet returned
        self._seq = 0
        self._interrupted = False

    def __enter__(self) -> TaskPool:
        if self.spec.kind == "ray":
            self._ray, self._ray_started = _ray_init(self.spec.ray_address, self.spec.workers or None)
        elif self._inline and self._started:  # nothing will fork
            self._started()
        return self

    @property
    def inline(self) -> bool:
        """Whether tasks run in this process, each when it is submitted."""
        return self._inline

    @property
    def pending(self) -> int:
        """Tasks submitted whose result ``next()`` has not returned yet."""
        return len(self._running) + len(self._done)

    def submit(self, fn: Callable, item, tag=None, describe: str = "") -> None:
        first = self._seq == 0
        self._seq += 1
        if self._inline:
            self._done.append((tag, fn(item)))
            return
        if self._ray is not None:
            task = self._remotes.get(fn)
            if task is None:
                task = self._remotes[fn] = self._ray.remote(max_retries=3)(fn)
            self._running[task.remote(item)] = (self._seq, tag, describe)
        else:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self._workers,
                    mp_context=get_context(self._start_method),
                    initializer=_die_with_parent,
                    initargs=(os.getpid(), tuple(PARENT_ONLY_FDS)),
                )
            self._running[self._pool.submit(fn, item)] = (self._seq, tag, describe)  # (the first forks them all)
        if first and self._started:
            self._started()

    def next(self) -> tuple[object, object]:
        """The next finished task's ``(tag, result)``; its exception is raised here."""
        if not self._done:
            if not self._running:
                raise LookupError("no task is pending")
            if self._ray is not None:
                [ref], _ = self._ray.wait(list(self._running), num_returns=1)
                _, tag, _ = self._running.pop(ref)
                self._done.append((tag, self._ray.get(ref)))
            else:
                self._collect()
        return self._done.popleft()

    def _collect(self) -> None:
        finished, _ = wait(self._running, return_when=FIRST_COMPLETED)
        done = sorted(finished, key=lambda f: self._running[f][0])
        broken = [f for f in done if isinstance(f.exception(), BrokenProcessPool)]
        if broken:
            names = ", ".join(self._running[f][2] for f in broken[:4]) + (", ..." if len(broken) > 4 else "")
            raise WorkerDied(
                f"a worker process died (killed by the OOM killer or a signal?) while working on "
                f"one of: {names}; nothing was committed",
                hint="run again, with fewer --workers if memory is short",
            )
        for fut in done:
            _, tag, _ = self._running.pop(fut)
            self._done.append((tag, fut.result()))

    def __exit__(self, exc_type, exc, tb) -> None:
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)  # Ctrl-C, SIGTERM
        try:
            if self._pool is not None:
                for fut in self._running:
                    fut.cancel()
                if interrupted:  # a worker stuck in a blocking call (a hung mount) would hold the exit forever
                    for process in list(getattr(self._pool, "_processes", {}).values()):
                        process.kill()
                self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if self._ray_started:
                self._ray.shutdown()


def run_tasks(
    fn: Callable[[T], R],
    items: Sequence[T],
    spec: ExecutorSpec,
    on_result: Callable[[int, R], None],
    *,
    start_method: str = "fork",
    describe: Callable[[T], str] = str,
    inline_below: int = 2,
    started: Callable[[], None] | None = None,
) -> None:
    """``fn(item)`` for every item; ``on_result(index, result)`` as each finishes (in completion order).

    With one worker, or fewer items than ``inline_below``, the tasks run in this process (see
    ``TaskPool`` for ``start_method`` and ``started``).
    """
    with TaskPool(
        spec, workers=len(items), inline=len(items) < inline_below, start_method=start_method, started=started
    ) as pool:
        for i, item in enumerate(items):
            pool.submit(fn, item, i, describe(item))
        while pool.pending:
            tag, result = pool.next()
            on_result(cast(int, tag), cast(R, result))  # the indices submitted above, and what fn returned


RAY_CONNECT_TIMEOUT = 5  # seconds for the cluster's address to accept a connection
RAY_PORTS = {"ray": 10001, "": 6379}  # Ray Client's port, the GCS's


def _reachable(address: str) -> None:
    """Refuse, at once, a cluster address nothing answers at (``ray.init`` retried for minutes, printing
    its own warnings, before giving up)."""
    import socket

    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":") if ":" in rest.rsplit("]", 1)[-1] else (rest, "", "")
    try:
        port_number = int(port) if port else RAY_PORTS.get(scheme, 6379)
        socket.create_connection((host.strip("[]") or "127.0.0.1", port_number), timeout=RAY_CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as e:
        raise StorageError(
            f"--ray-address {address}: cannot connect ({getattr(e, 'strerror', None) or e})",
            hint="start the cluster (`ray start --head`), or check the address",
        ) from None


def _ray_init(address: str | None, num_cpus: int | None):
    """(the ray module, whether a local Ray was started here and must be stopped): without an address a
    local Ray is started; with one the running cluster is joined. A task whose worker dies is retried by
    Ray (``max_retries``); exceptions raised by the task itself are not retried (they are deterministic
    and the callers turn them into reports)."""
    try:
        import ray
    except ImportError:
        raise MissingDependency("--executor ray", "ray") from None
    if ray.is_initialized():
        return ray, False
    if address and address not in ("auto", "local"):  # (Ray's names: a running cluster here, a new one)
        _reachable(address)
    try:
        joins = address not in (None, "", "local")  # (`local` starts a new instance: --workers applies)
        ray.init(
            address=address,
            num_cpus=None if joins else (num_cpus or os.cpu_count()),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    except ValueError as e:
        if "ray[client]" in str(e):
            raise MissingDependency(f"--ray-address {address}", "ray") from None
        raise
    except (ConnectionError, RuntimeError) as e:  # e.g. "auto" with no cluster running on this node
        where = f"--ray-address {address}" if address else "--executor ray"
        raise StorageError(
            f"{where}: cannot start or join a Ray cluster "
            f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})",
            hint="start one with `ray start --head`, or check the address",
        ) from None
    except BaseException:  # Ctrl-C while Ray starts: stop what it started (its agents outlived the command)
        ray.shutdown()
        raise
    return ray, True

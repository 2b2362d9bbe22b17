"""Running independent pure tasks in parallel: local worker processes or a Ray cluster, one interface.

Convert (sessions, shard assembly), validate (shard units) and export use ``run_tasks``; results come
back by index, so callers merge them in a fixed order and the output never depends on which worker
ran what or when.

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
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Callable, Sequence

from dsbuild.core.errors import MissingDependency, StorageError, UsageError, WorkerDied
from dsbuild.core.files import PARENT_ONLY_FDS

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


def run_tasks(fn: Callable, items: Sequence, spec: ExecutorSpec, on_result: Callable[[int, object], None], *,
              start_method: str = "fork", describe: Callable[[object], str] = str,
              inline_below: int = 2, started: Callable[[], None] | None = None) -> None:
    """``fn(item)`` for every item; ``on_result(index, result)`` as each finishes (in completion order).

    ``fork`` starts workers in milliseconds with the modules already imported (the caller must run no
    other threads while the pool forks); ``spawn`` starts clean interpreters. With one worker, or fewer
    items than ``inline_below``, the tasks run in this process. ``started()`` is called once the first
    task is submitted: with ``fork`` every worker has been forked by then, so a thread it starts runs
    beside them without being forked into them.
    """
    if spec.kind == "ray":
        if started:
            started()
        return ray_map(fn, items, address=spec.ray_address, num_cpus=spec.workers or None, on_result=on_result)
    workers = min(spec.count, len(items))
    if workers <= 1 or len(items) < inline_below:
        if started:
            started()
        for i, item in enumerate(items):
            on_result(i, fn(item))
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context(start_method),
                               initializer=_die_with_parent, initargs=(os.getpid(), tuple(PARENT_ONLY_FDS)))
    futures = {}
    interrupted = False
    try:
        for i, item in enumerate(items):
            futures[pool.submit(fn, item)] = i  # the first submit starts (forks) every worker
            if i == 0 and started:
                started()
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            broken = sorted((f for f in done if isinstance(f.exception(), BrokenProcessPool)), key=futures.get)
            if broken:
                names = ", ".join(describe(items[futures[f]]) for f in broken[:4]) + (", ..." if len(broken) > 4 else "")
                raise WorkerDied(f"a worker process died (killed by the OOM killer or a signal?) while working on "
                                 f"one of: {names}; nothing was committed",
                                 hint="run again, with fewer --workers if memory is short")
            for fut in sorted(done, key=futures.get):
                on_result(futures[fut], fut.result())
    except BaseException as e:
        interrupted = not isinstance(e, Exception)  # Ctrl-C, SIGTERM: stop the workers, do not wait
        raise
    finally:
        for fut in futures:
            fut.cancel()
        if interrupted:  # a worker stuck in a blocking call (a hung mount) would hold the exit forever
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


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
        raise StorageError(f"--ray-address {address}: cannot connect ({getattr(e, 'strerror', None) or e})",
                           hint="start the cluster (`ray start --head`), or check the address") from None


def ray_map(fn: Callable, items: Sequence, *, address: str | None = None, num_cpus: int | None = None,
            on_result: Callable[[int, object], None]) -> None:
    """``fn(item)`` for every item as Ray tasks; ``on_result(index, result)`` in completion order.

    Without an address a local Ray is started here and stopped afterwards; with one the running cluster
    is joined. A task whose worker dies is retried by Ray (``max_retries``); exceptions raised by the
    task itself are not retried (they are deterministic and the callers turn them into reports).
    """
    try:
        import ray
    except ImportError:
        raise MissingDependency("--executor ray", "ray") from None
    started = not ray.is_initialized()
    if started:
        if address and address not in ("auto", "local"):  # (Ray's names: a running cluster here, a new one)
            _reachable(address)
        try:
            joins = address not in (None, "", "local")  # (`local` starts a new instance: --workers applies)
            ray.init(address=address, num_cpus=None if joins else (num_cpus or os.cpu_count()),
                     include_dashboard=False, log_to_driver=False, configure_logging=False)
        except ValueError as e:
            if "ray[client]" in str(e):
                raise MissingDependency(f"--ray-address {address}", "ray") from None
            raise
        except (ConnectionError, RuntimeError) as e:  # e.g. "auto" with no cluster running on this node
            where = f"--ray-address {address}" if address else "--executor ray"
            raise StorageError(f"{where}: cannot start or join a Ray cluster "
                               f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})",
                               hint="start one with `ray start --head`, or check the address") from None
    try:
        task = ray.remote(max_retries=3)(fn)
        index = {task.remote(item): i for i, item in enumerate(items)}
        remaining = list(index)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            on_result(index[done[0]], ray.get(done[0]))
    finally:
        if started:
            ray.shutdown()

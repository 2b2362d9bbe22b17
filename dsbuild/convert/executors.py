"""Where per-session work runs: local processes or a Ray cluster. Both run the same pure
``process_session``; results are merged by session id afterwards, so the bytes do not depend on
which executor, which worker or in which order sessions finished."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Callable

from dsbuild.convert.session import SessionJob, SessionResult, process_session
from dsbuild.errors import UsageError

EXECUTORS = ("local", "ray")
OnResult = Callable[[SessionResult], None]


def run_local(jobs: list[SessionJob], workers: int, on_result: OnResult) -> None:
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            on_result(process_session(job))
        return
    # fork: workers start in milliseconds with the modules already imported. Safe because this process
    # runs no other threads while forking (the CLI's progress display refreshes from callbacks only).
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        futures = [pool.submit(process_session, job) for job in jobs]
        try:
            for fut in as_completed(futures):
                on_result(fut.result())
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def run_ray(jobs: list[SessionJob], address: str | None, workers: int | None, on_result: OnResult) -> None:
    """One Ray task per session. A task whose worker dies is retried by Ray (``max_retries``); a capture
    that fails deterministically comes back quarantined, exactly as locally. Without an address a local
    Ray is started (and stopped) here. The catalog folder must be visible to every node (shared storage)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'dsbuild[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else (workers or os.cpu_count()),
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(max_retries=3)(process_session)
        remaining = [task.remote(job) for job in jobs]
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            on_result(ray.get(done[0]))
    finally:
        if started:
            ray.shutdown()


def run(executor: str, jobs: list[SessionJob], workers: int, on_result: OnResult,
        ray_address: str | None = None) -> None:
    if executor == "ray":
        run_ray(jobs, ray_address, workers, on_result)
    elif executor == "local":
        run_local(jobs, workers, on_result)
    else:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")

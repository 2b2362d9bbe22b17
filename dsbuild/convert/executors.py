"""Where per-session work runs: local processes or a Ray cluster. Both run the same pure
``process_session``; results are merged by session id afterwards, so the bytes do not depend on
which executor, which worker or in which order sessions finished."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Callable

from dsbuild.convert.session import SessionJob, SessionResult, process_session
from dsbuild.errors import UsageError
from dsbuild.parallel import ray_map

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
    """One Ray task per session; a capture that fails deterministically comes back quarantined, exactly
    as locally. The catalog folder must be visible to every node (shared storage)."""
    ray_map(process_session, jobs, address=address, num_cpus=workers, on_result=lambda _, r: on_result(r))


def run(executor: str, jobs: list[SessionJob], workers: int, on_result: OnResult,
        ray_address: str | None = None) -> None:
    if executor == "ray":
        run_ray(jobs, ray_address, workers, on_result)
    elif executor == "local":
        run_local(jobs, workers, on_result)
    else:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")

"""Running independent pure tasks on a Ray cluster (convert's sessions, validate's shard units).

Ray is an optional extra; this module imports it only when asked. Without an address a local Ray is
started here and stopped afterwards; with one (``auto``, ``ray://host:10001``) the running cluster is
joined. A task whose worker process dies is retried by Ray (``max_retries``); exceptions raised by the
task itself are not retried (they are deterministic and the callers turn them into reports).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from dsbuild.errors import UsageError


def ray_map(fn: Callable, items: Sequence, *, address: str | None = None, num_cpus: int | None = None,
            on_result: Callable[[int, object], None]) -> None:
    """``fn(item)`` for every item as Ray tasks; ``on_result(index, result)`` in completion order."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'dsbuild[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else (num_cpus or os.cpu_count()),
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(max_retries=3)(fn)
        index = {}
        for i, item in enumerate(items):
            index[task.remote(item)] = i
        remaining = list(index)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            on_result(index[done[0]], ray.get(done[0]))
    finally:
        if started:
            ray.shutdown()

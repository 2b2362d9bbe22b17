"""No worker outlives its parent; a worker killed mid-task is a clear error, never a hang."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsbuild.core.errors import UsageError, WorkerDied
from dsbuild.core.executor import ExecutorSpec, run_tasks
from tests.helpers import alive

PARENT = """
import os, signal, sys
from dsbuild.core.executor import ExecutorSpec, run_tasks
def nap(i):
    open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w").close()
    signal.pause()  # busy until killed: only its parent's death may end it
run_tasks(nap, list(range(4)), ExecutorSpec(workers=2), lambda i, r: None)
"""


def _workers(folder: Path, n: int, proc) -> list[int]:
    for _ in range(600):
        pids = [int(p.name.split("-")[1]) for p in folder.glob("worker-*")]
        if len(pids) >= n:
            return pids
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise AssertionError("workers did not start")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_parent_leaves_no_worker_behind(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    pids = _workers(tmp_path, 2, proc)
    proc.send_signal(sig)
    proc.wait()
    for _ in range(200):
        if not any(alive(p) for p in pids):
            break
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), "a worker survived its parent"


def test_ctrl_c_stops_workers_stuck_in_a_task_instead_of_waiting_for_them(tmp_path):
    """Workers ignore SIGINT (the parent handles it); one stuck in a blocking call (a hung mount, a FIFO)
    used to hold the interrupted parent in its wait for the pool forever."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    pids = _workers(tmp_path, 2, proc)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)  # a hang guard, not a timing: it returns at once
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in proc.stderr.read()
    for _ in range(200):
        if not any(alive(p) for p in pids):
            break
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


def _suicide(i: int) -> int:
    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    return i


def test_a_worker_killed_mid_task_is_a_clear_error_naming_the_task():
    with pytest.raises(WorkerDied, match="item 2") as e:
        run_tasks(_suicide, [0, 1, 2, 3], ExecutorSpec(workers=2), lambda i, r: None, describe=lambda x: f"item {x}")
    assert "fewer --workers" in e.value.hint


def _square(x: int) -> int:
    return x * x


def test_results_come_back_by_index_for_any_worker_count():
    for workers in (1, 2, 3):
        got = {}
        run_tasks(_square, list(range(7)), ExecutorSpec(workers=workers), got.__setitem__)
        assert got == {i: i * i for i in range(7)}


def _events_of_five_tasks(workers: int) -> list:
    """("started", live worker processes) and ("result", index), in the order ``run_tasks`` made them."""
    events: list = []

    def started() -> None:
        events.append(("started", len(multiprocessing.active_children())))

    run_tasks(
        _square,
        list(range(5)),
        ExecutorSpec(workers=workers),
        lambda i, r: events.append(("result", i)),
        started=started,
    )
    return events


def test_started_is_called_once_the_workers_exist_and_before_any_result():
    """validate starts its shard hashing thread there: forking after it would copy a thread's locks."""
    for workers in (1, 2):
        events = _events_of_five_tasks(workers)
        assert events[0] == ("started", 0 if workers == 1 else workers)
        assert [e for e in events if e[0] == "started"] == [events[0]] and len(events) == 6
    events = []
    run_tasks(_square, [], ExecutorSpec(workers=2), lambda i, r: None, started=lambda: events.append("started"))
    assert events == ["started"]  # (validate joins the thread it starts: no shard to read is no exception)


@pytest.mark.parametrize("spec", [dict(workers=-1), dict(kind="threads")])
def test_bad_executor_settings_are_usage_errors(spec):
    with pytest.raises(UsageError):
        ExecutorSpec(**spec)


@pytest.mark.parametrize("address", ["ray://127.0.0.1:1", "127.0.0.1:1", "[::1]:1", "ray://[::1]:1"])
def test_a_ray_address_nothing_answers_at_is_refused_at_once(address):
    """(IPv6 addresses were split at their first colon.) Ray's own names are left to Ray: `auto` joins a
    cluster running on this node, `local` starts a new one."""
    from dsbuild.core.errors import StorageError
    from dsbuild.core.executor import _reachable

    with pytest.raises(StorageError, match=f"--ray-address {re.escape(address)}: cannot connect"):
        _reachable(address)


def test_an_interrupt_while_ray_starts_stops_what_it_started(monkeypatch):
    """Ctrl-C in the first seconds of `--executor ray` left Ray's dashboard and runtime-env agents running
    after the command exited 130: ray.init was interrupted and nothing stopped them."""
    ray = pytest.importorskip("ray")
    from dsbuild.core.executor import _ray_init

    stopped = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    with pytest.raises(KeyboardInterrupt):
        _ray_init(None, 1)
    assert stopped == [True]


def test_last_words_are_the_last_line_read_from_the_logs_end_alone(tmp_path):
    from dsbuild.core.executor import last_words

    log = tmp_path / "stderr"
    log.write_bytes(b"x" * 100_000 + b"\nTraceback ...\nMemoryError: out of memory\n\n")
    with open(log, "rb") as f:
        assert last_words(f) == "MemoryError: out of memory"
    log.write_bytes(b"a" * 600 + b"b" * 400)  # one long line: only its last 400 bytes are read
    with open(log, "rb") as f:
        assert last_words(f) == "b" * 400
    log.write_bytes(b"")
    with open(log, "rb") as f:
        assert last_words(f) == ""

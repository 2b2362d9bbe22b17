"""Worker processes: the same batches, order and checkpoints as threads for any number of them, resume
across modes, no shared memory left behind, and a dead worker is a named error."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dsbuild.core.errors import StorageError, UsageError, WorkerDied
from dsbuild.loader import Loader, Mixture
from dsbuild.loader.layout import dumps, loads
from dsbuild.loader.options import LoaderOptions
from dsbuild.loader.workers import HostPins, choose_mode, host_pins, lay_out, read_batch, write_batch

SHM = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm (Linux)")


def segments() -> set[str]:
    """This process's loader segments in /dev/shm (other test processes make theirs)."""
    return {n for n in os.listdir(SHM) if n.startswith(f"dsb{os.getpid():x}x")}


@pytest.fixture(autouse=True)
def no_segment_left():
    """Every test leaves no segment of its own (loaders other tests dropped are collected first)."""
    gc.collect()
    before = segments()
    yield
    assert not segments() - before


def test_a_dropped_loader_stops_its_workers_and_unlinks_its_segments(cat):
    loader = Loader(cat[0], decode="bytes", worker_mode="process", num_workers=2)
    next(iter(loader))
    made, procs = segments(), loader._held.processes._procs
    assert made
    del loader
    gc.collect()
    assert not made & segments() and not any(p.is_alive() for p in procs)


def same_batch(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k, x in a.items():
        y = b[k]
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), k
        elif k == "video":
            assert [bytes(v) for v in x] == [bytes(v) for v in y]
        elif k == "cu_seqlens":
            assert [v.tolist() for v in x] == [v.tolist() for v in y]
        else:
            assert x == y, k


def epoch(loader: Loader, n: int | None = None) -> tuple[list[dict], list[dict]]:
    """Batches (copied: a batch's memory is reused once it is dropped) and the checkpoint after each."""
    batches, states = [], []
    for b in loader:
        batches.append({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in b.items()})
        if "video" in b:
            batches[-1]["video"] = [bytes(v) for v in b["video"]]
        states.append(loader.state_dict())
        if n is not None and len(batches) == n:
            break
    return batches, states


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_processes_deliver_every_batch_and_checkpoint_of_threads(cat, workers):
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 3, "seed": 5, "num_workers": workers}
    with Loader(ref, worker_mode="thread", **kw) as threads, Loader(ref, worker_mode="process", **kw) as procs:
        for _ in range(2):  # two epochs: the workers persist, and the read-ahead crosses the epoch's end
            a, sa = epoch(threads)
            b, sb = epoch(procs)
            assert sa == sb and len(a) == len(b) > 3
            for x, y in zip(a, b):
                same_batch(x, y)
        stats = procs.stats()
        assert stats["workers"]["mode"] == "process" and stats["workers"]["processes"] == workers
        assert stats["workers"]["startup_seconds"] > 0 and stats["workers"]["shm_bytes"] > 0
        assert stats["batches"] == threads.stats()["batches"]
        assert sum(t.get("batches", 0) for n, t in stats["threads"].items() if "proc_" in n) >= stats["batches"]


def test_frames_and_packed_batches_are_those_of_threads(cat):
    ref, _ = cat
    for extra in ({"resize": (24, 32)}, {"resize": (24, 32), "pack_frames": 40}):
        kw = {"batch_size": 2, "seed": 3, "num_workers": 2, **extra}
        a, sa = epoch(Loader(ref, worker_mode="thread", **kw), 4)
        with Loader(ref, worker_mode="process", **kw) as procs:
            b, sb = epoch(procs, 4)
        assert sa == sb
        for x, y in zip(a, b):
            same_batch(x, y)


def test_a_mixture_of_samples_crosses_its_planned_items(cat):
    """mix="sample" steps carry their items (source, epoch, index each): they cross as JSON too."""
    ref, _ = cat
    sources = [(ref, None, 0.6), (ref, None, 0.4)]
    kw = {"decode": "bytes", "batch_size": 3, "seed": 2, "per": "sample", "policy": "stop"}
    a, sa = epoch(Mixture(sources, worker_mode="thread", num_workers=2, **kw))
    with Mixture(sources, worker_mode="process", num_workers=3, **kw) as procs:
        b, sb = epoch(procs)
    assert sa == sb and len(a) == len(b) > 3
    for x, y in zip(a, b):
        same_batch(x, y)


def test_a_checkpoint_resumes_across_modes_and_worker_counts(cat):
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 3, "seed": 5}
    full, states = epoch(Loader(ref, worker_mode="thread", num_workers=2, **kw))
    for mode, workers in (("process", 3), ("thread", 1), ("process", 1)):
        with Loader(ref, worker_mode="process", num_workers=2, **kw) as first:
            head, _ = epoch(first, 2)
            state = json.loads(json.dumps(first.state_dict()))
        assert state == states[1]
        with Loader(ref, worker_mode=mode, num_workers=workers, **kw) as resumed:
            resumed.load_state_dict(state)
            rest, _ = epoch(resumed)
        for x, y in zip(full, head + rest):
            same_batch(x, y)
        assert len(head + rest) == len(full)


def test_a_loop_begun_while_another_has_builds_under_way_gets_every_batch(cat):
    """Builds are collected by whoever waits for one: a second loop that finds every slot of a worker
    taken by the first loop's builds (left to finish) waits for the oldest, then goes on."""
    ref, _ = cat
    with Loader(ref, decode="bytes", batch_size=2, worker_mode="process", num_workers=2) as loader:
        first = iter(loader)
        next(first)
        got = [b["keys"] for b in loader]
        del first
    assert got == [b["keys"] for b in Loader(ref, decode="bytes", batch_size=2, num_workers=2)][1:]


def test_ctrl_c_while_a_batch_is_handed_over_gives_the_next_loop_new_workers(cat, monkeypatch):
    """The consumer reads the workers' answers itself, so Ctrl-C may land between reading one and giving
    it to its batch. The pool is then given up (a result lost there would leave its slot taken, and a
    later loop waiting for it forever): the next loop starts new workers and goes on where the
    interrupted one stopped."""
    from dsbuild.loader import workers

    ref, _ = cat
    expected = [b["keys"] for b in Loader(ref, decode="bytes", batch_size=2, num_workers=2)]
    real, calls = workers.loads, []

    def interrupted(data):
        calls.append(data)
        if len(calls) == 3:  # a worker's answer, read from its pipe and not yet given
            raise KeyboardInterrupt
        return real(data)

    with Loader(ref, decode="bytes", batch_size=2, worker_mode="process", num_workers=2) as loader:
        got, it = [], iter(loader)
        got.append(next(it)["keys"])
        first = loader._held.processes
        monkeypatch.setattr(workers, "loads", interrupted)
        with pytest.raises(KeyboardInterrupt):
            for batch in it:
                got.append(batch["keys"])
        monkeypatch.setattr(workers, "loads", real)
        got += [b["keys"] for b in loader]
        assert first.spent and loader._held.processes is not first
    assert got == expected


def test_a_batch_kept_by_the_consumer_never_changes(cat):
    """A consumer that keeps every batch (``list(loader)``) gets each in memory of its own: nothing waits
    for a slot, and nothing kept is overwritten."""
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 2, "seed": 1, "num_workers": 2, "prefetch": 1}
    expected, _ = epoch(Loader(ref, worker_mode="thread", **kw))
    with Loader(ref, worker_mode="process", **kw) as procs:
        kept = list(procs)
        for x, y in zip(expected, kept):
            same_batch(x, {**y, "video": [bytes(v) for v in y["video"]]})


_calls = 0


def fails_on_the_seventh_sample(sample: dict, rng) -> dict:
    """A map function that fails once in each worker process (its 7th sample: its third batch of 3)."""
    global _calls
    _calls += 1
    if _calls == 7:
        raise ValueError("a transient failure")
    return sample


def test_a_kept_batch_never_changes_when_the_build_after_it_fails(cat):
    """A build that fails in the segment the ring took away from a kept batch leaves that segment to the
    batch: the build after it gets a segment of its own too."""
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 3, "seed": 5, "num_workers": 1, "prefetch": 1}
    with Loader(ref, worker_mode="process", map=fails_on_the_seventh_sample, **kw) as procs:
        kept, it = [], iter(procs)
        with pytest.raises(ValueError, match="a transient failure"):  # (the class thread mode raises)
            for b in it:
                kept.append(b)
        assert len(kept) == 2
        before = [b["actions"].copy() for b in kept]
        for _, b in zip(range(3), procs):
            kept.append(b)
        for x, b in zip(before, kept):
            assert np.array_equal(x, b["actions"])


def test_auto_picks_processes_above_two_workers_and_says_why():
    assert choose_mode(LoaderOptions(num_workers=2))[0] == "thread"
    mode, why = choose_mode(LoaderOptions(num_workers=4))
    assert mode == "process" and "num_workers=4" in why
    assert choose_mode(LoaderOptions(num_workers=4, map=lambda s, rng: s))[0] == "thread"
    assert choose_mode(LoaderOptions(num_workers=4, map=tagged))[0] == "process"  # (a module's function)
    assert choose_mode(LoaderOptions(num_workers=1, worker_mode="process")) == ("process", "worker_mode='process'")


def test_worker_processes_share_the_cores_out_and_threads_keep_ffmpegs_choice(cat, monkeypatch):
    from dsbuild.formats.probe import decoder_threads

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for mode, threads in (("process", decoder_threads(3)), ("thread", 0)):
        with Loader(cat[0], decode="frames", resize=(32, 32), num_workers=3, worker_mode=mode) as loader:
            assert loader.open()._io()[1].threads == threads


def test_an_invalid_worker_mode_is_a_usage_error():
    with pytest.raises(UsageError, match="worker_mode must be one of"):
        LoaderOptions(worker_mode="fibers")
    with pytest.raises(UsageError, match="num_workers >= 1"):
        LoaderOptions(worker_mode="process", num_workers=0)


def test_a_map_without_an_import_path_is_a_usage_error(cat):
    ref, _ = cat
    loader = Loader(ref, decode="bytes", worker_mode="process", num_workers=1, map=lambda s, rng: s)
    with pytest.raises(UsageError, match=r"'package.module:function'\): a lambda") as e:
        next(iter(loader))
    assert "top level of a module" in e.value.hint and "worker_mode='thread'" in e.value.hint
    loader.close()


def tagged(sample: dict, rng) -> dict:
    """A map function with an import path (``tests.loader.test_workers:tagged``): seeded noise on actions."""
    sample["actions"] = sample["actions"] + rng.normal(size=sample["actions"].shape).astype(np.float32)
    return sample


def test_a_map_named_by_its_import_path_runs_in_the_workers(cat):
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 3, "seed": 4, "num_workers": 2, "map": tagged}
    a, _ = epoch(Loader(ref, worker_mode="thread", **kw), 3)
    with Loader(ref, worker_mode="process", **kw) as procs:
        b, _ = epoch(procs, 3)
    plain, _ = epoch(Loader(ref, worker_mode="thread", **{**kw, "map": None}), 1)
    assert not np.array_equal(plain[0]["actions"], a[0]["actions"])
    for x, y in zip(a, b):
        same_batch(x, y)


def test_a_segment_layout_round_trips_views_json_and_clips():
    batch = {
        "frames": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        "timestamps": np.linspace(0, 1, 6).reshape(2, 3),
        "empty": np.zeros((2, 0, 5), np.float32),
        "keys": ["a", "b"],
        "conditions": [{"x": "1"}, {}],
        "fps": [30.0, None],
        "video": [memoryview(b"abc"), b"de"],
        "cu_seqlens": [np.array([0, 2, 3], np.int32), np.array([0, 3], np.int32)],
    }
    header, payloads, size = lay_out(batch, {"held": {"counts": {"batches": 1}}})
    root = np.zeros(size, np.uint8)
    write_batch(root, header, payloads)
    out, extra = read_batch(root)
    assert extra == {"held": {"counts": {"batches": 1}}}
    same_batch(batch, out)
    assert np.shares_memory(out["frames"], root)


class NotOurs(Exception):
    pass


def test_a_workers_error_is_raised_with_the_class_thread_mode_raises():
    """dsbuild's errors by their classes (those with other constructors and those outside ``errors``
    too), message and hint kept; built-in exceptions (a map function's) by theirs, the worker's
    traceback as the message; any other class is a RuntimeError saying so."""
    from dsbuild.core.errors import CaptureError, MissingDependency
    from dsbuild.core.files import UnsafeFile
    from dsbuild.loader.workers import _error, error_fields

    def raised(e: Exception) -> Exception:
        try:
            raise e
        except Exception as caught:
            return _error(*loads(dumps(error_fields(caught))), worker=0)

    for e in (
        UnsafeFile("shards/x.tar: a symlink", hint="h"),
        MissingDependency("device='cuda'", "torch"),
        CaptureError("s1/session.json", "no video"),
        StorageError("disk full", hint="free some"),
    ):
        got = raised(e)
        assert (type(got), str(got), got.hint) == (type(e), str(e), e.hint)
    got = raised(ValueError("a transient failure"))
    assert type(got) is ValueError and "a transient failure" in str(got) and "Traceback" in str(got)
    got = raised(NotOurs("mine"))
    assert type(got) is RuntimeError and "NotOurs: mine" in str(got)
    for kind in ("os:system", "builtins:StopIteration", "builtins:UnicodeDecodeError"):
        assert type(_error(kind, "x", None, 0)) is RuntimeError  # (dsbuild's and plain built-in classes only)


def test_json_orjson_refuses_reads_back_as_a_thread_would_have_it():
    """Headers are read with orjson, which refuses NaN, Infinity and integers past 64 bits: a map's
    metadata may hold them, and a batch must not change on its way out of a worker process."""
    batch = {"score": [float("nan"), float("-inf"), 2**70, 0.1]}
    header, payloads, size = lay_out(batch, {})
    root = np.zeros(size, np.uint8)
    write_batch(root, header, payloads)
    score = read_batch(root)[0]["score"]
    assert np.isnan(score[0]) and score[1:] == [float("-inf"), 2**70, 0.1]


def test_shared_memory_in_use_counts_a_held_batchs_segment_until_it_is_dropped(cat):
    """A batch held while its slot is built into again keeps its segment (the slot gets a new one):
    ``shm_bytes`` counts it until the batch is dropped, then stops counting it."""
    with Loader(cat[0], decode="bytes", batch_size=2, worker_mode="process", num_workers=1, prefetch=1) as loader:
        it = iter(loader)
        held = next(it)
        for _ in range(4):
            next(it)
        with_held = loader.stats()["workers"]["shm_bytes"]
        del held
        for _ in range(2):
            next(it)
        assert loader.stats()["workers"]["shm_bytes"] < with_held


def test_shm_bytes_too_small_names_the_size_needed_and_the_option(cat):
    ref, _ = cat
    with Loader(ref, decode="bytes", worker_mode="process", num_workers=1, shm_bytes=1) as loader:
        with pytest.raises(StorageError, match=r"needs a [0-9.]+ MiB segment.*shm_bytes") as e:
            next(iter(loader))
        assert "prefetch" in e.value.hint


def test_a_killed_worker_is_a_named_error_and_leaves_no_segment(cat):
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=2, worker_mode="process", num_workers=2, prefetch=1)
    it = iter(loader)
    next(it)
    pids = [p.pid for p in loader._held.processes._procs]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDied, match=r"loader worker process 1 \(pid [0-9]+\) died: killed by SIGKILL"):
        for _ in it:
            pass
    loader.close()


def test_workers_start_while_this_process_holds_descriptors_only_it_may_hold(cat):
    """A build folder's lock is closed in convert's forked workers (``PARENT_ONLY_FDS``); the loader's
    workers, forked from a fork server that never had it, have other files under those numbers."""
    from dsbuild.core.files import PARENT_ONLY_FDS

    held = set(range(3, 64)) - PARENT_ONLY_FDS
    PARENT_ONLY_FDS.update(held)
    try:
        with Loader(cat[0], decode="bytes", batch_size=2, worker_mode="process", num_workers=2) as procs:
            assert len(list(procs)) > 2
    finally:
        PARENT_ONLY_FDS.difference_update(held)


def test_closing_a_loader_leaves_another_loaders_segments_alone(cat, monkeypatch):
    """The 1st pool of a process and its 16th (0x10): closing the first unlinks none of the other's."""
    from dsbuild.loader.workers import ProcessWorkers

    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 2, "worker_mode": "process", "num_workers": 1, "prefetch": 1}
    monkeypatch.setattr(ProcessWorkers, "_count", 0)
    first = Loader(ref, **kw)
    next(iter(first))
    monkeypatch.setattr(ProcessWorkers, "_count", 15)
    with Loader(ref, **kw) as other:
        it = iter(other)
        kept = [next(it)]
        theirs = {n for n in segments() if n.startswith(other._processes().prefix)}
        first.close()
        assert theirs and theirs <= segments()
        kept += list(it)  # (kept: each further batch takes a fresh segment, the old one let go)
        assert len(kept) > 2


def test_a_forked_child_leaves_the_parents_workers_and_segments_alone(cat):
    ref, _ = cat
    kw = {"decode": "bytes", "batch_size": 2, "num_workers": 1}
    expected = [b["keys"] for b in Loader(ref, worker_mode="thread", **kw)]
    loader = Loader(ref, worker_mode="process", **kw)
    it = iter(loader)
    first = next(it)["keys"]
    pid = os.fork()
    if pid == 0:  # (a fork-started DataLoader worker holds such a copy, and closes it when it ends)
        loader.close()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert [first] + [b["keys"] for b in it] == expected
    loader.close()


FORK = textwrap.dedent(
    """
    import json, os, sys
    from dsbuild.core.errors import UsageError
    from dsbuild.loader import Loader
    loader = Loader(sys.argv[1], decode="bytes", batch_size=2, worker_mode="process", num_workers=2)
    it = iter(loader)
    got = [next(it)["keys"]]
    pid = os.fork()
    if pid == 0:  # the parent's loop goes on only in the parent: its workers and pipes are the parent's
        try:
            next(it)
        except UsageError as e:
            if "only in the process that began it" not in str(e):
                sys.exit(4)
        else:
            sys.exit(5)
        ours = sum(1 for _ in loader)  # a new loop: workers of the child's own, from its own fork server
        loader.close()
        sys.exit(0 if ours > 0 else 6)  # (a plain exit: the interpreter's exit handlers, multiprocessing's, run)
    assert os.waitpid(pid, 0)[1] == 0
    got += [b["keys"] for b in it]
    print(json.dumps(got), flush=True)
    """
)


def test_a_forked_child_that_exits_leaves_the_parents_workers_running(cat):
    """multiprocessing ends its daemon children at exit, and a child forked by ``os.fork`` inherits its
    list of them: it must not end the parent's workers. Nor may the child go on with the parent's loop
    (it would send builds to the parent's workers and take their results): that is a UsageError; a new
    loop there starts workers of the child's own, and the parent gets every batch."""
    expected = [b["keys"] for b in Loader(cat[0], decode="bytes", batch_size=2, num_workers=2)]
    p = subprocess.run([sys.executable, "-c", FORK, cat[0]], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and json.loads(p.stdout) == expected, p.stdout + p.stderr[-2000:]


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from dsbuild.loader import Loader, Mixture
    loader = Loader(sys.argv[1], decode="bytes", batch_size=2, worker_mode="process", num_workers=2)
    it = iter(loader)
    next(it)
    print(" ".join(n for n in os.listdir("/dev/shm") if n.startswith(f"dsb{os.getpid():x}x")), flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
    """
)


CYCLE = textwrap.dedent(
    """
    import gc, json, os, sys, time
    from dsbuild.loader import Loader, workers

    class Trainer:  # a loader in a reference cycle: the cyclic garbage collector frees it
        def __init__(self, ref):
            self.loader = Loader(ref, decode="bytes", batch_size=2, worker_mode="process", num_workers=2)
            self.it, self.me = iter(self.loader), self
            next(self.it)  # builds under way now

    read = workers.ProcessWorkers._collect_one

    def collect_one(pool, r):  # a collection here, as any allocation here may run one
        gc.collect()
        return read(pool, r)

    workers.ProcessWorkers._collect_one = collect_one
    prefix = f"dsb{os.getpid():x}x"
    t = Trainer(sys.argv[1])
    loader = t.loader
    gc.disable()
    del t  # (its loop, in the cycle, is freed inside the next loop's first collection)
    keys = [b["keys"] for b in loader]  # another loop of the same loader: its builds and the freed one's
    loader.close()
    for _ in range(600):  # (a hang guard, not a time limit: this ends within a second when it works)
        left = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        if not left:
            print(json.dumps(keys), flush=True)
            break
        time.sleep(0.1)
    else:
        print("stuck", left, flush=True)
    """
)


def test_a_loop_freed_by_the_garbage_collector_while_batches_are_collected_ends_cleanly(cat):
    """Garbage collection runs wherever Python allocates: here, while the consumer collects its batches
    from the workers' pipes. The loop it frees (of the same loader) must not wait there for its builds,
    which only this collection resolves: it lets them go, and the other loop gets every batch after the
    one the freed loop took (a loop goes on from the loader's position)."""
    expected = [b["keys"] for b in Loader(cat[0], decode="bytes", batch_size=2, num_workers=2)][1:]
    p = subprocess.run([sys.executable, "-c", CYCLE, cat[0]], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and json.loads(p.stdout) == expected, p.stdout + p.stderr[-2000:]
    assert "Exception ignored" not in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("how", ["kill", "interrupt"])
def test_no_segment_is_left_after_a_crash_or_ctrl_c(cat, how):
    ref, _ = cat
    r = subprocess.run([sys.executable, "-c", CHILD, ref, how], capture_output=True, text=True, timeout=120)
    made = set(r.stdout.split())
    assert made, r.stderr
    assert r.returncode == (-signal.SIGKILL if how == "kill" else -signal.SIGINT), r.stderr
    if how == "interrupt":
        assert "KeyboardInterrupt" in r.stderr
    # after a kill -9 the resource tracker unlinks what the workers made once they are gone
    for _ in range(100):
        if not made & set(os.listdir(SHM)):
            break
        subprocess.run(["sleep", "0.1"])
    assert not made & set(os.listdir(SHM))


def test_on_cpu_no_segment_is_pinned_and_stats_say_so(cat):
    ref, _ = cat
    with Loader(ref, decode="bytes", batch_size=2, worker_mode="process", num_workers=1) as loader:
        next(iter(loader))
        assert loader.stats()["workers"]["pinned"] is False
    assert host_pins(None) is None and host_pins("cpu") is None
    assert host_pins("cuda:0") is not None  # (its calls are CUDA's: checked on a GPU by gpu.sh)


class Registrations:
    """Stands in for CUDA's cudaHostRegister / cudaHostUnregister: which addresses are registered now."""

    def __init__(self) -> None:
        self.now: dict[int, int] = {}
        self.ever = 0

    def register(self, address: int, size: int) -> None:
        assert address not in self.now
        self.now[address] = size
        self.ever += 1

    def unregister(self, address: int) -> None:
        del self.now[address]

    def holding(self, a: np.ndarray) -> bool:
        at = a.ctypes.data
        return any(start <= at < start + size for start, size in self.now.items())


def test_segments_bound_for_cuda_stay_registered_while_a_batch_uses_them_and_no_longer(cat, monkeypatch):
    """With batches bound for CUDA each segment the consumer maps is registered as pinned host memory
    (``workers.host_pins``; its two CUDA calls are watched here on CPU) and unregistered once its slot
    has moved on and no batch from it is alive: never while a batch can still be copied from it."""
    ref, _ = cat
    cuda = Registrations()
    monkeypatch.setattr("dsbuild.loader.workers.host_pins", lambda device: HostPins(cuda.register, cuda.unregister))
    kw = {"decode": "bytes", "batch_size": 2, "seed": 3, "num_workers": 2, "prefetch": 1}
    with Loader(ref, worker_mode="process", **kw) as loader:
        for b in loader:  # batches dropped as they come: each ring's segments reused, registered once
            assert cuda.holding(b["actions"])
        del b
        assert loader.stats()["workers"]["pinned"] is True and 0 < cuda.ever <= 2 * 2  # workers x slots
        kept = list(loader)  # (every batch kept: segments leave their rings, still registered)
        assert all(cuda.holding(b["actions"]) for b in kept)
    assert cuda.now and all(cuda.holding(b["actions"]) for b in kept)  # closed: kept batches still pinned
    del kept
    gc.collect()
    assert not cuda.now and cuda.ever >= 2  # every registration undone once its batches are gone

"""The loader's worker processes: whole batches built in other processes, handed over in shared memory.

Threads cannot use a node's cores: the per-sample Python of a batch holds the GIL. With
``worker_mode="process"`` (``"auto"`` picks it for more than two workers) each of ``num_workers``
processes builds whole batches — never single samples: one hand-off a batch — into a ring of shared
memory segments it owns, ``prefetch + 1`` of them (``prefetch`` batches built ahead, and the one the
consumer holds). The consumer maps each segment once and delivers numpy views of it (``torch.from_numpy``
on the torch path): no copy. A segment is written again only once every view of the batch in it is gone
(the rule of the loader's pooled buffers); a consumer that keeps more batches than that gets them
in segments of their own, which the worker replaces in its ring (``fresh``), so nothing a user holds ever
changes and nothing waits for it.

Batch j is a pure function of (seed, versions, splits, order options, j): the consumer walks the stream as
in thread mode and sends worker ``k % N`` the k-th step it needs, as a few numbers; it takes the batches
back in the order it sent them. So batches, their order and every ``state_dict()`` are those of thread
mode for any N, and a checkpoint resumes across modes and worker counts.

Nothing is pickled by dsbuild. A worker is given one JSON document when it starts (``description.WorkerSpec``:
the sources, every option as JSON, the map function by its import path ``"package.module:function"``,
which the worker imports); control messages are JSON over pipes (a step's indices; "done" with the
segment's name); the batch's arrays, clips and a JSON header (its metadata, the counts it held, the
seconds it took) are in the segment.

Processes start from a fork server (``forkserver``): a clean process started once, without the parent's
threads or CUDA context, forks each worker with numpy and dsbuild already imported — safe after the
parent initialised CUDA or started threads (a plain ``fork`` is not), and quicker than ``spawn`` or a
``subprocess`` running ``python -m``, which import everything again in every worker (≈ 0.5 s each here,
against a few milliseconds a fork). multiprocessing sends the fork server its ``Process`` object, which
it pickles itself: it holds only ``_serve`` (a module's function, by name), the description as a string
and the worker's end of its pipe (multiprocessing's own ``Connection``, passed as a file descriptor).
The fork server would run the parent's script (``__main__``) again to start; workers need nothing of it
(a map function is never taken from ``__main__``), so it is left out (``_main_left_out``).

Workers start on first use, stay for every epoch until ``close()``, and die with the parent
(``PR_SET_PDEATHSIG``, as convert's do). A worker that dies is a ``WorkerDied`` naming it and how it
died, never a hang. A segment that would not fit in ``/dev/shm`` is a ``StorageError`` naming the size
it needs and the options that lower it (it is allocated up front, so a full ``/dev/shm`` never surfaces
as a SIGBUS mid-copy). ``close()`` (or the loader's collection, or the interpreter's exit) unlinks every
segment; after a crash of the parent, multiprocessing's resource tracker unlinks what the workers
created.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import mmap
import os
import selectors
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import connection, get_context
from multiprocessing import resource_tracker as _tracker
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from dsbuild.core.errors import DsbuildError, StorageError, UsageError, WorkerDied
from dsbuild.core.executor import _die_with_parent
from dsbuild.loader.description import WorkerSpec, describe, import_path, rebuild
from dsbuild.loader.device import resolve_device
from dsbuild.loader.layout import dumps, lay_out, loads, read_batch, write_batch
from dsbuild.loader.options import LoaderOptions
from dsbuild.loader.passes import decode, encode
from dsbuild.loader.walk import SampleRef, Step

if TYPE_CHECKING:
    from dsbuild.loader.stats import Stats


class Builder(Protocol):
    """What a pool needs of its loader (a ``pipeline.Mixture``, not imported: the pipeline imports this
    module): its options, and in each worker, to open it and build the batch of a step."""

    options: LoaderOptions

    def open(self) -> Any: ...

    def _io(self) -> Any: ...

    def stats(self) -> dict: ...

    def _build_held(self, step: Step) -> tuple[dict, dict]: ...


START_METHOD = "forkserver"  # see the module docstring
MIB = 1 << 20
SHM_DIR = "/dev/shm"


# -- which mode --------------------------------------------------------------------------------------
def choose_mode(o: LoaderOptions) -> tuple[str, str]:
    """("thread" or "process", why): ``worker_mode`` as given, or what ``"auto"`` picks."""
    if o.worker_mode != "auto":
        return o.worker_mode, f"worker_mode={o.worker_mode!r}"
    if o.num_workers <= 2:
        return "thread", f"auto: num_workers={o.num_workers} <= 2, threads overlap decoding and reads without hand-offs"
    if o.map is not None:
        try:
            import_path(o.map)
        except UsageError:
            return "thread", "auto: map has no import path ('package.module:function') a worker process could import"
    return "process", f"auto: num_workers={o.num_workers} > 2, processes use the cores the GIL keeps threads from"


# -- messages ------------------------------------------------------------------------------------------
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Step))


def step_to_json(step: Step) -> dict:
    out: dict[str, Any] = {}
    for name in _STEP_FIELDS:
        v = getattr(step, name)
        if name == "after":
            v = encode(v)
        elif name == "items" and v is not None:
            v = [[list(r) for r in item] for item in v]
        out[name] = v
    return out


def step_from_json(v: dict) -> Step:
    items = v.get("items")
    return Step(
        **{
            **v,
            "after": decode(v["after"]),
            "items": None if items is None else tuple(tuple(SampleRef(*r) for r in item) for item in items),
        }
    )


# -- the worker process ------------------------------------------------------------------------------
def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


class Ring:
    """A worker's segments, one per slot, made (and remade larger) as batches need. A segment the consumer
    gave to a batch it keeps is let go (``drop``) and never written again."""

    def __init__(self, prefix: str, slots: int, budget: int | None, worker: int):
        self.prefix, self.budget, self.worker = prefix, budget, worker
        self.segments: list[SharedMemory | None] = [None] * slots
        self.made = 0

    def in_use(self) -> int:
        return sum(s.size for s in self.segments if s is not None)

    def drop(self, slot: int) -> None:
        """Let ``slot``'s segment go (the consumer keeps its own mapping for as long as a batch in it lives)."""
        old, self.segments[slot] = self.segments[slot], None
        if old is not None:
            old.close()
            old.unlink()

    def segment(self, slot: int, need: int) -> SharedMemory:
        old = self.segments[slot]
        if old is not None and old.size >= need:
            return old
        size = -(-need * 5 // 4 // MIB) * MIB  # a quarter more, whole MiBs: a batch a little larger fits
        after = self.in_use() - (old.size if old is not None else 0) + size
        how = (
            f"worker {self.worker}'s ring needs a {_mib(size)} segment ({_mib(after)} in all; "
            f"{len(self.segments)} slots = prefetch + 1)"
        )
        hint = "lower prefetch or batch_size, or num_workers, or use worker_mode='thread'"
        if self.budget is not None and after > self.budget:
            raise StorageError(
                f"{how}: over shm_bytes / num_workers = {_mib(self.budget)}", hint=f"raise shm_bytes; or {hint}"
            )
        self.made += 1
        seg = SharedMemory(name=f"{self.prefix}w{self.worker}n{self.made}", create=True, size=size)
        try:
            os.posix_fallocate(seg._fd, 0, size)  # type: ignore[attr-defined]
        except OSError as e:
            seg.close()
            seg.unlink()
            raise StorageError(
                f"{how}, but shared memory ({SHM_DIR}) refused it: {e.strerror}",
                hint=f"{hint}; in a container, give it more (docker run --shm-size=...)",
            ) from None
        self.drop(slot)
        self.segments[slot] = seg
        return seg

    def close(self) -> None:
        for seg in self.segments:
            if seg is not None:
                seg.close()
                seg.unlink()
        self.segments = [None] * len(self.segments)


def _serve(text: str, conn) -> None:
    """A worker process: build the batches the parent names, each into a slot of its ring. ``text`` is its
    ``WorkerSpec``. Its parent is the fork server, which exits when the loader's process does; a closed
    pipe ends it too."""
    spec = WorkerSpec.read(text)
    # (no descriptor of the loader's process to drop: the fork server that forked this one was started
    # with only its own, unlike convert's forked workers)
    _die_with_parent(os.getppid(), ())
    ring = Ring(spec.prefix, spec.slots, spec.budget, spec.worker)
    try:
        try:
            loader = rebuild(spec)
            loader.open()
            loader._io()
        except DsbuildError as e:
            conn.send_bytes(dumps(["error", -1, *error_fields(e)]))
            return
        conn.send_bytes(dumps(["ready", os.getpid()]))
        seconds = dict(loader.stats()["seconds"])
        while True:
            try:
                msg = loads(conn.recv_bytes())
            except EOFError:
                return
            if msg[0] == "stop":
                return
            _, seq, slot, fresh, step = msg
            if fresh:  # (before the build: one that fails must not leave the segment to the next)
                ring.drop(slot)
            try:
                batch, held = loader._build_held(step_from_json(step))
                now = loader.stats()["seconds"]
                spent = {k: v - seconds.get(k, 0.0) for k, v in now.items() if v != seconds.get(k, 0.0)}
                seconds = dict(now)
                header, payloads, size = lay_out(batch, {"held": held, "seconds": spent})
                seg = ring.segment(slot, size)
                root = np.ndarray((seg.size,), np.uint8, buffer=seg.buf)
                write_batch(root, header, payloads)
                del root, batch, payloads
                conn.send_bytes(dumps(["done", seq, slot, seg.name, seg.size, ring.in_use()]))
            except Exception as e:
                conn.send_bytes(dumps(["error", seq, *error_fields(e)]))
    finally:
        ring.close()


def error_fields(e: Exception) -> list:
    """(class, message, hint) of a worker's error for the consumer: a dsbuild error's class by import path,
    its message and hint; a built-in exception's (a map function's ValueError) by name, with the worker's
    traceback as its message; anything else ``"internal"``, with the traceback."""
    cls = type(e)
    if isinstance(e, DsbuildError) and cls.__module__.startswith("dsbuild."):
        return [f"{cls.__module__}:{cls.__qualname__}", str(e), e.hint]
    kind = f"builtins:{cls.__qualname__}" if cls.__module__ == "builtins" else "internal"
    return [kind, "".join(traceback.format_exception(e, limit=8)), None]


# -- the consumer's side -----------------------------------------------------------------------------
def _error_class(kind: str) -> type[Exception] | None:
    """The class ``error_fields`` named: a dsbuild error, or a built-in exception; None for anything else."""
    module, _, name = kind.partition(":")
    if module == "builtins":  # (not StopIteration: raised out of a loop's next batch it would end the loop)
        cls = getattr(builtins, name, None)
        ok = isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, StopIteration)
        return cls if ok else None
    if not module.startswith("dsbuild.") or not name.isidentifier():
        return None
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, DsbuildError) else None


def _error(kind: str, message: str, hint: str | None, worker: int) -> Exception:
    """A worker's error as raised in the consumer: of the class thread mode would raise (a dsbuild error
    made without its ``__init__``, whose arguments differ by class: the message and hint are the
    worker's), else (a bug) a RuntimeError."""
    cls = _error_class(kind)
    if cls is not None and issubclass(cls, DsbuildError):
        e = cls.__new__(cls)
        Exception.__init__(e, message)
        e.hint = hint
        return e
    if cls is not None:
        try:
            return cls(message)
        except TypeError:  # (a built-in one of other arguments: UnicodeDecodeError)
            pass
    return RuntimeError(f"loader worker process {worker} failed:\n{message}")


def _closed() -> UsageError:
    return UsageError("the loader was closed while this batch was being built")


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "its pipe closed"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}" + (" (the OOM killer?)" if exitcode == -signal.SIGKILL else "")
    return f"exit code {exitcode}"


def unlink_prefix(prefix: str) -> int:
    """Unlink every segment named with ``prefix`` (a worker killed before it could); how many."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    for n in names:
        try:
            import _posixshmem

            _posixshmem.shm_unlink("/" + n)
        except OSError:
            continue
        try:
            _tracker.unregister("/" + n, "shared_memory")
        except Exception:
            pass
    return len(names)


def _map(name: str, size: int) -> mmap.mmap:
    """The segment ``name`` mapped into this process (the mapping outlives the name: see ``close``)."""
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def cuda_register(address: int, size: int) -> None:
    """``cudaHostRegister`` (portable, as torch's own helper): the pages become pinned host memory, so
    host->device copies from them are DMA, non-blocking, without a staging copy."""
    import torch

    err = int(torch.cuda.cudart().cudaHostRegister(address, size, 1))
    if err != 0:
        raise StorageError(f"cudaHostRegister of a {_mib(size)} worker segment failed (cudaError {err})")


def cuda_unregister(address: int) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(address)


class HostPins:
    """The consumer's segment mappings registered as pinned host memory (batches bound for CUDA).

    A mapping is registered when the consumer maps it (``add``) and unregistered once its slot has moved
    on to another segment (``retire``; the pool's ``close`` retires all) *and* no batch from it is alive
    (``hold`` counts each batch's root array until it is collected). This keeps the mapping itself until
    then, so it is never closed while registered. ``register`` and ``unregister`` are ``cuda_register``
    and ``cuda_unregister`` (tests watch them on CPU). A registration CUDA refuses leaves that mapping
    unpinned (copies from it are staged, as in thread mode) and says so in ``failed``."""

    def __init__(self, register: Callable[[int, int], None], unregister: Callable[[int], None]) -> None:
        self._register, self._unregister = register, unregister
        self._lock = threading.RLock()  # (a batch collected inside a call here releases through it too)
        self._live: dict[int, list] = {}  # id(mapping) -> [mapping, address, batches alive, current]
        self.failed: str | None = None

    def add(self, mapping: mmap.mmap) -> None:
        address = np.frombuffer(mapping, np.uint8).ctypes.data
        try:
            self._register(address, len(mapping))
        except (DsbuildError, RuntimeError, AssertionError) as e:
            self.failed = str(e)
            return
        with self._lock:
            self._live[id(mapping)] = [mapping, address, 0, True]

    def hold(self, mapping: mmap.mmap, root: np.ndarray) -> None:
        with self._lock:
            entry = self._live.get(id(mapping))
            if entry is None:
                return
            entry[2] += 1
        weakref.finalize(root, self._dropped, id(mapping)).atexit = False  # (at exit CUDA is going too)

    def retire(self, mapping: mmap.mmap | None) -> None:
        if mapping is None:
            return
        with self._lock:
            entry = self._live.get(id(mapping))
            if entry is not None:
                entry[3] = False
                self._release(id(mapping))

    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(len(e[0]) for e in self._live.values())

    def _dropped(self, key: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is not None:
                entry[2] -= 1
                self._release(key)

    def _release(self, key: int) -> None:
        entry = self._live[key]
        if entry[2] == 0 and not entry[3]:
            del self._live[key]
            self._unregister(entry[1])  # (the mapping is dropped after: it closes unregistered)


def host_pins(device: str | None) -> HostPins | None:
    """Pins for a pool's segments when its batches go to a CUDA device; None otherwise."""
    if device is None or not device.startswith("cuda"):
        return None
    return HostPins(cuda_register, cuda_unregister)


@contextmanager
def _main_left_out() -> Iterator[None]:
    """Start workers without running the parent's script again in them (multiprocessing's fork server
    imports ``__main__`` by its path when it starts): they need nothing of it."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


_POOLS: weakref.WeakSet = weakref.WeakSet()  # this process's pools with workers started
_POOLS_STARTED = False  # whether this process started any (and so, multiprocessing's fork server)


def _forget_workers_in_child() -> None:
    """In a child forked by other means than multiprocessing's: the pools' worker processes are not its
    children (multiprocessing's exit handler would otherwise SIGTERM them when the child exits), nor is
    the fork server, which multiprocessing would ask for the child's own workers and fail (``waitpid``:
    no child processes): the child starts a server of its own when it needs one."""
    from multiprocessing import forkserver, process

    for pool in list(_POOLS):
        for p in pool._procs:
            process._children.discard(p)  # type: ignore[attr-defined]
    server: Any = forkserver._forkserver  # (its fields are private: typed as Any)
    if _POOLS_STARTED and server._forkserver_pid is not None:
        try:
            os.close(server._forkserver_alive_fd)  # (the parent's copy keeps its server alive)
        except OSError:
            pass
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None


os.register_at_fork(after_in_child=_forget_workers_in_child)


class Job:
    """A build in a worker process, with a Future's ``cancel``, ``done`` and ``result``. No thread of ours
    collects results: whoever waits for one reads the workers' pipes itself (``ProcessWorkers.collect``),
    so a batch costs the consumer one wake-up, not a collector thread's and then its own. A Job is
    resolved once, by whoever takes it out of the pool's jobs under the pool's lock (the thread
    collecting, or ``close`` and the failures that end builds), and a waiter collects (or waits for the
    thread that does), so it needs no lock of its own. A build nobody waits for any more (its loop
    ended) needs no waiting either: the next collection takes its result, frees its slot and drops it."""

    __slots__ = ("_done", "_error", "_value", "pool")

    def __init__(self, pool: ProcessWorkers) -> None:
        self.pool = pool
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def cancel(self) -> bool:
        return False  # (sent at once: never built by the consumer instead)

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        self._value, self._done = value, True

    def set_exception(self, error: BaseException) -> None:
        self._error, self._done = error, True

    def result(self) -> Any:
        self.pool.collect(self)
        if self._error is not None:
            raise self._error
        return self._value


@dataclasses.dataclass
class _Slot:
    """The consumer's view of one ring slot: the mapping of its current segment, whether a build for it is
    under way, and (weakly) the root array of the last batch delivered from it."""

    name: str | None = None
    size: int = 0
    mapping: mmap.mmap | None = None
    busy: bool = False
    root: weakref.ref | None = None

    def held(self) -> bool:
        return self.root is not None and self.root() is not None


class ProcessWorkers:
    """``num_workers`` persistent worker processes for one loader; ``submit(step)`` returns a ``Job`` of
    (batch, held counts), resolved in submission order per worker."""

    _count = 0

    def __init__(self, loader: Builder, stats: Stats) -> None:
        o: LoaderOptions = loader.options
        # (the loader only until its workers have it: a pool that kept it would keep a dropped loader alive,
        # through its finalizer's hold on the pool, and its workers and segments with it)
        self.loader: Builder | None = loader
        self.stats, self.n = stats, o.num_workers
        self.slots = o.prefetch + 1
        ProcessWorkers._count += 1
        # (ends in a letter no hex number has: no pool's prefix begins another's, as 1 would begin 1f)
        self.prefix = f"dsb{os.getpid():x}x{ProcessWorkers._count:x}s"
        self.budget = None if o.shm_bytes is None else o.shm_bytes // self.n
        self.generation: int | None = None
        self.owner = os.getpid()  # a forked child's copy (a fork-started DataLoader worker) owns nothing
        self._lock = threading.Lock()
        self._seq = 0
        self._jobs: dict[int, tuple[Job, int, int]] = {}
        self._ring: list[list[_Slot]] = []
        self._in_use = [0] * self.n
        self._kept: list[tuple[weakref.ref | None, int]] = []  # segments out of their ring, held by batches
        self._broken: Exception | None = None
        self.spent = False  # given up after an interruption (``_spend``): the loader makes a new pool
        self._closing = False
        self._procs: list = []
        self._conns: list = []
        # collecting: one thread at a time reads the pipes (``collect``), through one selector for the
        # pool's life (``connection.wait`` makes, fills and closes one per call); ``close`` wakes it
        self._collect_lock = threading.Lock()
        self._collector: int | None = None  # the thread collecting now
        self._sel: selectors.BaseSelector | None = None
        self._alive: dict = {}  # worker pipe -> worker
        self._sentinels: dict = {}  # worker process sentinel -> worker
        self._wake_r = self._wake_w = -1
        self._pins = host_pins(resolve_device(o.device)[0])  # (the loader resolved it: valid here)

    def start(self) -> ProcessWorkers:
        ctx = get_context(START_METHOD)
        ctx.set_forkserver_preload(["dsbuild.loader.pipeline"])
        loader = self.loader
        if loader is None:
            raise UsageError("a process worker pool starts once (make a new one to start again)")
        t0 = time.perf_counter()
        try:
            spec = describe(loader, prefix=self.prefix, slots=self.slots, budget=self.budget)
            global _POOLS_STARTED
            _POOLS.add(self)  # (before any worker starts: a fork from now on must forget them)
            _POOLS_STARTED = True
            for w in range(self.n):
                mine, theirs = ctx.Pipe(duplex=True)
                p = ctx.Process(  # type: ignore[attr-defined]
                    target=_serve,
                    args=(dataclasses.replace(spec, worker=w).text(), theirs),
                    name=f"dsbuild-load-proc_{w}",
                    daemon=True,
                )
                with _main_left_out():
                    p.start()
                theirs.close()
                self._procs.append(p)
                self._conns.append(mine)
                self._ring.append([_Slot() for _ in range(self.slots)])
            for w in range(self.n):
                self._ready(w)
        except BaseException:
            self.close()
            raise
        finally:
            self.loader = None
        self._wake_r, self._wake_w = os.pipe()
        self._alive = {c: w for w, c in enumerate(self._conns)}
        self._sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
        self._sel = selectors.DefaultSelector()
        for r in (*self._alive, *self._sentinels, self._wake_r):
            self._sel.register(r, selectors.EVENT_READ)
        self.stats.workers_info(
            processes=self.n, start_method=START_METHOD, startup_seconds=round(time.perf_counter() - t0, 4)
        )
        self._shm()
        return self

    def _ready(self, w: int) -> None:
        conn, p = self._conns[w], self._procs[w]
        connection.wait([conn, p.sentinel])
        try:
            msg = loads(conn.recv_bytes())
        except (EOFError, OSError):
            p.join(1)
            raise WorkerDied(
                f"loader worker process {w} (pid {p.pid}) died while starting ({_how(p.exitcode)})",
                hint="see its output above; worker_mode='thread' builds batches in this process",
            ) from None
        if msg[0] == "error":
            raise _error(msg[2], msg[3], msg[4], w)

    # -- submitting and collecting -------------------------------------------------------------------
    def submit(self, step: Step) -> Job:
        fut = Job(self)
        body = orjson.dumps(step_to_json(step), option=orjson.OPT_SERIALIZE_NUMPY)  # (integers: 1/20 of ``dumps``)
        try:
            while True:
                with self._lock:
                    if self._broken is not None or self._closing:
                        fut.set_exception(self._broken or _closed())
                        return fut
                    w = self._seq % self.n
                    picked = self._pick(w)
                    if picked is not None:
                        seq, self._seq = self._seq, self._seq + 1
                        slot, fresh = picked
                        self._jobs[seq] = (fut, w, slot)
                        break
                    # every slot of w has a build under way (another loop's, left to finish): the oldest
                    # frees one (a busy slot is a job's until it is resolved)
                    oldest = self._jobs[min(k for k, job in self._jobs.items() if job[1] == w)][0]
                self.collect(oldest)
            try:
                self._conns[w].send_bytes(b'["build",%d,%d,%s,%s]' % (seq, slot, b"true" if fresh else b"false", body))
            except OSError:
                with self._lock:
                    if self._jobs.pop(seq, None) is not None:
                        self._ring[w][slot].busy = False
                        fut.set_exception(self._died(w))
        except BaseException as e:  # (Ctrl-C between taking a slot and sending the build: see ``_spend``)
            self._spend(e)
            raise
        return fut

    def _pick(self, w: int) -> tuple[int, bool] | None:
        """A slot of worker ``w`` for the next build, and whether the worker must make it a fresh segment:
        an idle slot whose last batch is gone; else the one a consumer still holds a batch in (the batch
        keeps its memory, the ring gets a new segment); None while every slot has a build under way."""
        ring = self._ring[w]
        for k, s in enumerate(ring):
            if not s.busy and not s.held():
                s.busy = True
                return k, False
        for k, s in enumerate(ring):
            if not s.busy:
                self._kept.append((s.root, s.size))
                if self._pins is not None:
                    self._pins.retire(s.mapping)
                s.busy, s.name, s.mapping, s.root, s.size = True, None, None, None, 0
                return k, True
        return None

    def collecting(self) -> bool:
        """Whether this thread is collecting the workers' results now (garbage collection runs wherever
        Python allocates, so finalizers may run here: ``close``)."""
        return self._collector == threading.get_ident()

    def collect(self, job: Job) -> None:
        """Read results and errors from the workers' pipes, and deaths from their sentinels, until ``job``
        is resolved (or the pool closes, which fails it)."""
        if job.done():
            return
        if self.collecting():
            raise RuntimeError("a batch was waited for while this thread collected batches (a bug)")
        with self._collect_lock:
            self._collector = threading.get_ident()
            try:
                while not job.done() and self._sel is not None:
                    ready = [key.fileobj for key, _ in self._sel.select()]
                    if self._wake_r in ready:  # closed: every build failed (left unread: it wakes all)
                        return
                    try:
                        for r in ready:
                            if r in self._alive or r in self._sentinels:  # (a sentinel may retire its pipe)
                                self._collect_one(r)
                    except BaseException as e:  # (Ctrl-C between reading a result and giving it: ``_spend``)
                        self._spend(e)
                        raise
            finally:
                self._collector = None

    def _spend(self, e: BaseException) -> None:
        """Give the pool up after ``e`` (Ctrl-C, a signal's exception) cut a hand-over short: a result read
        but not given, a pipe read or written halfway, a slot taken for a build never sent. Every build
        fails, later ones too, and the loader starts new workers for its next loop (``spent``)."""
        err = UsageError(
            f"the loader's worker processes were interrupted while handing over a batch ({type(e).__name__})",
            hint="the next loop starts new worker processes; the loader's last checkpoint resumes exactly",
        )
        with self._lock:
            self.spent = True
            self._broken = self._broken or err
            self._fail_jobs(err)

    def _fail_jobs(self, err: Exception) -> None:
        """Every build under way fails with ``err`` (under the pool's lock)."""
        for fut, _, _ in self._jobs.values():
            fut.set_exception(err)
        self._jobs.clear()

    def _close_pipes(self) -> None:
        """Close the selector, the wake pipe and the workers' pipes (``close``, once no thread collects)."""
        with self._collect_lock, self._lock:
            if self._sel is not None:
                self._sel.close()
                self._sel = None
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
            for c in self._conns:
                c.close()

    def _collect_one(self, r) -> None:
        """What one ready pipe or sentinel says; a pipe or sentinel done with leaves the selector."""
        alive, sentinels, sel = self._alive, self._sentinels, self._sel
        assert sel is not None
        if r in alive:
            w = alive[r]
            try:
                msg = loads(self._conns[w].recv_bytes())
            except (EOFError, OSError):
                alive.pop(r)
                sel.unregister(r)
                self._fail(w)
                return
            self._handle(w, msg)
            return
        w = sentinels.pop(r)
        sel.unregister(r)
        conn = self._conns[w]
        while conn in alive and conn.poll():  # its last results first
            try:
                self._handle(w, loads(conn.recv_bytes()))
            except (EOFError, OSError):
                break
        if alive.pop(conn, None) is not None:
            sel.unregister(conn)
        self._fail(w)

    def _handle(self, w: int, msg: list) -> None:
        """One message of worker ``w``: its build's Job resolved (never left pending: a consumer waits)."""
        with self._lock:
            job = self._jobs.pop(msg[1], None)
        if job is None:  # (failed already: the loader is closing)
            return
        fut = job[0]
        try:
            result = self._receive(w, job[2], msg)
        except Exception as e:
            fut.set_exception(e)
            return
        fut.set_result(result)

    def _receive(self, w: int, k: int, msg: list) -> tuple[dict, dict]:
        with self._lock:
            slot = self._ring[w][k]
            slot.busy = False
            if msg[0] == "error":
                raise _error(msg[2], msg[3], msg[4], w)
            if self._closing:
                raise _closed()
            _, _, _, name, size, in_use = msg
            mapping = slot.mapping
            changed = self._in_use[w] != in_use or self._prune_kept()  # (what ``_shm`` reports)
            if mapping is None or slot.name != name:  # a new segment (the old mapping lives on in its batches)
                if self._pins is not None:
                    self._pins.retire(mapping)
                mapping = slot.mapping = _map(name, size)
                slot.name, slot.size, changed = name, size, True
                if self._pins is not None:
                    self._pins.add(mapping)
            self._in_use[w] = in_use
            root = np.frombuffer(mapping, np.uint8)
            slot.root = weakref.ref(root)  # (set before the slot can be picked again)
            if self._pins is not None:
                self._pins.hold(mapping, root)
        batch, extra = read_batch(root)
        self.stats.add_worker(f"dsbuild-load-proc_{w}", extra["seconds"])
        if changed:
            self._shm()
        return batch, extra["held"]

    def _died(self, w: int) -> Exception:
        p = self._procs[w]
        p.join(1)
        return WorkerDied(
            f"loader worker process {w} (pid {p.pid}) died: {_how(p.exitcode)}",
            hint="the OOM killer ends the largest process when memory runs out: lower prefetch, batch_size "
            "or num_workers; the loader's last checkpoint resumes exactly",
        )

    def _fail(self, w: int) -> None:
        """Worker ``w`` is gone: its builds under way fail, and so does every later submit."""
        with self._lock:
            if self._closing:
                return
            err = self._died(w)
            self._broken = self._broken or err
            for seq, (fut, owner, k) in list(self._jobs.items()):
                if owner == w:
                    self._jobs.pop(seq)
                    self._ring[w][k].busy = False
                    fut.set_exception(err)

    def _prune_kept(self) -> bool:
        """Forget the segments out of the rings that no batch holds any more; whether any were (under the
        pool's lock)."""
        kept: list[tuple[weakref.ref | None, int]] = [
            (r, n) for r, n in self._kept if r is not None and r() is not None
        ]
        pruned, self._kept = len(kept) != len(self._kept), kept
        return pruned

    def _shm(self) -> None:
        """Shared memory in use: the rings, and segments out of them that batches still hold."""
        with self._lock:
            self._prune_kept()
            kept = sum(n for _, n in self._kept)
        pins = self._pins
        self.stats.workers_info(shm_bytes=sum(self._in_use) + kept, pinned=pins is not None and pins.failed is None)
        if pins is not None and pins.failed is not None:
            self.stats.note(f"worker segments not pinned: {pins.failed}; host->device copies are staged")

    def close(self) -> None:
        """Stop the workers, fail what is still under way, unlink every segment. Batches delivered stay
        valid: their mappings outlive the segments' names. In a forked child, only forgets them: the
        workers, pipes and segments are the parent's."""
        if os.getpid() != self.owner:  # (before the lock: a thread may have held it when the fork was made)
            self._closing, self._procs, self._conns, self._ring, self._pins = True, [], [], [], None
            return
        if self.collecting():  # (garbage collection ran it inside a collection here, which holds the locks)
            threading.Thread(target=self.close, name="dsbuild-load-close", daemon=True).start()
            return
        with self._lock:
            if self._closing:
                return
            self._closing = True
        for c in self._conns:
            try:
                c.send_bytes(dumps(["stop"]))
            except OSError:
                pass
        for p in self._procs:
            p.join(2)
            if p.exitcode is None:
                p.kill()
                p.join()
        with self._lock:
            self._fail_jobs(_closed())
            if self._wake_w >= 0:  # a thread collecting now stops (its build failed just now)
                os.write(self._wake_w, b"x")
        self._close_pipes()  # (once no thread collects)
        unlink_prefix(self.prefix)
        if self._pins is not None:  # (unregistered now, or once the last batch from it is collected)
            for ring in self._ring:
                for s in ring:
                    self._pins.retire(s.mapping)
        self._in_use, self._ring = [0] * self.n, []
        self._shm()

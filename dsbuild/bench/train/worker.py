"""One rank of a ``bench --model`` run: ``python -m dsbuild.bench.train.worker``, spoken to in JSON lines.

The parent sends one setup line (the options, this rank, the world, the rendezvous port, when it spawned
the process, and the mode); the rank answers with ``{"trained": ...}`` lines (the sample keys of each
step it finished) and one ``{"result": ...}`` or ``{"error": ...}``. Nothing is pickled. The process
group's collective timeout is the options' ``timeout_s``: a peer that dies leaves this rank blocked no
longer than that (and the parent, which watches every rank, stops the others as soon as one dies).

Modes: ``measure`` (warm-up steps, one step under FlopCounterMode, a window of steps under the profiler:
a ``RankRun``; with ``rounds`` in the setup the window is cut into rounds interleaved with the other
scaling points' jobs: the rank says ``{"mark": "ready"}``, then runs round k when the parent sends
``{"round": k}`` and says ``{"mark": "round k"}``), ``checkpoint`` (train one epoch, checkpointing
after every step; the rank named ``kill_rank`` SIGKILLs itself once step ``kill_after`` is
checkpointed) and ``resume`` (restore the latest checkpoint, time each part of the way to the first
step, train to the end of the epoch).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from dsbuild.bench.train.options import TrainOptions

ACTIONS = 5  # controller dims when a batch carries no actions


@dataclass
class Rank:
    """What a rank holds while it trains."""

    o: TrainOptions
    setup: dict
    rank: int
    world: int
    torch: Any
    dist: Any
    device: str
    loader: Any
    timings: dict[str, float] = field(default_factory=dict)
    model: Any = None
    opt: Any = None
    params: int = 0


def _start(setup: dict) -> Rank:
    """Process group up (``start_and_init_s``: from the parent's spawn) and the version open (``index_load_s``)."""
    import datetime

    import torch
    import torch.distributed as dist

    from dsbuild.loader import Loader

    o = TrainOptions.from_json(setup["options"], "bench options")
    rank, world = setup["rank"], setup["world"]
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:  # ranks share the host's cores: the parent gives each the same share in every job
        torch.set_num_threads(setup["torch_threads"])
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{setup['port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=o.timeout_s),
    )
    timings = {"start_and_init_s": time.time() - setup["spawned_at"]}
    t0 = time.perf_counter()
    loader = Loader(
        setup["ref"],
        o.split,
        seed=o.seed,
        batch_size=setup["batch_size"],
        rank=rank,
        world_size=world,
        num_workers=o.threads,
        clip_frames=o.clip_frames,
        resize=tuple(o.resize),
        device="cpu",
    )
    loader.open()
    timings["index_load_s"] = time.perf_counter() - t0
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    return Rank(o, setup, rank, world, torch, dist, device, loader, timings)


def _build(r: Rank, actions: int) -> None:
    """The model (same seed on every rank), wrapped in DDP or FSDP2, and its AdamW."""
    from dsbuild.bench import models

    torch = r.torch
    torch.manual_seed(r.o.seed)
    model = models.build(r.o.model, r.o.clip_frames, r.o.resize[0], r.o.resize[1], actions).to(r.device)
    r.params = sum(p.numel() for p in model.parameters())
    if r.o.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        r.model = fully_shard(model)
    else:  # DDP broadcasts rank 0's weights
        from torch.nn.parallel import DistributedDataParallel

        r.model = DistributedDataParallel(model, device_ids=[r.device] if r.device.startswith("cuda") else None)
    r.opt = torch.optim.AdamW(r.model.parameters(), lr=1e-4)


def _stepper(r: Rank, batches, answer, inject=None):
    """``step() -> (seconds, loss, batch)``: one training step; the clock wraps exactly the profiler's step
    window (``dsbuild.bench.train.profile``)."""
    from torch.profiler import record_function

    from dsbuild.bench.train.profile import DATA, H2D, INJECTED, STEP

    torch, model, opt = r.torch, r.model, r.opt
    bf16 = r.o.dtype == "bf16"

    def step():
        start = time.perf_counter()
        with record_function(STEP):
            with record_function(DATA):
                batch = next(batches)
                if inject is not None and inject.component == "data":
                    time.sleep(inject.ms / 1000)
            with record_function(H2D):
                frames = batch["frames"].to(r.device, non_blocking=False)
                actions = batch["actions"].to(r.device, non_blocking=False)
            if inject is not None and inject.component == "compute":
                with record_function(INJECTED):
                    time.sleep(inject.ms / 1000)
            with torch.autocast(r.device.split(":")[0], dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = model(frames, actions)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = float(loss.detach())  # a training loop that logs its loss syncs once a step
        seconds = time.perf_counter() - start
        answer({"trained": {"rank": r.rank, "keys": [str(k) for k in batch["keys"]]}})
        return seconds, value, batch

    return step


def _agreed(r: Rank, batches):
    """The batches while every rank has one: ranks whose shares of an epoch differ by a batch stop together
    (a collective step on one rank alone would wait for the others until the timeout)."""
    for batch in itertools.chain(batches, [None]):
        flag = r.torch.tensor([0 if batch is None else 1])
        r.dist.all_reduce(flag, op=r.dist.ReduceOp.MIN)
        if int(flag.item()) == 0:
            return
        yield batch


def _endless(loader):
    """The loader's batches, epoch after epoch (a window of steps may be longer than an epoch)."""
    while True:
        yield from loader


def measure(setup: dict, answer) -> dict:
    """Warm-up steps, one step counted under FlopCounterMode, then ``steps`` steps under the profiler."""
    from torch.utils.flop_counter import FlopCounterMode

    from dsbuild.bench.train.peaks import peak
    from dsbuild.bench.train.profile import step_parts

    r = _start(setup)
    torch, o = r.torch, r.o
    t0 = time.perf_counter()
    batches = _endless(r.loader)
    first = next(batches)  # its shape sizes the action head
    r.timings["first_batch_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _build(r, first["actions"].shape[-1] if "actions" in first else ACTIONS)
    r.timings["model_build_s"] = time.perf_counter() - t0
    r.dist.barrier()
    pk = peak(r.device, o.dtype)  # all ranks at once: each measures the share of the machine it trains on
    inject = o.inject if o.inject is not None and o.inject.rank == r.rank else None
    step = _stepper(r, itertools.chain([first], batches), answer, inject)
    t0 = time.perf_counter()
    _, first_loss, _ = step()
    r.timings["first_step_s"] = time.perf_counter() - t0
    for _ in range(max(0, o.warmup - 1)):
        step()
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    seconds, frames, samples, parts = [], [], [], []
    last_loss = first_loss
    rounds = setup.get("rounds")  # interleaved with the other points' jobs: a round when the parent says
    windows = round_steps(o.steps, rounds or 1)
    if rounds:
        answer({"mark": "ready"})
    for k, count in enumerate(windows):
        if rounds and json.loads(sys.stdin.readline() or "null") != {"round": k}:
            raise RuntimeError(f"expected round {k} from the parent")
        with torch.profiler.profile(activities=_activities(torch, r.device)) as prof:
            for _ in range(count):
                s, last_loss, batch = step()
                seconds.append(s)
                frames.append(int(batch["lengths"].sum()))
                samples.append(len(batch["keys"]))
        parts += step_parts(prof.events())
        if rounds:
            answer({"mark": f"round {k}"})
    stats = r.loader.stats()
    _finish(r)
    build = sum(v.get(k, 0.0) for v in stats["threads"].values() for k in ("read", "decode", "collate"))
    built = sum(v.get("batches", 0) for v in stats["threads"].values())
    return {
        "rank": r.rank,
        "world": r.world,
        "batch_size": setup["batch_size"],
        "device": r.device,
        "torch_threads": torch.get_num_threads(),
        "params": r.params,
        "flops": counter.get_total_flops(),
        "peak": pk.to_json(),
        "step_s": seconds,
        "parts": [p.to_json() for p in parts],
        "frames": frames,
        "samples": samples,
        "batch_build_s": build / built if built else None,
        "loss": [first_loss, last_loss],
        "round_steps": windows if rounds else None,
        "timings": r.timings,
        "software": _software(torch),
    }


def round_steps(steps: int, rounds: int) -> list[int]:
    """``steps`` profiled steps over ``rounds`` interleaved rounds (at most one round a step), as even as
    they divide: 5 over 3 -> [2, 2, 1]."""
    n = max(1, min(steps, rounds))
    return [steps // n + (k < steps % n) for k in range(n)]


def _finish(r: Rank) -> None:
    r.loader.close()
    r.dist.barrier()
    r.dist.destroy_process_group()


def checkpoint_then_resume(setup: dict, answer) -> dict:
    """``checkpoint`` and ``resume`` modes (see the module docstring)."""
    from dsbuild.bench.train import checkpoint

    r = _start(setup)
    folder, resume = setup["checkpoint"], setup["mode"] == "resume"
    state = None
    if resume:
        t0 = time.perf_counter()
        state = checkpoint.read_loader(folder)
        r.loader.load_state_dict(state["loader"])
        r.timings["loader_restore_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        _build(r, state["actions"])
        r.timings["model_build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        checkpoint.restore(r.model, r.opt, folder)
        r.timings["model_restore_s"] = time.perf_counter() - t0
    batches = _agreed(r, iter(r.loader))  # one epoch: the restored run trains what the killed one had not
    t0 = time.perf_counter()
    first = next(batches)
    r.timings["first_batch_s"] = time.perf_counter() - t0
    actions = first["actions"].shape[-1] if "actions" in first else ACTIONS
    if not resume:
        _build(r, actions)
    step = _stepper(r, itertools.chain([first], batches), answer)
    done = 0
    while True:
        t0 = time.perf_counter()
        try:
            step()
        except StopIteration:
            break
        done += 1
        if done == 1:
            r.timings["first_step_s"] = time.perf_counter() - t0
            r.timings["to_first_step_s"] = time.time() - setup["spawned_at"]
        if not resume:
            checkpoint.save(r.model, r.opt, r.loader, actions, folder, done, write=r.rank == 0)
            r.dist.barrier()  # every rank knows step `done` is on disk
            if r.rank == setup["kill_rank"] and done == setup["kill_after"]:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    _finish(r)
    return {"rank": r.rank, "steps": done, "timings": r.timings}


def _activities(torch, device: str) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _software(torch) -> dict:
    import platform

    import av
    import numpy

    from dsbuild import __version__

    return {
        "dsbuild": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": numpy.__version__,
        "av": av.__version__,
    }


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends the ranks
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol

    def answer(doc: dict) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    try:
        setup = json.loads(sys.stdin.readline())
        run = measure if setup.get("mode", "measure") == "measure" else checkpoint_then_resume
        answer({"result": run(setup, answer)})
    except MemoryError:
        answer({"error": "out of memory", "kind": "MemoryError"})
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        answer({"error": first, "kind": type(e).__name__, "hint": getattr(e, "hint", None)})


if __name__ == "__main__":
    main()

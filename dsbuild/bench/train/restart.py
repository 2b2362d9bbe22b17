"""Restart time: kill one rank mid-run (SIGKILL), restart the job from its last checkpoint, and time each
part of the way to the first step after; then check, end to end, that the restored run trained exactly
the samples the killed run had not (the loader's exactly-once).

The killed job trains one epoch and checkpoints after every step (``dsbuild.bench.train.checkpoint``);
its last rank SIGKILLs itself once step ``KILL_AFTER`` is on disk, and the parent ends the others. The
restarted job is fresh processes: each component is the slowest rank's. The samples trained are those
of the killed job's checkpointed steps plus all of the restarted job's; the reference is one
uninterrupted epoch of the same loaders, read in this process.
"""

from __future__ import annotations

import signal
import tempfile
from collections import Counter

from dsbuild.bench.train.launch import describe_exit, run_ranks
from dsbuild.bench.train.options import TrainOptions
from dsbuild.bench.train.report import Restart
from dsbuild.core.errors import UsageError, WorkerDied

KILL_AFTER = 1  # steps checkpointed before the kill
COMPONENTS = (
    ("start_and_init_s", "process start and process-group init"),
    ("index_load_s", "index and catalog load"),
    ("loader_restore_s", "loader restore"),
    ("model_build_s", "model build and DDP/FSDP wrap"),
    ("model_restore_s", "model and optimizer restore"),
    ("first_batch_s", "first batch"),
    ("first_step_s", "first step"),
)


def epoch_keys(o: TrainOptions, ref: str, world: int, batch_size: int) -> Counter:
    """Every sample key one uninterrupted epoch trains on ``world`` ranks, with its count: the batches of the
    steps every rank takes (when ranks' shares differ by a batch, the last one is not trained)."""
    from dsbuild.loader import Loader

    per_rank = []
    for rank in range(world):
        with Loader(
            ref,
            o.split,
            seed=o.seed,
            batch_size=batch_size,
            rank=rank,
            world_size=world,
            num_workers=o.threads,
            clip_frames=o.clip_frames,
            resize=(8, 8),  # the keys do not depend on the frame size
        ) as loader:
            per_rank.append([[str(k) for k in batch["keys"]] for batch in loader])
    steps = min(len(b) for b in per_rank)  # the steps every rank takes (the worker's ranks stop together)
    return Counter(k for batches in per_rank for batch in batches[:steps] for k in batch)


def measure_restart(o: TrainOptions, ref: str, world: int, batch_size: int, threads: int) -> Restart:
    if world < 2:
        raise UsageError("the restart measurement kills one rank of several: give --ranks 2 or more")
    with tempfile.TemporaryDirectory(prefix="dsbuild-restart-") as folder:
        setup = {
            "options": o.to_json(),
            "ref": ref,
            "batch_size": batch_size,
            "torch_threads": threads,
            "checkpoint": folder,
            "kill_rank": world - 1,
            "kill_after": KILL_AFTER,
        }
        killed = run_ranks({**setup, "mode": "checkpoint"}, world, o.timeout_s, expect_death=True)
        if killed.died is None:
            raise UsageError(
                f"the epoch ended before step {KILL_AFTER + 1}: the restart measurement needs an epoch of 2 steps or more",
                hint="a smaller --batch-size",
            )
        rank, code = killed.died
        if rank != world - 1 or code != -signal.SIGKILL:
            raise WorkerDied(f"rank {rank} of {world} died ({describe_exit(code)}) before the planned kill")
        resumed = run_ranks({**setup, "mode": "resume"}, world, o.timeout_s)
    before = [k for steps in killed.trained for step in steps[:KILL_AFTER] for k in step]
    after = [k for steps in resumed.trained for step in steps for k in step]
    want = epoch_keys(o, ref, world, batch_size)
    got = Counter(before) + Counter(after)
    twice = sorted(k for k, n in got.items() if n > want.get(k, 0))
    missing = sorted(k for k, n in want.items() if got.get(k, 0) < n)
    timings = [r["timings"] for r in resumed.results]
    components = {name: max(t.get(key, 0.0) for t in timings) for key, name in COMPONENTS}
    detail = f"{len(before)} sample(s) trained before the kill and checkpointed, {len(after)} after the restart: " + (
        "each sample of the epoch once"
        if not twice and not missing
        else f"{len(twice)} trained twice ({', '.join(twice[:3])}), {len(missing)} never ({', '.join(missing[:3])})"
    )
    return Restart(
        killed_rank=world - 1,
        killed_after_step=KILL_AFTER,
        signal="SIGKILL",
        components=components,
        total_s=max(t.get("to_first_step_s", 0.0) for t in timings),
        exactly_once=not twice and not missing,
        samples_checked=sum(want.values()),
        detail=detail,
    )

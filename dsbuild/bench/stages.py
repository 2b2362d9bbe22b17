"""Where the time goes, from the loader's own per-thread timestamps (``loader.stats()``): attribution, not
estimation.

  consumer : the training loop's wall time = wait (blocked on the pipeline) + h2d (host->device copy)
             + step (the simulated training step) + other (loop overhead, planning on its thread)
  workers  : per loader thread, read + decode + collate, and idle = its wall time minus those

A batch's stages are recorded when it is built, so a build that straddles a phase's start counts wholly
in that phase, and so does one finished while the pipeline closes after the phase's last batch: with
the pipeline kept full (the loader reads ahead across epoch ends), a thread's stages can exceed its wall
time by up to a build at each end, and its idle is then 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsbuild.core.records import Record, spec


@dataclass(frozen=True, slots=True)
class ThreadTime(Record):
    read: float
    decode: float
    collate: float
    wall: float = field(metadata=spec(minimum=0))
    batches: int = field(metadata=spec(minimum=0))

    @property
    def idle(self) -> float:
        return max(0.0, self.wall - self.read - self.decode - self.collate)


@dataclass(frozen=True, slots=True)
class Stages(Record):
    """One phase (throughput or training) of our loader, in seconds."""

    wall: float = field(metadata=spec(minimum=0))
    wait: float
    h2d: float
    step: float
    read: float  # summed over the worker threads
    decode: float
    collate: float
    workers: dict[str, ThreadTime]

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.wait - self.h2d - self.step)


def stages(before: dict, after: dict, consumer: str, wall: float, workers_wall: float, step: float = 0.0) -> Stages:
    """The phase between two ``loader.stats()`` snapshots; ``consumer`` names the training loop's thread and
    ``wall`` is its time in the phase; ``workers_wall`` runs until the pipeline was shut down (batches in
    flight when the phase ended were finished, then dropped)."""

    def delta(name: str, key: str) -> float:
        return after["threads"].get(name, {}).get(key, 0) - before["threads"].get(name, {}).get(key, 0)

    workers = {
        name: ThreadTime(
            read=delta(name, "read"),
            decode=delta(name, "decode"),
            collate=delta(name, "collate"),
            wall=workers_wall,
            batches=int(delta(name, "batches")),
        )
        for name in sorted(after["threads"])
        if name != consumer
    }
    return Stages(
        wall,
        delta(consumer, "wait"),
        delta(consumer, "h2d"),
        step,
        read=sum(w.read for w in workers.values()),
        decode=sum(w.decode for w in workers.values()),
        collate=sum(w.collate for w in workers.values()),
        workers=workers,
    )


def total(parts: list[Stages], prefix: list[str] | None = None) -> Stages | None:
    """Several phases summed (rounds; or ranks, whose threads are named ``<prefix>/<thread>``)."""
    if not parts:
        return None
    workers: dict[str, ThreadTime] = {}
    for k, p in enumerate(parts):
        for name, w in p.workers.items():
            name = f"{prefix[k]}/{name}" if prefix else name
            old = workers.get(name)
            workers[name] = (
                w
                if old is None
                else ThreadTime(
                    read=old.read + w.read,
                    decode=old.decode + w.decode,
                    collate=old.collate + w.collate,
                    wall=old.wall + w.wall,
                    batches=old.batches + w.batches,
                )
            )
    return Stages(
        wall=sum(p.wall for p in parts),
        wait=sum(p.wait for p in parts),
        h2d=sum(p.h2d for p in parts),
        step=sum(p.step for p in parts),
        read=sum(p.read for p in parts),
        decode=sum(p.decode for p in parts),
        collate=sum(p.collate for p in parts),
        workers=workers,
    )

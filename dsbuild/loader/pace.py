"""Who builds a batch that holds the GIL from start to end: a worker thread ahead of time, or the consumer
when it asks.

A batch with nothing to run per sample, read from mapped shards (``LoaderOptions.plain``, ``read="map"``),
is pure Python and memcpy: a worker building it ahead overlaps only with consumer work that releases the
GIL (a training step's kernels), and each batch handed from a worker to the consumer costs two wake-ups
through the kernel — on a virtual machine more than the build of a small batch. So such batches are
built ahead only while the consumer stays away (between receiving a batch and asking for the next)
at least as long as a build takes; a consumer that comes back sooner builds its batches itself, with no
hand-off. Batches that decode or hash (the GIL released) are always built ahead: workers then run in
parallel with everything else. (With ``verify="shard"``, a shard's one proof — a hash of the whole
shard, the GIL released — runs in whichever thread first reads it, the consumer's too.) Only timing
depends on this; the batches and their order never do.
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.2  # each new measurement's share of the running averages


def ema(average: float | None, value: float, weight: float = WEIGHT) -> float:
    """The running average after ``value`` (the first value starts it)."""
    return value if average is None else average + weight * (value - average)


@dataclass
class Pace:
    """Running averages of a build's seconds and of the consumer's time away; ``ahead()`` says whether
    the next batch should go to a worker. Until both are measured, a GIL-bound batch is the consumer's:
    it asks for the first one at once (a worker would only add a thread's start and a hand-off), and a
    consumer that then stays away gets the batches not yet started sent ahead (``Loader.__iter__``)."""

    gil_bound: bool
    build: float | None = None
    away: float | None = None

    def built(self, seconds: float) -> None:
        self.build = ema(self.build, seconds)

    def returned(self, seconds: float) -> None:
        self.away = ema(self.away, seconds)

    def ahead(self) -> bool:
        if not self.gil_bound:
            return True
        return self.build is not None and self.away is not None and self.away >= self.build

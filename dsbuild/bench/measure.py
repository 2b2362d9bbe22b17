"""One measurement: a reader's work counted against its time slice, sampled about once a second.

Every reader (ours and each baseline) reports its work to a ``Meter`` as it goes; the meter keeps the
totals, a cumulative sample at the first report after each whole second (the throughput-over-time plot),
and says when the slice is over. Rates are totals over the elapsed time of the slice: nothing is left out
(no warm-up is discarded), so a reader that is slow to start is slow.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dsbuild.core.records import Record, spec

TICK_S = 0.25  # the live display is told the rates at most this often
UNITS = {"frames": ("frames/s", 1.0), "bytes": ("MB/s", 1e-6)}  # decode mode -> the figure compared


@dataclass(frozen=True, slots=True)
class Measured(Record):
    """One reader in one round."""

    name: str
    round: int = field(metadata=spec(minimum=0))
    start_s: float  # when the slice began, seconds after measuring began
    seconds: float = field(metadata=spec(minimum=0))
    samples: float = field(metadata=spec(minimum=0, doc="fractional for readers of whole shards cut mid-shard"))
    frames: float | None  # None: the reader decodes nothing
    bytes: float = field(metadata=spec(minimum=0, doc="sample payload bytes"))
    points: tuple[tuple[float, ...], ...]  # (t, samples, frames, bytes), cumulative, ~1 s apart, the last at the end

    def per_second(self, what: str) -> float | None:
        """samples, frames or bytes per second over the slice (None when not measured)."""
        value = {"samples": self.samples, "frames": self.frames, "bytes": self.bytes}[what]
        return value / self.seconds if value is not None and self.seconds > 0 else None

    def figure(self, decode: str) -> float | None:
        """The figure compared in this decode mode: frames/s, or MB/s."""
        what = "frames" if decode == "frames" else "bytes"
        value = self.per_second(what)
        return value * UNITS[decode][1] if value is not None else None


class Meter:
    """Counts work for ``seconds`` (thread-safe). ``over`` turns true when the slice is spent or ``stop()``
    was called (Ctrl-C); a reader always gets to report at least one unit of work."""

    def __init__(
        self,
        name: str,
        round_: int,
        start_s: float,
        seconds: float,
        *,
        decodes: bool,
        tick: Callable[[Meter], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.name, self.round, self.start_s, self.seconds = name, round_, start_s, seconds
        self.decodes, self.tick, self.clock = decodes, tick, clock
        self.samples = self.frames = self.bytes = 0.0
        self.points: list[tuple[float, ...]] = []
        self.stopped = False
        self._lock = threading.Lock()
        self._t0 = clock()
        self._excluded = 0.0
        self._mark = 1.0
        self._told = 0.0

    def elapsed(self) -> float:
        """The time measured so far: the slice's, less what ``exclude`` left out."""
        return self.clock() - self._t0 - self._excluded

    @property
    def over(self) -> bool:
        """The slice is spent by the clock (what was left out of the measurement still took the run's
        time: a budget is wall time)."""
        return self.stopped or (
            self.clock() - self._t0 >= self.seconds and (self.samples > 0 or self.bytes > 0 or self.frames > 0)
        )

    def stop(self) -> None:
        self.stopped = True

    def remaining(self) -> float:
        """Seconds of the slice left by the clock."""
        return max(0.0, self.seconds - (self.clock() - self._t0))

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` just spent out of the measurement (a baseline's per-epoch set-up)."""
        with self._lock:
            self._excluded += seconds

    def add(self, samples: float = 0, frames: float = 0, nbytes: float = 0) -> None:
        with self._lock:
            self.samples += samples
            self.frames += frames
            self.bytes += nbytes
            t = self.elapsed()
            if t >= self._mark:
                self.points.append((t, self.samples, self.frames, self.bytes))
                self._mark = math.floor(t) + 1.0
            tell = self.tick if self.tick is not None and t - self._told >= TICK_S else None
            if tell is not None:
                self._told = t
        if tell is not None:
            tell(self)

    def result(self) -> Measured:
        t = self.elapsed()
        points = [*self.points, (t, self.samples, self.frames, self.bytes)]
        return Measured(
            self.name,
            self.round,
            self.start_s,
            t,
            self.samples,
            self.frames if self.decodes else None,
            self.bytes,
            tuple(points),
        )

"""``--duration`` is the wall budget of every round and every baseline together.

Each measurement is given an equal share of what is left: (budget - elapsed) / measurements left, but
never less than its planned share (budget / measurements): time a measurement takes beyond its slice
(a loader opening its index, the batch in flight when the slice ends) is paid by the slices after it,
down to that floor and no further, so a baseline measured after an overrun still gets a fair window
(on 1080p clips a first round overran a 20 s budget and left a bare decode loop one clip, and a 5.8x
ratio that only measured its start-up). A round starts only while at least half of a mean round is
left, so when the smallest unit of work (one batch, one clip) is large against the slices, the run stops
within half a round (plus the floors) of its budget and reports how many rounds it finished. Start-up
(opening the version, writing the peers' copies, calibrating the step, starting rank processes) comes
before the budget and is reported apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Budget:
    def __init__(self, duration: float, rounds: int, per_round: int, clock: Callable[[], float] = time.monotonic):
        self.duration, self.rounds, self.per_round, self.clock = duration, rounds, per_round, clock
        self.t0 = clock()
        self.used = 0  # measurements finished

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return self.duration - self.elapsed()

    def can_start_round(self, done: int) -> bool:
        """Whether round ``done`` + 1 starts: only while at least half a round's mean cost is left, so a
        run ends within half a round of its budget either way."""
        if done >= self.rounds:
            return False
        return self.left() > (0.5 * self.elapsed() / done if done else 0.0)

    def slice(self) -> float:
        """Seconds for the next measurement: an equal share of the budget left, at least the planned share."""
        planned = self.duration / (self.rounds * self.per_round)
        return max(planned, self.left() / max(1, self.rounds * self.per_round - self.used))

    def spend(self, measurements: int = 1) -> None:
        self.used += measurements

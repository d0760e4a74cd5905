"""Periodic checkpoints in closed form: train ``interval``, pause ``pause``, repeat.

Between two disturbances (a failure, a slowdown starting or ending) a job's checkpoint pattern is
fixed, so a long run does not step through every checkpoint: it asks, at each disturbance, how
much training and pausing happened since the last one and which checkpoints were completed.
"""

from __future__ import annotations

import math

from clustersim.simulator.longrun.checkpointing import CheckpointLevel


class Cycle:
    """Training from ``origin``: checkpoint ``k`` captures the state at ``snapshot(k)`` and its
    pause ends at ``taken(k)``."""

    __slots__ = ("origin", "interval", "pause", "period")

    def __init__(self, origin: float, interval: float, pause: float):
        self.origin, self.interval, self.pause = origin, interval, pause
        self.period = interval + pause

    def train_time(self, t: float) -> float:
        """Training time (not pausing) in [origin, t]."""
        x = t - self.origin
        if x <= 0:
            return 0.0
        k = math.floor(x / self.period)
        return k * self.interval + min(x - k * self.period, self.interval)

    def time_at_train(self, tt: float) -> float:
        """The first time at which ``tt`` of training has been done."""
        if tt <= 0:
            return self.origin
        k = math.ceil(tt / self.interval) - 1
        return self.origin + k * self.period + (tt - k * self.interval)

    def snapshot(self, k: int) -> float:
        return self.origin + k * self.period + self.interval

    def taken(self, k: int) -> float:
        return self.origin + (k + 1) * self.period

    def last_taken(self, t: float) -> int:
        """The newest checkpoint whose pause has ended by ``t`` (-1: none)."""
        return math.floor((t - self.origin) / self.period + 1e-12) - 1


class Level:
    """The restore points one checkpoint level holds: the two newest, and a baseline (the state
    the current stretch of training started from, which a durable copy holds)."""

    __slots__ = ("spec", "baseline", "saved", "last_k")

    def __init__(self, spec: CheckpointLevel):
        self.spec = spec
        self.baseline = (0.0, -math.inf)
        """(work, usable since) of the state training restarted from."""
        self.saved: list[tuple[float, float]] = []
        """(work, time it became usable), oldest first."""
        self.last_k = -1

    def new_cycle(self, baseline: tuple[float, float] | None) -> None:
        """Training restarts; with ``baseline`` (work, usable since) from a restored state."""
        self.last_k = -1
        if baseline is not None:
            self.baseline = baseline
            self.saved = []

    def advance(self, cycle: Cycle, t_from: float, work_from: float, rate: float,
                t_to: float) -> None:
        """Record the checkpoints of this level completed in (t_from, t_to], at ``rate``."""
        every = self.spec.every
        k_hi = cycle.last_taken(t_to)
        k_hi = (k_hi + 1) // every * every - 1
        if k_hi <= self.last_k:
            return
        base_train = cycle.train_time(t_from)
        for k in (k_hi - every, k_hi):
            if k > self.last_k and k >= 0:
                work = work_from + rate * (cycle.train_time(cycle.snapshot(k)) - base_train)
                self.saved.append((work, cycle.taken(k) + self.spec.background_s))
        del self.saved[:-2]
        self.last_k = k_hi

    def restore(self, t: float) -> tuple[float, float]:
        """(work, usable since) of the newest copy usable at ``t``; the baseline if none."""
        for work, usable in reversed(self.saved):
            if usable <= t:
                return work, usable
        return self.baseline

"""What a sweep keeps of a replay: every rank class's finish and the critical class's breakdown.

The step's own summary (``simulator/summary.py``) attributes the idle time of every rank class,
a tenth of a sweep point's cost on a deep pipeline (one attribution per stage), yet a sweep keeps
only the critical class's breakdown. Here only that class is attributed, by the same function on
the same records, so the numbers are the step summary's, not an approximation of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.simulator import Breakdown, Replay
from clustersim.simulator.attribution import breakdown
from clustersim.simulator.metrics import peak_memory_bytes
from clustersim.simulator.summary import critical_position
from clustersim.workloads.trace import Trace


@dataclass(frozen=True, kw_only=True, slots=True)
class CriticalSummary:
    """One replay, as much of it as a sweep point needs."""

    classes: tuple[tuple[int, str, int, int], ...]
    """Each rank class as (index, program, ranks it stands for, representative rank)."""
    finish_s: tuple[float, ...]
    """When each class finished its last op, in the order of ``classes``."""
    critical_class: int
    """Index of the class that finished last (the lowest index among equals)."""
    breakdown: Breakdown
    """The critical class's breakdown."""
    peak_memory_bytes: float
    events: int

    @property
    def step_time_s(self) -> float:
        return max(self.finish_s)


def critical_summary(replay: Replay, trace: Trace) -> CriticalSummary:
    """``replay`` of ``trace`` summarised: the critical class chosen as the step summary does."""
    timelines = replay.timelines
    critical = timelines[critical_position([tl.finish_s for tl in timelines],
                                           [tl.rank_class.index for tl in timelines])]
    return CriticalSummary(
        classes=tuple((tl.rank_class.index, trace.programs[tl.rank_class.program].name,
                       tl.rank_class.multiplicity, tl.rank_class.representative)
                      for tl in timelines),
        finish_s=tuple(tl.finish_s for tl in timelines),
        critical_class=critical.rank_class.index,
        breakdown=breakdown(trace.programs[critical.rank_class.program].ops, critical),
        peak_memory_bytes=peak_memory_bytes(trace), events=replay.events)

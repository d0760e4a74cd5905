"""Results of a step simulation: plain dataclasses with ``to_dict()`` and DataFrame views."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from clustersim.simulator.records import OpRecord
from clustersim.workloads.axes import Axis
from clustersim.workloads.trace import CollectiveOp, RecvOp, SendOp, Stream

AXES = tuple(a.value for a in Axis)
"""Keys of ``exposed_comm_s``: the parallel axes, in the breakdown's order."""


def charged_axis(op: CollectiveOp | SendOp | RecvOp) -> str:
    """The ``exposed_comm_s`` key a communication op's wait goes to: its stream's axis (data
    parallel for one on a stream of no axis)."""
    return _AXIS_OF_STREAM[op.stream]


_AXIS_OF_STREAM = {stream: (stream.axis or Axis.DP).value for stream in Stream}
"""Looked up once per op of every replay: an enum property and ``.value`` per op add up."""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where one rank's step time goes; the parts sum to the step time."""

    compute_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float
    optimizer_s: float
    other_s: float
    offload_s: float = 0.0
    """Waiting on host <-> device copies of offloaded state (ZeRO-Offload, activation
    offload) that the compute stream could not hide."""
    host_s: float = 0.0
    """Waiting on the host to issue kernels eagerly (``cuda_graphs`` other than ``full``):
    after a device-to-host sync, or wherever the host falls behind the device."""

    @property
    def total_s(self) -> float:
        return (self.compute_s + sum(self.exposed_comm_s.values()) + self.bubble_s
                + self.optimizer_s + self.offload_s + self.host_s + self.other_s)

    def to_dict(self) -> dict:
        return {"compute_s": self.compute_s,
                "exposed_comm_s": {a: self.exposed_comm_s.get(a, 0.0) for a in AXES},
                "bubble_s": self.bubble_s, "optimizer_s": self.optimizer_s,
                "offload_s": self.offload_s, "host_s": self.host_s, "other_s": self.other_s}

    def columns(self) -> dict[str, float]:
        """The parts as flat :data:`BREAKDOWN_COLUMNS`, as tables and sweeps store them."""
        return {"compute_s": self.compute_s,
                **{f"exposed_{a}_s": self.exposed_comm_s.get(a, 0.0) for a in AXES},
                "bubble_s": self.bubble_s, "optimizer_s": self.optimizer_s,
                "offload_s": self.offload_s, "host_s": self.host_s, "other_s": self.other_s}


BREAKDOWN_COLUMNS = ("compute_s", *(f"exposed_{a}_s" for a in AXES), "bubble_s", "optimizer_s",
                     "offload_s", "host_s", "other_s")
"""Flat column names of a breakdown's parts, in display order."""


@dataclass(frozen=True, slots=True)
class ClassSummary:
    index: int
    program: str
    ranks: int
    """Multiplicity: ranks this class stands for."""
    representative: int
    finish_s: float
    breakdown: Breakdown


@dataclass(frozen=True)
class StepResult:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_gb: float
    fits_in_memory: bool
    breakdown: Breakdown
    critical_class: int
    classes: tuple[ClassSummary, ...]
    events: int
    """SimPy events processed."""
    wall_time_s: float
    records: tuple[OpRecord, ...] = field(default=(), repr=False)
    rank_finish_s: np.ndarray | None = field(default=None, repr=False, compare=False)
    """rank -> when it finished (expanded runs); each class then reports its slowest rank."""

    def to_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gb": self.peak_memory_gb,
            "fits_in_memory": self.fits_in_memory,
            "breakdown": self.breakdown.to_dict(),
            "critical_rank_class": self.critical_class,
            "rank_classes": [
                {"index": c.index, "program": c.program, "ranks": c.ranks,
                 "representative_rank": c.representative, "finish_s": c.finish_s,
                 "breakdown": c.breakdown.to_dict()} for c in self.classes],
            "simulation": {"events": self.events, "wall_time_s": self.wall_time_s},
        } | self._ranks_dict()

    def _ranks_dict(self) -> dict:
        """Expanded runs: the spread of the ranks' finish times and the slowest rank."""
        f = self.rank_finish_s
        if f is None:
            return {}
        return {"ranks": {"count": len(f), "slowest_rank": int(np.argmax(f)),
                          "finish_s_min": float(f.min()), "finish_s_median": float(np.median(f)),
                          "finish_s_max": float(f.max())}}

    def frame(self):
        """One row per rank class with its breakdown (a pandas DataFrame)."""
        import pandas as pd
        rows = []
        for c in self.classes:
            rows.append({"class": c.index, "program": c.program, "ranks": c.ranks,
                         "finish_s": c.finish_s, **c.breakdown.columns()})
        return pd.DataFrame(rows)

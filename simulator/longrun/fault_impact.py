"""What an in-step fault does to a step: its time, and which group's waits put it on the
critical path.

A slow GPU or a degraded link on one rank splits that rank off into its own rank class (the
engine's ``Faults``); everyone synchronised with it through a collective or a send/recv waits.
Comparing the faulted step's critical rank class with the same program's class in the healthy
step tells where the extra time shows up: in the slow rank's own compute, in a data-parallel or
tensor-parallel wait, or as pipeline bubble.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.fault_waits import PARTS, parts
from clustersim.simulator.engine import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.result import StepResult
from clustersim.workloads.trace import Trace


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultImpact:
    kind: str
    """"slow gpu" or "slow link"."""
    rank: int
    factor: float
    healthy_step_s: float
    step_s: float
    faulted_program: str
    """The pipeline stage program of the faulted rank."""
    critical_program: str
    critical_is_faulted: bool
    """The faulted rank itself finishes last."""
    grown: tuple[tuple[str, float], ...]
    """Parts of the critical class's time that grew, largest first (seconds)."""

    @property
    def slowdown(self) -> float:
        return self.step_s / self.healthy_step_s

    def explanation(self) -> str:
        if not self.grown:
            return "no part of the critical rank's step grew"
        part, delta = self.grown[0]
        where = "the faulted rank itself" if self.critical_is_faulted else (
            f"rank class of {self.critical_program}")
        what = {"compute": "its own compute", "bubble": "pipeline bubble (waiting on a stage)",
                "optimizer": "optimizer", "offload": "waiting on offload copies",
                "host": "waiting on the host's kernel issue",
                "other": "other waits"}.get(
            part, f"exposed {part.upper()} communication (waiting on its {part.upper()} group)")
        return f"{where}: {what} +{delta:.3f} s"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "factor": self.factor,
                "healthy_step_time_s": self.healthy_step_s, "step_time_s": self.step_s,
                "slowdown": self.slowdown, "faulted_program": self.faulted_program,
                "critical_program": self.critical_program,
                "critical_is_faulted": self.critical_is_faulted,
                "grown_s": dict(self.grown), "explanation": self.explanation()}


def fault_impact(trace: Trace, cluster: ClusterSpec, healthy: StepResult, faults: Faults,
                 kind: str, options: SimulationOptions = SimulationOptions(record=False)
                 ) -> tuple[FaultImpact, StepResult]:
    """Simulate ``faults`` (one faulted rank) and explain the difference to ``healthy``."""
    (rank,) = faults.ranks()
    sim = StepSimulation(trace, cluster, options, faults)
    result = sim.run()
    faulted = result.classes[int(sim.class_of[rank])]
    critical = result.classes[result.critical_class]
    before = next((c for c in healthy.classes if c.program == critical.program),
                  healthy.classes[healthy.critical_class])
    new, old = parts(critical.breakdown), parts(before.breakdown)
    grown = sorted(((p, new[p] - old[p]) for p in PARTS if new[p] - old[p] > 1e-9),
                   key=lambda item: -item[1])
    factor = faults.compute_slowdown.get(rank) or faults.link_slowdown.get(rank, 1.0)
    impact = FaultImpact(kind=kind, rank=rank, factor=factor,
                         healthy_step_s=healthy.step_time_s, step_s=result.step_time_s,
                         faulted_program=faulted.program, critical_program=critical.program,
                         critical_is_faulted=critical.index == faulted.index,
                         grown=tuple(grown))
    return impact, result

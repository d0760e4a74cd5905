"""Where the time an in-step fault costs shows up: which ranks' compute or waits grew, and
through which of their groups.

The step is replayed twice, healthy and with the faults (the engine's ``Faults``; a faulted rank
splits into its own rank class, and so do the ranks that sit in a group with it). Each rank class
of the faulted step is compared with the healthy class its representative belonged to, part by
part of its breakdown (compute, exposed communication per axis, bubble, optimizer, other). A
grown wait on an axis is charged to that axis's group: the group of a faulted rank (they wait
for it) or groups without one (they wait on something that waited for it, e.g. a pipeline
neighbour).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.engine import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.result import AXES, Breakdown, StepResult
from clustersim.workloads.axes import Axis
from clustersim.workloads.trace import Trace

PARTS = ("compute",) + AXES + ("bubble", "optimizer", "offload", "host", "other")
_WAIT_AXIS = {a: a for a in AXES} | {"bubble": Axis.PP.value}
"""The group set a part's waits go through (bubble: waiting on a pipeline neighbour)."""
_PART_NAMES = {"compute": "own compute", "bubble": "pipeline bubble", "optimizer": "optimizer",
               "offload": "offload copies", "host": "host issue",
               "other": "other waits (input, launches)"}
GROWTH_FLOOR_S = 1e-6
"""Growth below a microsecond is rounding, not a wait."""


def parts(b: Breakdown) -> dict[str, float]:
    """A breakdown as ``{part: seconds}`` with communication split by axis."""
    out = {"compute": b.compute_s, "bubble": b.bubble_s, "optimizer": b.optimizer_s,
           "offload": b.offload_s, "host": b.host_s, "other": b.other_s}
    out.update({a: b.exposed_comm_s.get(a, 0.0) for a in AXES})
    return out


def part_name(part: str) -> str:
    return _PART_NAMES.get(part, f"exposed {part.upper()} communication")


@dataclass(frozen=True, kw_only=True, slots=True)
class GrownWait:
    """One part of the step that grew for a set of ranks related alike to the faults."""

    part: str
    """compute, an axis (tp, cp, ep, pp, dp), bubble, optimizer or other."""
    programs: tuple[str, ...]
    """The pipeline stage programs of those ranks."""
    group: str
    """Whose group: ``rank 17 itself``, ``the DP group of rank 17``, ``DP groups without a
    faulted rank``..."""
    ranks: tuple[int, ...]
    grown_s: float
    """The largest growth among these ranks."""

    def describe(self) -> str:
        where = self.programs[0] if len(self.programs) == 1 else (
            f"{len(self.programs)} stages")
        return (f"{self.group} ({len(self.ranks)} rank{'s' if len(self.ranks) != 1 else ''}, "
                f"{where}): {part_name(self.part)} +{self.grown_s * 1e3:.1f} ms")

    def to_dict(self) -> dict:
        return {"part": self.part, "programs": list(self.programs), "group": self.group,
                "ranks": len(self.ranks), "first_ranks": list(self.ranks[:16]),
                "grown_s": self.grown_s, "description": self.describe()}


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultedStep:
    """The healthy and the faulted step of one trace, and what grew between them."""

    healthy: StepResult
    faulted: StepResult
    grown: tuple[GrownWait, ...]
    """Largest first."""

    @property
    def lost_s(self) -> float:
        return self.faulted.step_time_s - self.healthy.step_time_s

    def to_dict(self) -> dict:
        return {"healthy_step_time_s": self.healthy.step_time_s,
                "step_time_s": self.faulted.step_time_s, "lost_s": self.lost_s,
                "slowdown": self.faulted.step_time_s / self.healthy.step_time_s,
                "grown": [g.to_dict() for g in self.grown]}


def _relation(trace: Trace, part: str, ranks: Sequence[int], faulted: set[int]) -> str:
    """Whose group a part that grew for ``ranks`` (one rank class) belongs to."""
    mine = sorted(faulted.intersection(ranks))
    if part not in _WAIT_AXIS:
        if mine:
            return f"rank {mine[0]} itself" if len(mine) == 1 else f"ranks {mine} themselves"
        return "ranks without a fault"
    axis = _WAIT_AXIS[part]
    label = axis.upper()
    group_set = trace.group_sets.get(axis)
    if group_set is None:
        return f"{label} groups"
    members = set(group_set.group_of(ranks[0]))
    hit = sorted(members & faulted)
    if not hit:
        return f"{label} groups without a faulted rank (waiting on ranks it delayed)"
    return f"the {label} group of rank {hit[0]}"


def attribute(trace: Trace, healthy: StepSimulation, faulted: StepSimulation,
              healthy_result: StepResult, faulted_result: StepResult) -> tuple[GrownWait, ...]:
    """The parts that grew, per part and group relation, largest first."""
    bad = faulted.faults.ranks()
    rows: dict[tuple[str, str], tuple[list[int], list[str], float]] = {}
    for cls, summary in zip(faulted.classes, faulted_result.classes):
        before = healthy_result.classes[int(healthy.class_of[cls.representative])]
        new, old = parts(summary.breakdown), parts(before.breakdown)
        for part in PARTS:
            delta = new[part] - old[part]
            if delta <= GROWTH_FLOOR_S:
                continue
            key = (part, _relation(trace, part, cls.ranks, bad))
            ranks, programs, top = rows.get(key, ([], [], 0.0))
            if summary.program not in programs:
                programs = programs + [summary.program]
            rows[key] = (ranks + list(cls.ranks), programs, max(top, delta))
    grown = [GrownWait(part=p, programs=tuple(progs), group=group, ranks=tuple(sorted(r)),
                       grown_s=s) for (p, group), (r, progs, s) in rows.items()]
    return tuple(sorted(grown, key=lambda g: (-g.grown_s, g.part, g.group)))


def faulted_step(trace: Trace, cluster: ClusterSpec, faults: Faults,
                 options: SimulationOptions = SimulationOptions(record=False),
                 healthy: tuple[StepSimulation, StepResult] | None = None) -> FaultedStep:
    """Simulate ``trace`` with and without ``faults`` and attribute the difference
    (``healthy``: a replay already run without faults, to reuse)."""
    if healthy is None:
        sim = StepSimulation(trace, cluster, options)
        healthy = (sim, sim.run())
    sim = StepSimulation(trace, cluster, options, faults)
    result = sim.run()
    grown = attribute(trace, healthy[0], sim, healthy[1], result)
    return FaultedStep(healthy=healthy[1], faulted=result, grown=grown)

"""The three seams between the engine and its cost models, as structural interfaces.

The engine asks only these questions; anything that answers them (the analytic models, a
calibrated or measured one, a test double) can stand in. Vidur's ``get_execution_time`` seam is
the pattern: one small interface per resource, profiling and fitting behind it.
"""

from __future__ import annotations

from typing import Protocol

from clustersim.hardware_specs.topology import Topology
from clustersim.simulator.cost.collectives import Plan
from clustersim.workloads.trace import CollectiveKind, ComputeOp, CopyKind, TokenRouting

Instances = tuple[tuple[int, ...], ...]
"""The device groups that run one collective at the same time (e.g. all DP groups of a stage)."""


class ComputeCost(Protocol):
    """How long a compute op (its kernels, back to back on one stream) takes, alone."""

    def op_time(self, op: ComputeOp) -> float: ...


class NetworkCost(Protocol):
    """How a collective or a set of sends moves over the fabric: a :class:`Plan` of latency,
    scale-up time and per-link network bytes that ``topology`` turns into seconds."""

    topology: Topology

    def plan(self, kind: CollectiveKind, nbytes: float, instances: Instances,
             routing: TokenRouting | None = None) -> Plan: ...

    def p2p_plan(self, nbytes: float, pairs: list[tuple[int, int]]) -> Plan: ...


class MemoryCost(Protocol):
    """What fits on a device, and how long moving bytes to and from its offload tier takes."""

    capacity_bytes: float

    def copy_time(self, kind: CopyKind, nbytes: float) -> float: ...

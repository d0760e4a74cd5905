"""What a step replay is asked to do: its engine options, and the in-step faults of single ranks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from clustersim.hardware_specs import DeviceSpec
from clustersim.simulator.cost.collectives import Algorithm
from clustersim.simulator.interference import Interference
from clustersim.workloads.trace import CollectiveKind


class NetworkMode(enum.Enum):
    FLOW = "flow"
    """Concurrent transfers share network links max-min fairly (``simulator/flows.py``)."""
    ANALYTIC = "analytic"
    """Every collective takes its uncontended time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulationOptions:
    comm_slowdown_when_overlapped: float | None = None
    """Extra fraction of time a collective takes when it starts while the compute stream is
    busy (NCCL kernels and GEMMs compete for SMs and HBM; vTrain, MICRO'24, measured NCCL ~30%
    slower inside training than alone). None: the device's own figure."""
    compute_slowdown_when_overlapped: float | None = None
    """Extra fraction of time compute takes while a transfer of its rank is moving data (the
    same cores or SMs do both): only the overlapping part of an op stretches, whether the op
    or the transfer started first. None: the device's own figure."""
    expand: bool = False
    """Follow every rank's own clock, so stragglers and degraded links can differ rank by rank
    (``lanes.py``; one class per rank when compute/communication interference is on)."""
    record: bool = True
    """Keep per-op records (for the Chrome trace and breakdowns of every class)."""
    network: NetworkMode = NetworkMode.FLOW
    algorithms: Mapping[CollectiveKind, Algorithm] = field(default_factory=dict)
    """Forced collective algorithm per kind (default: NCCL-style automatic choice)."""

    def one_class_per_rank(self, device: DeviceSpec) -> bool:
        """Whether an expanded run simulates each rank as a class of its own: when compute and
        transfers slow each other down (a per-device state the lanes do not follow). Otherwise
        it follows every rank's clock for about the events of the collapsed run."""
        return self.expand and Interference.of(
            device, comm=self.comm_slowdown_when_overlapped,
            compute=self.compute_slowdown_when_overlapped).any


@dataclass(frozen=True, slots=True)
class Faults:
    """In-step conditions of single ranks: a slow GPU, a degraded link, a slow host."""

    compute_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 (a straggler GPU: thermal throttling, a bad HBM stack)."""
    link_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the time of every communication it takes part in (degraded NIC
    or cable)."""
    nic_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the scale-out (network) part of its transfers only: its NIC or
    cable runs at a fraction of its bandwidth."""
    nvlink_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the scale-up (NVLink) part of its transfers only."""
    launch_overhead_s: Mapping[int, float] = field(default_factory=dict)
    """rank -> host seconds per kernel launch (a slow or contended CPU): a compute op takes at
    least its kernel count times this, since the GPU cannot run kernels faster than the host
    launches them."""
    input_stall_s: Mapping[int, float] = field(default_factory=dict)
    """rank -> seconds its step's input arrives late (a slow data loader): its compute stream
    starts that much after the others."""

    def condition(self, rank: int) -> tuple[float, float, float, float, float, float]:
        return (self.compute_slowdown.get(rank, 1.0), self.link_slowdown.get(rank, 1.0),
                self.nic_slowdown.get(rank, 1.0), self.nvlink_slowdown.get(rank, 1.0),
                self.launch_overhead_s.get(rank, 0.0), self.input_stall_s.get(rank, 0.0))

    def ranks(self) -> set[int]:
        return (set(self.compute_slowdown) | set(self.link_slowdown) | set(self.nic_slowdown)
                | set(self.nvlink_slowdown) | set(self.launch_overhead_s)
                | set(self.input_stall_s))

"""What the summary says about a heterogeneous cluster (``cluster.groups``): its groups, and
each program's memory against the smallest device it runs on."""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec
from clustersim.workloads.memory import GIB
from clustersim.workloads.trace import Trace


def cluster_line(cluster: ClusterSpec) -> str:
    """``64 x a100-80gb (dgx-a100) + 64 x h100-sxm (dgx-h100), <fabric>``."""
    parts = [f"{g.num_devices} x {g.device.name} ({g.node.name})" for g in cluster.groups]
    return " + ".join(parts) + f", {cluster.fabric.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupMemory:
    program: str
    device: str
    peak_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


def group_memory(cluster: ClusterSpec, trace: Trace) -> list[GroupMemory]:
    """Each program's peak on each group it runs on."""
    out = []
    for program in trace.programs:
        for i in sorted({cluster.group_of_rank(r) for r in program.ranks}):
            device = cluster.groups[i].device
            out.append(GroupMemory(program=program.name, device=device.name,
                                   peak_bytes=program.peak_memory_bytes,
                                   capacity_bytes=device.memory_bytes))
    return out


def overflow(cluster: ClusterSpec, trace: Trace) -> str:
    """Which programs do not fit on which group's devices (empty when all fit)."""
    over = [m for m in group_memory(cluster, trace) if not m.fits]
    return "; ".join(f"{m.program} on {m.device} needs {m.peak_bytes / GIB:.1f} GiB of "
                     f"{m.capacity_bytes / GIB:.1f} GiB" for m in over)

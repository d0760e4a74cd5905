"""Device memory: its capacity, and copies between HBM and the offload tiers (host DRAM, CXL,
persistent memory or NVMe)."""

from __future__ import annotations

from clustersim.hardware_specs import ClusterSpec
from clustersim.workloads.trace import CopyKind

COPY_LAUNCH_S = 10e-6
"""Fixed cost of one host <-> device copy (a cudaMemcpyAsync launch and its completion)."""


class MemoryModel:
    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        self.capacity_bytes = cluster.device.memory_bytes

    def copy_time(self, kind: CopyKind, nbytes: float) -> float:
        """Device <-> offload-tier copies over PCIe (and the tier's own bandwidth, shared by
        the devices that stream to it at once), or memory-bound host work on offloaded
        optimizer states, which also streams them through the tier (ZeRO-Infinity). With
        state split over tiers, each tier's share is one copy at that tier's bandwidth, one
        after the other on the copy stream: sum of share x bytes / tier bandwidth."""
        c = self.cluster
        if kind is CopyKind.HOST_COMPUTE:
            return sum(share * nbytes / min(c.per_device(c.host_memory, write=False),
                                            c.per_device(tier, write=False))
                       for tier, share in c.offload_placement)
        write = kind is CopyKind.DEVICE_TO_HOST
        return sum(COPY_LAUNCH_S + share * nbytes / min(c.node.pcie_bandwidth,
                                                        c.per_device(tier, write))
                   for tier, share in c.offload_placement)

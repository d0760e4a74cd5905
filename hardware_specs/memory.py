"""Memory and storage tiers below HBM: where offload and checkpoints go."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.units import Quantity


class TierKind(enum.Enum):
    HBM = "hbm"
    HOST_DRAM = "host_dram"
    CXL = "cxl"
    NON_VOLATILE = "non_volatile"
    LOCAL_NVME = "local_nvme"
    PARALLEL_FS = "parallel_fs"


class TierScope(enum.Enum):
    """Who shares a tier's bandwidth: one device, one node, or the whole cluster."""

    DEVICE = "device"
    NODE = "node"
    CLUSTER = "cluster"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryTierSpec:
    """Capacity and bandwidth of one tier, per ``scope`` (a node's DRAM, a cluster's filesystem)."""

    name: str
    kind: TierKind
    scope: TierScope
    capacity_bytes: float
    read_bandwidth: float
    write_bandwidth: float
    latency_s: float
    source: str = ""

    def reach(self, nodes: int, devices_per_node: int, write: bool,
              node_bandwidth: float = math.inf) -> float:
        """Bytes/s that ``nodes`` nodes reach together on this tier, each through at most
        ``node_bandwidth`` (its path to the tier): a cluster-wide tier is shared by all of
        them, a node's by its devices, a device's tier is its own."""
        bw = self.write_bandwidth if write else self.read_bandwidth
        if self.scope is TierScope.CLUSTER:
            return min(bw, nodes * node_bandwidth)
        per_node = bw * (devices_per_node if self.scope is TierScope.DEVICE else 1)
        return nodes * min(per_node, node_bandwidth)


def read_tier(f: Fields) -> MemoryTierSpec:
    spec = MemoryTierSpec(
        name=f.path.rsplit(".", 1)[-1],
        kind=f.choice("kind", TierKind),
        scope=f.choice("scope", TierScope),
        capacity_bytes=f.quantity("capacity", Quantity.BYTES),
        read_bandwidth=f.quantity("read_bandwidth", Quantity.BANDWIDTH),
        write_bandwidth=f.quantity("write_bandwidth", Quantity.BANDWIDTH),
        latency_s=f.quantity("latency", Quantity.TIME),
        source=f.text("source", ""),
    )
    f.done()
    return spec

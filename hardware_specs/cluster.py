"""A cluster: devices in nodes on a fabric, with its storage tiers and failure model."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from clustersim.hardware_specs.device import DeviceSpec
from clustersim.hardware_specs.fabric import FabricSpec
from clustersim.hardware_specs.failures import FailureModel
from clustersim.hardware_specs.memory import MemoryTierSpec
from clustersim.hardware_specs.node import NodeSpec


class Placement(enum.Enum):
    """How job ranks map onto devices."""

    PACKED = "packed"
    """Rank r on device r: consecutive ranks (a TP group) share a node."""
    SCATTERED = "scattered"
    """Round-robin over nodes: consecutive ranks on different nodes (a worst case to compare)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceGroup:
    """Devices of one kind in whole nodes of one kind: one part of a heterogeneous cluster.
    Each group keeps its own scale-up domain (its node's NVLink); the groups meet on the
    cluster's one fabric, each node through its own NICs."""

    device: DeviceSpec
    node: NodeSpec
    num_devices: int
    first_device: int
    """Devices are numbered group after group, in the order the config lists them."""

    @property
    def devices(self) -> range:
        return range(self.first_device, self.first_device + self.num_devices)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """Everything the simulator needs to know about the hardware of one run."""

    device: DeviceSpec
    node: NodeSpec
    num_devices: int
    fabric: FabricSpec
    failure_model: FailureModel
    host_memory: MemoryTierSpec
    local_storage: MemoryTierSpec
    checkpoint_storage: MemoryTierSpec
    placement: Placement = Placement.PACKED
    offload_tier: MemoryTierSpec | None = None
    """Where offloaded optimizer states and parameters live (ZeRO-Offload / ZeRO-Infinity);
    None: the node's host DRAM."""
    offload_split: tuple[tuple[MemoryTierSpec, float], ...] = ()
    """Offloaded state over several tiers (``strategy.offload_split``): each tier and the
    fraction of the offloaded bytes it holds; empty: all of it in ``offload_memory``."""
    groups: tuple[DeviceGroup, ...] = ()
    """A heterogeneous cluster's device groups (``cluster.groups``); empty: every device is
    ``device`` in a ``node``. With groups, ``device`` and ``node`` are the group whose NICs
    are slowest: what a transfer between groups is paced by."""

    @property
    def device_groups(self) -> tuple[DeviceGroup, ...]:
        """The groups, or the whole cluster as one group."""
        return self.groups or (DeviceGroup(device=self.device, node=self.node,
                                           num_devices=self.num_devices, first_device=0),)

    def group_of_device(self, device: int) -> int:
        """Index of the group that holds ``device`` (0 on a homogeneous cluster)."""
        for i, g in enumerate(self.groups):
            if device in g.devices:
                return i
        return 0

    def group_of_rank(self, rank: int) -> int:
        return self.group_of_device(self.device_of(rank))

    def group_view(self, index: int) -> "ClusterSpec":
        """The cluster as one group sees it: every device its device, every node its node."""
        g = self.device_groups[index]
        return replace(self, device=g.device, node=g.node, groups=())

    @property
    def smallest_memory_bytes(self) -> float:
        """Memory of the smallest device: what a program that may run on any of them has."""
        return min(g.device.memory_bytes for g in self.device_groups)

    def mean_peak_flops(self, dtype) -> float:
        """Dense peak of the average device (MFU's denominator on a mixed cluster)."""
        return sum(g.device.flops(dtype) * g.num_devices
                   for g in self.device_groups) / self.num_devices

    @property
    def offload_memory(self) -> MemoryTierSpec:
        return self.offload_tier or self.host_memory

    @property
    def offload_placement(self) -> tuple[tuple[MemoryTierSpec, float], ...]:
        """Each tier that holds offloaded state and the fraction of it that it holds."""
        return self.offload_split or ((self.offload_memory, 1.0),)

    def per_device(self, tier: MemoryTierSpec, write: bool) -> float:
        """One device's share of a tier's bandwidth when every device streams at once."""
        devices = self.num_nodes * self.devices_per_node
        return tier.reach(self.num_nodes, self.devices_per_node, write) / devices

    @property
    def devices_per_node(self) -> int:
        """Devices per node actually used (a 4-GPU cluster uses 4 of a DGX's 8)."""
        return min(self.node.devices_per_node, self.num_devices)

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_devices / self.devices_per_node)

    def device_of(self, rank: int) -> int:
        """The device that runs job rank ``rank``."""
        if self.placement is Placement.SCATTERED:
            node, local = rank % self.num_nodes, rank // self.num_nodes
            return node * self.devices_per_node + local
        return rank

    def node_of(self, rank: int) -> int:
        return self.device_of(rank) // self.devices_per_node

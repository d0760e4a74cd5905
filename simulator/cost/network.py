"""Collective and point-to-point times: NCCL-style algorithms with alpha-beta terms.

The model follows NCCL's own tuner (``src/graph/tuning.cc``): for each algorithm (ring, tree)
and protocol (LL, LL128, Simple) the time is a latency, ``baseLat + steps x hwLat`` (per-hop
latencies for NVLink, PCIe and the network, in microseconds, copied from that file), plus
the bytes each rank must move over its bottleneck link; NCCL picks the fastest pair, and so do
we. LL carries 4 data bytes per 8 on the wire and LL128 120 per 128 (NCCL docs), so they trade
bandwidth for latency. Bandwidths come from the hardware spec:

- inside a node, a rank's scale-up bandwidth (NVLink/NVSwitch/xGMI) per direction;
- across nodes, a ring's node-crossing hop runs on the NICs: a group with g members per node
  shares g/G of the node's NICs (G devices per node all run the same collective on their own
  groups), so a ring's per-rank bandwidth is min(scale-up, g x NIC share) (nccl-tests: 8
  GPUs x 8 NICs per node reach the NIC line rate as bus bandwidth);
- a group that spans several leaf switches crosses the leaf uplinks and is slowed by the
  leaf tier's oversubscription.

Bus bandwidth factors (nccl-tests doc/PERFORMANCE.md): all-reduce moves 2(n-1)/n of the
buffer through each rank, all-gather and reduce-scatter (n-1)/n.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

from hardware_specs import ClusterSpec, ScaleUpKind
from workloads.trace import CollectiveKind, CopyKind


class Algorithm(enum.Enum):
    RING = "ring"
    TREE = "tree"


class Protocol(enum.Enum):
    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


class Hop(enum.Enum):
    NVLINK = 0
    PCI = 1
    NET = 2


# NCCL src/graph/tuning.cc: baseLat[algorithm][protocol] and hwLat[hop][algorithm][protocol], us.
BASE_LATENCY_US = {
    Algorithm.TREE: {Protocol.LL: 6.8, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.RING: {Protocol.LL: 6.6, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
}
HOP_LATENCY_US = {
    Hop.NVLINK: {Algorithm.TREE: {Protocol.LL: 0.6, Protocol.LL128: 1.25, Protocol.SIMPLE: 4.0},
                 Algorithm.RING: {Protocol.LL: 0.6, Protocol.LL128: 1.9, Protocol.SIMPLE: 3.4}},
    Hop.PCI: {Algorithm.TREE: {Protocol.LL: 1.0, Protocol.LL128: 1.9, Protocol.SIMPLE: 4.0},
              Algorithm.RING: {Protocol.LL: 1.0, Protocol.LL128: 2.5, Protocol.SIMPLE: 5.7}},
    Hop.NET: {Algorithm.TREE: {Protocol.LL: 5.0, Protocol.LL128: 8.5, Protocol.SIMPLE: 14.0},
              Algorithm.RING: {Protocol.LL: 2.7, Protocol.LL128: 4.0, Protocol.SIMPLE: 14.0}},
}
# Payload fraction of what goes on the wire: LL sends 4 B of data with a 4 B flag; LL128 uses
# 120 B of each 128 B line (NCCL docs, "NCCL_PROTO").
PROTOCOL_EFFICIENCY = {Protocol.LL: 0.5, Protocol.LL128: 120.0 / 128.0, Protocol.SIMPLE: 1.0}
COPY_KERNEL_S = 5e-6
"""One small device-to-device copy kernel, launch-bound (CUDA launch latency ~5 us)."""


@dataclass(frozen=True, slots=True)
class GroupShape:
    """How a communicator's ranks sit on the hardware."""

    size: int
    per_node: int
    """Members of one group inside one node."""
    nodes: int
    leaves: int = 1
    """Leaf-switch domains the group spans (1: never crosses the leaf uplinks)."""

    @staticmethod
    def of(ranks: tuple[int, ...], cluster: ClusterSpec) -> "GroupShape":
        per = cluster.devices_per_node
        nodes = sorted({r // per for r in ranks})
        per_leaf = cluster.fabric.nodes_per_leaf(cluster.node.nic_count)
        leaves = len({n // per_leaf for n in nodes})
        return GroupShape(len(ranks), max(1, len(ranks) // len(nodes)), len(nodes), leaves)


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    time_s: float
    algorithm: Algorithm
    protocol: Protocol


class NetworkModel:
    """Alpha-beta collective costs for one cluster (see the module docstring)."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        node = cluster.node
        self.intra_hop = Hop.PCI if node.scale_up_kind is ScaleUpKind.PCIE else Hop.NVLINK
        self.scale_up = node.scale_up_bandwidth * node.scale_up_efficiency
        self.nic_share = (node.network_bandwidth * node.nic_efficiency
                          / cluster.devices_per_node) if node.nic_count else 0.0
        self.leaf_oversubscription = cluster.fabric.tiers[0].oversubscription
        self._cache: dict[tuple, CollectiveEstimate] = {}

    def ring_bandwidth(self, shape: GroupShape) -> float:
        """Per-rank bandwidth of a ring over ``shape`` (bytes/s)."""
        if shape.nodes == 1:
            return self.scale_up
        net = shape.per_node * self.nic_share
        if shape.leaves > 1:
            net /= self.leaf_oversubscription
        return min(self.scale_up, net) if shape.per_node > 1 else net

    def estimate(self, kind: CollectiveKind, nbytes: float, shape: GroupShape) -> CollectiveEstimate:
        key = (kind, nbytes, shape)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._estimate(kind, nbytes, shape)
        return hit

    def collective_time(self, kind: CollectiveKind, nbytes: float, shape: GroupShape,
                        per_rank_copies: bool = False) -> float:
        copies = shape.size * COPY_KERNEL_S if per_rank_copies else 0.0
        return self.estimate(kind, nbytes, shape).time_s + copies

    def _estimate(self, kind: CollectiveKind, nbytes: float, shape: GroupShape) -> CollectiveEstimate:
        n, nodes = shape.size, shape.nodes
        if n <= 1 or nbytes <= 0:
            return CollectiveEstimate(0.0, Algorithm.RING, Protocol.SIMPLE)
        bw = self.ring_bandwidth(shape)
        if kind is CollectiveKind.ALL_REDUCE:
            traffic, steps, inter = 2.0 * (n - 1) / n * nbytes, 2 * (n - 1), 2 * (nodes - 1)
        elif kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
            traffic, steps, inter = (n - 1) / n * nbytes, n - 1, nodes - 1
        elif kind is CollectiveKind.BROADCAST:
            traffic, steps, inter = nbytes, n - 1, nodes - 1
        elif kind is CollectiveKind.RING_EXCHANGE:
            traffic, steps, inter = nbytes, 1, 1 if nodes > 1 else 0
        else:  # all-to-all: the intra-node and inter-node shares move at the same time
            local = (shape.per_node - 1) / n * nbytes / self.scale_up
            remote = 0.0
            if nodes > 1:
                nic = self.nic_share / (self.leaf_oversubscription if shape.leaves > 1 else 1.0)
                remote = (n - shape.per_node) / n * nbytes / nic
            lat = self._latency(Algorithm.RING, Protocol.SIMPLE, 1, 1 if nodes > 1 else 0)
            return CollectiveEstimate(lat + max(local, remote), Algorithm.RING, Protocol.SIMPLE)
        best = None
        for proto in Protocol:
            t = self._latency(Algorithm.RING, proto, steps, inter) + \
                traffic / (bw * PROTOCOL_EFFICIENCY[proto])
            if best is None or t < best.time_s:
                best = CollectiveEstimate(t, Algorithm.RING, proto)
            if kind is CollectiveKind.ALL_REDUCE and nodes > 1:
                # Double binary tree: chains inside nodes, log2 depth across them.
                depth = 2 * ((shape.per_node - 1) + math.ceil(math.log2(nodes)))
                t = (BASE_LATENCY_US[Algorithm.TREE][proto] * 1e-6
                     + depth * self._hop(Algorithm.TREE, proto, nodes > 1) * 1e-6
                     + traffic / (bw * PROTOCOL_EFFICIENCY[proto]))
                if t < best.time_s:
                    best = CollectiveEstimate(t, Algorithm.TREE, proto)
        return best

    def _hop(self, algorithm: Algorithm, proto: Protocol, net: bool) -> float:
        return HOP_LATENCY_US[Hop.NET if net else self.intra_hop][algorithm][proto]

    def _latency(self, algorithm: Algorithm, proto: Protocol, steps: int, inter: int) -> float:
        measured = self.cluster.node.collective_latency_s
        if measured:
            return (1 + steps - inter) * measured + inter * self.cluster.node.nic_latency_s
        us = (BASE_LATENCY_US[algorithm][proto]
              + (steps - inter) * HOP_LATENCY_US[self.intra_hop][algorithm][proto]
              + inter * HOP_LATENCY_US[Hop.NET][algorithm][proto])
        return us * 1e-6

    def p2p_time(self, nbytes: float, same_node: bool) -> float:
        """One send/recv pair (Simple protocol)."""
        hop = self.intra_hop if same_node else Hop.NET
        lat = (BASE_LATENCY_US[Algorithm.RING][Protocol.SIMPLE]
               + HOP_LATENCY_US[hop][Algorithm.RING][Protocol.SIMPLE]) * 1e-6
        node = self.cluster.node
        bw = self.scale_up if same_node else node.nic_bandwidth * node.nic_efficiency
        return lat + nbytes / bw

    def copy_time(self, kind: CopyKind, nbytes: float) -> float:
        """Host <-> device copies over PCIe, or memory-bound host work (offloaded optimizer)."""
        c = self.cluster
        if kind is CopyKind.HOST_COMPUTE:
            per_device = c.host_memory.read_bandwidth / c.devices_per_node
            return nbytes / per_device
        return 10e-6 + nbytes / c.node.pcie_bandwidth


@functools.lru_cache(maxsize=None)
def bus_factor(kind: CollectiveKind, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x factor."""
    if kind is CollectiveKind.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
        return (n - 1) / n
    return 1.0

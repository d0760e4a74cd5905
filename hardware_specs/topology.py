"""Where each device sits, and which links a transfer between two devices crosses.

Built from the cluster spec alone. Links are directional and named by kind and index:

- ``nic_tx`` / ``nic_rx`` (one NIC, per direction), indexed by global NIC id;
- ``leaf_up`` / ``leaf_down``: all uplinks of one leaf switch to its spine block, as a bundle;
- ``pod_up`` / ``pod_down``: all uplinks of one pod (a spine block) to the core tier.

Rail-optimised fabrics (DGX SuperPOD) wire NIC k of every node to the leaves of rail k; a classic
fat-tree wires all NICs of a node to one top-of-rack leaf. A leaf serves as many nodes as it has
down ports (rail) or down ports / NICs per node (fat-tree); its uplink bundle carries its down
capacity divided by the tier's oversubscription, and a pod's core uplinks likewise. Transfers
between GPUs of different rails go to the destination's rail over NVLink first (NCCL's PXN, on
by default since NCCL 2.12), so inter-node traffic stays on one rail.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from clustersim.hardware_specs.cluster import ClusterSpec
from clustersim.hardware_specs.fabric import FabricKind


class LinkKind(enum.IntEnum):
    """Integer-valued so that links hash fast: the flow model handles millions of them."""

    NIC_TX = 0
    NIC_RX = 1
    LEAF_UP = 2
    LEAF_DOWN = 3
    POD_UP = 4
    POD_DOWN = 5


Link = tuple[LinkKind, int]

LINK_CODE_STRIDE = 1 << 40
"""A link as one integer, ``kind * LINK_CODE_STRIDE + index`` (:meth:`Topology.routes`)."""


_KINDS = tuple(LinkKind)


def links_of(codes: np.ndarray) -> list[Link]:
    """Links of their codes (:data:`LINK_CODE_STRIDE`), split in one array operation."""
    kind, index = np.divmod(np.asarray(codes, dtype=np.int64), LINK_CODE_STRIDE)
    return list(zip(map(_KINDS.__getitem__, kind.tolist()), index.tolist()))


@dataclass(frozen=True, slots=True)
class Location:
    node: int
    local: int
    """Index of the device inside its node."""
    nic: int
    """Global id of the NIC this device uses (its rail's NIC on its node)."""
    rail: int
    leaf: int
    pod: int


class Topology:
    """Device locations and link capacities of one cluster (see the module docstring)."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        node = cluster.node
        self.devices_per_node = cluster.devices_per_node
        physical_nics = max(1, round(node.nic_count * self.devices_per_node
                                     / node.devices_per_node)) if node.nic_count else 0
        # More NICs than GPUs (AWS p5: 32 EFA cards for 8 GPUs): each GPU drives its own group
        # of NICs as one device (aws-ofi-nccl's multi-rail striping), modelled as one NIC of the
        # group's bandwidth; the group's k rails count as one rail of k leaves.
        self.nics_per_device = max(1, physical_nics // self.devices_per_node)
        self.nics_per_node = physical_nics // self.nics_per_device
        fabric = cluster.fabric
        self.rail_optimized = fabric.kind is FabricKind.RAIL_OPTIMIZED
        self.nodes_per_leaf = fabric.nodes_per_leaf(physical_nics or 1)
        self.leaves_per_rail_group = 1 if not self.rail_optimized else self.nics_per_node
        leaf_tier = fabric.tiers[0]
        nic_bw = node.nic_bandwidth * node.nic_efficiency * self.nics_per_device
        self.nic_capacity = nic_bw
        ports = self.nodes_per_leaf * (1 if self.rail_optimized else self.nics_per_node)
        self.leaf_capacity = ports * nic_bw / leaf_tier.oversubscription
        if len(fabric.tiers) > 2:
            spine = fabric.tiers[1]
            self.leaves_per_pod = max(1, spine.down_ports // self.nics_per_device)
            self.pod_capacity = self.leaves_per_pod * self.leaf_capacity / spine.oversubscription
        else:
            self.leaves_per_pod = math.inf
            self.pod_capacity = math.inf
        self._locations: dict[int, Location] = {}
        self._fields: dict[str, np.ndarray] | None = None
        self._capacity_of_kind = tuple(
            self.nic_capacity if k in (LinkKind.NIC_TX, LinkKind.NIC_RX)
            else self.leaf_capacity if k in (LinkKind.LEAF_UP, LinkKind.LEAF_DOWN)
            else self.pod_capacity for k in LinkKind)

    def location(self, device: int) -> Location:
        """Where ``device`` sits (memoised: collectives of thousands of GPUs ask again and
        again)."""
        hit = self._locations.get(device)
        if hit is None:
            f = self.fields()
            hit = self._locations[device] = Location(
                **{name: int(f[name][device]) for name in Location.__slots__})
        return hit

    def fields(self) -> dict[str, np.ndarray]:
        """Every device's :class:`Location`, one array per field, indexed by device."""
        if self._fields is None:
            device = np.arange(self.cluster.num_nodes * self.devices_per_node, dtype=np.int64)
            node, local = np.divmod(device, self.devices_per_node)
            nics = self.nics_per_node or 1
            rail = local * nics // self.devices_per_node
            group = node // self.nodes_per_leaf
            leaf = group * nics + rail if self.rail_optimized else group
            pod = (np.zeros_like(leaf) if self.leaves_per_pod is math.inf
                   else leaf // int(self.leaves_per_pod))
            self._fields = {"node": node, "local": local, "nic": node * nics + rail,
                            "rail": rail, "leaf": leaf, "pod": pod}
        return self._fields

    def capacity(self, link: Link) -> float:
        return self._capacity_of_kind[link[0]]

    def path(self, src: int, dst: int) -> tuple[Link, ...]:
        """Network links of a transfer from device ``src`` to device ``dst`` (empty inside a
        node). The sender uses the NIC of the receiver's rail on its own node (PXN)."""
        a, b = self.location(src), self.location(dst)
        if a.node == b.node:
            return ()
        sender = self.location(a.node * self.devices_per_node + b.local)
        links: list[Link] = [(LinkKind.NIC_TX, sender.nic)]
        if sender.leaf != b.leaf:
            links.append((LinkKind.LEAF_UP, sender.leaf))
            if sender.pod != b.pod:
                links += [(LinkKind.POD_UP, sender.pod), (LinkKind.POD_DOWN, b.pod)]
            links.append((LinkKind.LEAF_DOWN, b.leaf))
        links.append((LinkKind.NIC_RX, b.nic))
        return tuple(links)

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`path` of every transfer ``src[i] -> dst[i]`` at once: (transfer index, link
        code) of each link crossed, transfer by transfer, each path in :meth:`path`'s order."""
        f = self.fields()
        node, local = f["node"], f["local"]
        proxy = node[src] * self.devices_per_node + local[dst]
        remote = node[src] != node[dst]
        cross_leaf = remote & (f["leaf"][proxy] != f["leaf"][dst])
        cross_pod = cross_leaf & (f["pod"][proxy] != f["pod"][dst])
        hops = ((LinkKind.NIC_TX, f["nic"][proxy], remote),
                (LinkKind.LEAF_UP, f["leaf"][proxy], cross_leaf),
                (LinkKind.POD_UP, f["pod"][proxy], cross_pod),
                (LinkKind.POD_DOWN, f["pod"][dst], cross_pod),
                (LinkKind.LEAF_DOWN, f["leaf"][dst], cross_leaf),
                (LinkKind.NIC_RX, f["nic"][dst], remote))
        codes = np.stack([int(kind) * LINK_CODE_STRIDE + index for kind, index, _ in hops], axis=1)
        used = np.stack([mask for _, _, mask in hops], axis=1)
        transfer = np.broadcast_to(np.arange(len(src))[:, None], used.shape)
        return transfer[used], codes[used]

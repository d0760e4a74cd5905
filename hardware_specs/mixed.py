"""A heterogeneous cluster: groups of different devices (and nodes) on one fabric.

How the groups are connected, and why:
- Each group keeps its own scale-up domain: a collective among devices of one group runs on
  that group's NVLink and NICs, as it would in a homogeneous cluster of that group.
- Groups meet on the cluster's one scale-out fabric (a fat-tree, rail-optimised by default),
  every node through its own NICs: a DGX A100 at 8 x 200 Gb/s, a DGX H100 at 8 x 400 Gb/s.
  A collective or a pipeline send that spans groups is planned as on the group whose NICs are
  slowest: NCCL's ring and tree move the same bytes through every member's NIC, so the
  slowest link paces them (a ring's bandwidth is its slowest hop's).
- Nodes of every group must have the same number of devices and of NICs, so the fabric's
  rails and leaves are the same for all; a group is a whole number of its nodes, so no node
  mixes devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from clustersim.hardware_specs.cluster import ClusterSpec, DeviceGroup
from clustersim.hardware_specs.errors import SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupRequest:
    """One entry of ``cluster.groups`` as the config gives it."""

    gpu: str
    num_gpus: int
    node: str | None = None


def network_rank(cluster: ClusterSpec) -> tuple[float, float]:
    """How fast a group's node reaches the others: per-device NIC bandwidth, then NVLink."""
    node = cluster.node
    nics = node.nic_count * node.nic_bandwidth * node.nic_efficiency / node.devices_per_node
    return nics, node.scale_up_bandwidth * node.scale_up_efficiency


def mixed_cluster(catalog, parts: Sequence[GroupRequest], *, devices_per_node: int | None,
                  path: str = "cluster", **common) -> ClusterSpec:
    """A cluster of ``parts`` in order (devices numbered group after group); ``common`` are
    the cluster-wide parts (fabric, failure model, checkpoint storage) ``Catalog.cluster``
    takes."""
    if len(parts) < 2:
        raise SpecError(f"{path}.groups", f"expected two or more groups, got {len(parts)} "
                        "(one kind of device: give cluster.gpu and cluster.num_gpus)")
    total = sum(p.num_gpus for p in parts)
    views, groups, first = [], [], 0
    for i, part in enumerate(parts):
        where = f"{path}.groups[{i}]"
        view = catalog.cluster(device=part.gpu, num_devices=total, node=part.node,
                               devices_per_node=devices_per_node, path=where, **common)
        per_node = view.node.devices_per_node
        if part.num_gpus % per_node:
            raise SpecError(f"{where}.num_gpus", f"{part.num_gpus} is not a whole number of "
                            f"{view.node.name} nodes ({per_node} devices each); a node holds "
                            "one kind of device")
        if views:
            ref = views[0].node
            if (per_node, view.node.nic_count) != (ref.devices_per_node, ref.nic_count):
                raise SpecError(f"{where}.node", f"{view.node.name} has {per_node} devices and "
                                f"{view.node.nic_count} NICs per node, {ref.name} (groups[0]) "
                                f"{ref.devices_per_node} and {ref.nic_count}: the groups share "
                                "one fabric's rails, so their nodes must match in both")
        views.append(view)
        groups.append(DeviceGroup(device=view.device, node=view.node, num_devices=part.num_gpus,
                                  first_device=first))
        first += part.num_gpus
    slowest = min(views, key=network_rank)
    return replace(slowest, groups=tuple(groups))

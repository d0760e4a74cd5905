"""Communication on a heterogeneous cluster (``cluster.groups``, see
``hardware_specs/mixed.py``): a collective inside one group is planned on that group's nodes,
one that spans groups on the slowest group's; every NIC carries its own node's bandwidth."""

from __future__ import annotations

from collections.abc import Callable

from clustersim.hardware_specs import ClusterSpec
from clustersim.hardware_specs.topology import Link, LinkKind, Topology
from clustersim.simulator.cost.collectives import Plan
from clustersim.simulator.cost.interfaces import Instances, NetworkCost
from clustersim.workloads.trace import CollectiveKind, TokenRouting

_NIC_LINKS = (LinkKind.NIC_TX, LinkKind.NIC_RX)


class GroupedTopology(Topology):
    """The fabric of the whole cluster (its rails and leaves are the same for every group);
    a NIC's capacity is that of its own node's group."""

    def __init__(self, cluster: ClusterSpec, nic_capacity_of_group: tuple[float, ...]):
        super().__init__(cluster)
        nics = self.nics_per_node or 1
        self._nic_capacity = tuple(
            nic_capacity_of_group[cluster.group_of_device(node * self.devices_per_node)]
            for node in range(cluster.num_nodes))
        self._nics = nics

    def capacity(self, link: Link) -> float:
        if link[0] in _NIC_LINKS:
            return self._nic_capacity[link[1] // self._nics]
        return super().capacity(link)


class GroupedNetwork:
    """One network model per group, and the slowest group's for what spans groups."""

    def __init__(self, cluster: ClusterSpec, make: Callable[[ClusterSpec], NetworkCost]):
        """``make``: the network model of a homogeneous cluster."""
        self.cluster = cluster
        self.models = tuple(make(cluster.group_view(i)) for i in range(len(cluster.groups)))
        self.between = make(cluster)
        self.topology = GroupedTopology(cluster, tuple(m.topology.nic_capacity
                                                       for m in self.models))

    def _model(self, devices) -> NetworkCost:
        groups = {self.cluster.group_of_device(d) for d in devices}
        return self.models[groups.pop()] if len(groups) == 1 else self.between

    def plan(self, kind: CollectiveKind, nbytes: float, instances: Instances,
             routing: TokenRouting | None = None) -> Plan:
        model = self._model(d for group in instances for d in group)
        return model.plan(kind, nbytes, instances, routing)

    def p2p_plan(self, nbytes: float, pairs: list[tuple[int, int]]) -> Plan:
        return self._model(d for pair in pairs for d in pair).p2p_plan(nbytes, pairs)

"""Communication times on one cluster: NCCL's tuner over the algorithms of ``collectives.py``.

``NetworkModel`` picks, for each collective, the algorithm and protocol NCCL's tuner predicts
fastest from its own model (``nccl_tuner.py``), unless the config overrides the algorithm for
that kind of collective, and costs the one picked physically (``tree_plan.py``, ``nvls_tree.py``:
traffic and the chunk pipeline's fill). It answers with a :class:`Plan` (latency, NVLink
time, network link loads) that the engine either turns into a fixed duration (``analytic``)
or runs through the flow model where concurrent transfers share links (``flow``).
"""

from __future__ import annotations

from collections.abc import Mapping

from clustersim.hardware_specs import ClusterSpec
from clustersim.hardware_specs.topology import Topology
from clustersim.simulator.cost.collectives import (
    ARCH_OF_SCALE_UP, COLL_CHANNELS, COPY_KERNEL_S, Algorithm, CollectivePlanner, Plan,
    Protocol, bus_factor,
)
from clustersim.simulator.cost.expert_dispatch import ExpertDispatchPlanner
from clustersim.simulator.cost.interfaces import Instances
from clustersim.simulator.cost.nccl_tuner import predicted_s
from clustersim.simulator.cost.nvls_tree import nvls_tree_plan
from clustersim.simulator.cost.tree_plan import tree_plan
from clustersim.workloads.trace import CollectiveKind, Dispatcher, TokenRouting

__all__ = ["Algorithm", "Instances", "NetworkModel", "Plan", "Protocol", "bus_factor"]


class NetworkModel:
    def __init__(self, cluster: ClusterSpec,
                 algorithms: Mapping[CollectiveKind, Algorithm] | None = None):
        self.cluster = cluster
        self.topology = Topology(cluster)
        self.planner = CollectivePlanner(cluster, self.topology)
        self.dispatch = ExpertDispatchPlanner(self.planner)
        self.algorithms = dict(algorithms or {})
        """Forced algorithm per collective kind (others: fastest)."""
        self._plans: dict[tuple, Plan] = {}

    def plan(self, kind: CollectiveKind, nbytes: float, instances: Instances,
             routing: TokenRouting | None = None) -> Plan:
        """The plan of a collective; an expert-parallel all-to-all whose ``routing`` names a
        DeepEP dispatcher runs DeepEP's kernels instead of NCCL's."""
        if routing is not None and routing.dispatcher is not Dispatcher.ALLTOALL:
            key = (routing, instances)
            hit = self._plans.get(key)
            if hit is None:
                hit = self._plans[key] = self.dispatch.plan(routing, instances)
            return hit
        key = (kind, nbytes, instances)
        hit = self._plans.get(key)
        if hit is None:
            candidates = [tree_plan(self.planner, p, kind, nbytes, instances)
                          for p in self.planner.plans(kind, nbytes, instances)]
            if kind is CollectiveKind.ALL_REDUCE:
                tree = nvls_tree_plan(self.planner, nbytes, instances)
                candidates = candidates + ([tree] if tree is not None else [])
            forced = self.algorithms.get(kind)
            if forced is not None:
                # NCCL falls back to the ring when the forced algorithm cannot run this
                # collective (tuning.cc: "at least set ring algo available").
                candidates = ([p for p in candidates if p.algorithm is forced]
                              or [p for p in candidates if p.algorithm is Algorithm.RING]
                              or candidates)
            hit = self._plans[key] = self._chosen(kind, nbytes, instances, candidates)
        return hit

    def _chosen(self, kind: CollectiveKind, nbytes: float, instances: Instances,
                candidates: list[Plan]) -> Plan:
        """The candidate NCCL's tuner predicts fastest (``nccl_tuner.predicted_s``)."""
        generation = self.cluster.device.scale_up_generation
        context = dict(ranks=len(instances[0]), nodes=len(self.planner.nodes_of(instances[0])),
                       channels=COLL_CHANNELS.get(generation, 16),
                       ampere_or_later=ARCH_OF_SCALE_UP.get(generation) != "volta",
                       net_latency_s=self.cluster.node.net_plugin_latency_s)
        return min(candidates, key=lambda p: predicted_s(p, kind, nbytes, self.planner.network_s(p),
                                                         **context))

    def collective_time(self, kind: CollectiveKind, nbytes: float, instances: Instances,
                        per_rank_copies: bool = False,
                        routing: TokenRouting | None = None) -> float:
        """Uncontended time of a collective run by ``instances`` at once."""
        if len(instances[0]) <= 1 or nbytes <= 0:
            return 0.0
        copies = len(instances[0]) * COPY_KERNEL_S if per_rank_copies else 0.0
        return self.plan(kind, nbytes, instances, routing).time(self.topology) + copies

    def p2p_plan(self, nbytes: float, pairs: list[tuple[int, int]]) -> Plan:
        """Sends of ``nbytes`` between all (src, dst) device pairs at once."""
        return self.planner.p2p_pairs(nbytes, pairs)

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        """One send/recv between two devices, alone on the fabric."""
        return self.p2p_plan(nbytes, [(src, dst)]).time(self.topology)


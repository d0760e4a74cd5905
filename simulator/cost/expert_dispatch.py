"""Expert-parallel token dispatch and combine as DeepEP runs them (NCCL's all-to-all is in
``collectives.py``).

DeepEP (deepseek-ai/DeepEP, README and ``docs/legacy.md``; DeepSeek-V3 report, arXiv 2412.19437,
section 3.2.2) moves tokens in one of two ways:
- **normal** (high throughput, training and prefill): a token crosses the network once per node
  that holds one of its experts, to the GPU of the same local index there (RDMA), and NVLink
  then forwards it once to each GPU of that node holding one of its experts. Per rank, the
  network carries ``tokens x E[remote nodes hit] x token_bytes`` and NVLink
  ``tokens x E[ranks hit] x token_bytes``; the two overlap (the forwarder streams what arrives).
  DeepEP's own benchmark counts every received token as NVLink traffic, the rank's own ones
  included (``recv_x.numel()`` in ``tests/legacy/test_intranode.py``).
- **low latency** (decode): one message per (token, expert) pair straight to the expert's GPU,
  over RDMA across nodes and NVLink inside one; no de-duplication (the benchmark counts
  ``num_selections`` messages per token, ``tests/legacy/test_low_latency.py``).
Both pay one network step's latency (NCCL's Simple network hop and base latency, as a direct
send/recv would) before the data moves.

The counts assume routing uniform over the experts a token may choose (``hit_probability``),
experts in equal contiguous blocks on the ranks of the EP group (as Megatron-Core and DeepEP place
them), and, with group-limited routing, groups made of whole blocks or blocks made of whole groups.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb

from clustersim.hardware_specs.topology import Link, Topology
from clustersim.simulator.cost.collectives import Algorithm, CollectivePlanner, Plan, Protocol
from clustersim.workloads.trace import Dispatcher, TokenRouting

Instances = tuple[tuple[int, ...], ...]


def hit_probability(block: int, routing: TokenRouting) -> float:
    """Chance that at least one of a token's ``top_k`` experts lies in a block of ``block``
    consecutive experts (one GPU's, or one node's).

    Without groups the ``top_k`` experts are uniform over all. Group-limited routing
    (DeepSeek-V3, arXiv 2412.19437 section 2.1.2 and its ``n_group``/``topk_group``) first ranks
    the ``groups`` by their best experts' affinities and keeps ``groups_per_token`` of them, so
    each kept group holds at least one of the token's experts (its best); the other
    ``top_k - groups_per_token`` are uniform over the kept groups' experts. Checked against a
    draw of DeepEP's benchmark routing in ``tests/test_expert_dispatch.py``."""
    k, g, m = routing.top_k, routing.groups, routing.groups_per_token
    if m >= g:   # every group kept: no limit
        return 1.0 - comb(routing.experts - block, k) / comb(routing.experts, k)
    group = routing.experts // g
    if block >= group:   # whole groups: hit when one of them is kept
        return 1.0 - comb(g - block // group, m) / comb(g, m)
    pool, rest = m * group, k - m
    miss = (1.0 - block / group) * comb(pool - block, rest) / comb(pool, rest)
    return m / g * (1.0 - miss)


class ExpertDispatchPlanner:
    """Plans of DeepEP dispatches and combines on one cluster."""

    def __init__(self, planner: CollectivePlanner):
        self.planner = planner
        self.topology: Topology = planner.topology

    def plan(self, routing: TokenRouting, instances: Instances) -> Plan:
        if routing.dispatcher is Dispatcher.ALLTOALL:
            raise ValueError("NCCL all-to-all is planned by CollectivePlanner.plans")
        group = instances[0]
        n = len(group)
        nodes = self.planner.nodes_of(group)
        per_node = max(len(members) for members in nodes.values())
        multi = len(nodes) > 1
        latency = self.planner.step_latency(multi, per_node)
        if routing.dispatcher is Dispatcher.DEEPEP:
            ranks_hit = n * hit_probability(routing.experts // n, routing)
            to_node = routing.tokens * routing.token_bytes * hit_probability(
                routing.experts * per_node // n, routing)
            nvlink = routing.tokens * ranks_hit * routing.token_bytes if per_node > 1 else 0.0
            loads = self._node_forward_loads(instances, to_node) if multi else ()
        else:
            # Each rank sends top_k/n of its tokens' choices to every rank; its own stay put.
            nvlink = routing.payload_bytes * (per_node - 1) / n
            loads = tuple((link, unit * routing.payload_bytes) for link, unit
                          in self.planner.direct_unit_loads(instances)) if multi else ()
        return Plan(Algorithm.DIRECT, Protocol.SIMPLE, latency,
                    nvlink / self.planner.scale_up, loads)

    def _node_forward_loads(self, instances: Instances, nbytes: float) -> tuple[tuple[Link, float], ...]:
        """Every rank sends ``nbytes`` to the rank of its own local position in each other node
        of its group."""
        loads: dict[Link, float] = defaultdict(float)
        for group in instances:
            nodes = list(self.planner.nodes_of(group).values())
            for here in nodes:
                for i, src in enumerate(here):
                    for there in nodes:
                        if there is not here:
                            for link in self.topology.path(src, there[i % len(there)]):
                                loads[link] += nbytes
        return tuple(loads.items())

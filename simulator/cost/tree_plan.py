"""NCCL's double binary tree all-reduce across nodes as it runs, and as NCCL's tuner rates it.

- Traffic: on two nodes each of the two trees has one parent and one child, each carrying half
  the buffer, so every node sends and receives the buffer once (S per node, S/g per NIC with g
  GPUs per node), where a ring sends 2(n-1)/n S per node. From three nodes a node is interior in
  one tree (two children) and a leaf in the other: about 2S per node, a ring's bytes. On two
  p4d.24xlarge (4 x 100 Gb/s EFA) NCCL 2.23 reaches 73-78 GB/s bus bandwidth from 256 MiB
  (AWS DLAMI guide, analysis/data/collectives_multinode_sweeps.csv), above the 46 GB/s a ring
  can pass through those NICs.
- NCCL's tuner rates a tree's bus bandwidth at 0.92 of the graph's and its algorithm bandwidth
  at half of that, against n / (2(n-1)) for the ring (``tuning.cc``); :func:`tree_plan` keeps
  that rating in ``Plan.rated_s`` for the chooser (``nccl_tuner.py``) while its loads are the
  physical ones. On two nodes NCCL takes the graph's intra-node bandwidth (``bw = nNodes <= 2 ?
  bwIntra : bwInter``), which its search raises for trees up to twice the network's as far as
  NVLink carries it (``search.cc``): so it runs the tree on two p4d, whose NVLink carries five
  times its network. The model does not raise it: on two NDm A100 v4 nodes (8 x 200 Gb/s) the
  same rule would run a tree the model costs at 258 GB/s, where nccl-tests measured a
  ring-limited 184-188 (``collectives_dev.csv``); the search's outcome there is not modelled.
- The chunk pipeline's fill (``chunk_pipeline.py``).
"""

from __future__ import annotations

from clustersim.simulator.cost.chunk_pipeline import (
    pipeline_fill_s, tree_chunk_bytes, tree_stages,
)
from clustersim.simulator.cost.collectives import (
    COLL_CHANNELS, Algorithm, CollectivePlanner, Plan, bus_factor, nccl_channels,
)
from clustersim.workloads.trace import CollectiveKind

TREE_BUS_FRACTION = 0.92
TREE_ALGBW_RATIO = 0.5
"""tuning.cc: a tree all-reduce's bus bandwidth x 0.92, its algorithm bandwidth half of that."""


def tree_plan(planner: CollectivePlanner, plan: Plan, kind: CollectiveKind, nbytes: float,
              instances: tuple[tuple[int, ...], ...]) -> Plan:
    """``plan`` as it runs where it is a tree all-reduce across nodes (the planner's tree
    carries a ring's bytes, at a ring's rate): its physical traffic, NCCL's rating of it and
    the pipeline's fill. Other plans are returned as they are."""
    if plan.algorithm is not Algorithm.TREE or kind is not CollectiveKind.ALL_REDUCE:
        return plan
    members = planner.nodes_of(instances[0])
    if len(members) < 2:
        return plan
    n, per_node = len(instances[0]), max(len(m) for m in members.values())
    ring_bytes = bus_factor(kind, n)
    ring_s = max(plan.intra_s, planner.network_s(plan))
    rated = ring_s / ring_bytes / (TREE_BUS_FRACTION * TREE_ALGBW_RATIO)
    if len(members) == 2:
        plan = Plan(plan.algorithm, plan.protocol, plan.latency_s, plan.intra_s,
                    tuple((link, b / ring_bytes) for link, b in plan.loads))
    generation = planner.cluster.device.scale_up_generation
    channels = nccl_channels(plan.protocol, nbytes, n, COLL_CHANNELS.get(generation, 16))
    chunk = tree_chunk_bytes(plan.protocol, nbytes, channels, len(members), per_node)
    fill = pipeline_fill_s(tree_stages(len(members)), channels * chunk, nbytes,
                           max(plan.intra_s, planner.network_s(plan)))
    return plan.with_fill(fill).rated(rated)

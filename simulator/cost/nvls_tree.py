"""NVLSTree all-reduce: NVLink SHARP inside every node, a tree of nodes across the network.

NCCL 2.18 and later run it by default for large all-reduces across H100 (and later) nodes
whose NVSwitch reduces in the switch (``NCCL_ALGO=NVLSTree``; ``all_reduce.h``,
``runTreeSplit``/``runNvlsTree``): inside a node each GPU is the head of 1/g of the buffer,
reduces it in the switch (as the one-node NVLS all-reduce does), sends that node's partial sum
over its own NIC to the other nodes up a tree, adds what comes back down, and multicasts the
result to the node's GPUs. The network carries node partials, not every rank's data:

- two nodes: NCCL's double binary tree of two nodes is one parent and one child per tree, each
  tree carrying half the buffer: every node sends and receives the whole buffer once, 1/g of it
  on each head's NIC. A ring sends 2(n-1)/n of it per node; so NCCL's tuner doubles the network
  bandwidth of NVLSTree on two nodes (``tuning.cc``: ``bwInter * 2`` for ``nNodes <= 2``);
- more nodes: a node that is interior in one of the two trees receives from two children and
  sends to its parent going up, and the reverse coming down, and is a leaf of the other tree:
  twice the buffer per node (NCCL's tuner halves the inter-node bandwidth there).

The NVLink part is the one-node NVLS all-reduce's (``collectives.py``: the port fraction
``nvls_efficiency`` and the per-loop cost fitted on one 8x H100 node); the latency adds NCCL's
network hop for NVLSTree, twice per tree level, and the chunk pipeline's fill
(``chunk_pipeline.py``): a round (every channel's heads' chunks) passes the switch's reduction,
each network level up and down, and the switch's multicast, 2 + 2 log2(nodes) stages that hand
on whole network steps, each at its own rate: the switch's stages at the NVLink port's, the
network levels at the NICs' (``staged_fill_s``: the sum of the stages' round times less the
slowest's, which the bandwidth term counts). Costing every stage at the slowest's rate instead
made 4-8 nodes at 16-64 MiB 18-40% slow (NVIDIA/nccl-tests#309: the network levels, which
carry twice the buffer there, are the bottleneck, the two switch stages far faster). On two
nodes the switch is the bottleneck and the fill is 2.6 of its rounds: NVIDIA/nccl-tests#309's
two 8x H100 nodes (defaults, NVLSTree) take 130-160 us more than their large-message rate and
NVLSTree's latency from 64 MiB, two to three rounds of 128 KiB x 16 channels x 8 heads.
"""

from __future__ import annotations

import math
from collections import defaultdict

from clustersim.hardware_specs.topology import Link
from clustersim.simulator.cost.chunk_pipeline import staged_fill_s
from clustersim.simulator.cost.collectives import (
    NVLS_CHANNELS, NVLS_LATENCY_S, NVLS_LOOP_OVERHEAD_S, NVLS_MIN_RANKS, Algorithm,
    CollectivePlanner, Plan, Protocol,
)

NVLS_TREE_NET_HOP_US = 14.0
"""NCCL's hwLat[NET][NVLS_TREE][SIMPLE] (``src/graph/tuning.cc``, 2.19 to 2.26; 20.9 from 2.27):
one network level of the tree, paid going up and coming down."""


NVLS_TREE_ALGBW_RATIO = 5 / 6
"""NCCL's tuner rates NVLS and NVLSTree at 5/6 of the bandwidth their graph carries
(``tuning.cc``, v2.19.3 to v2.27: ``else if (a == NCCL_ALGO_NVLS || a == NCCL_ALGO_NVLS_TREE)
ratio *= 5.0/6.0``; v2.26.2-1 f44ac759 line 293), where the tree gets 1/2 and the ring
n/(2(n-1)): a rating that steers the choice, not a cost. From 2.28 (f1308997, line 348) NCCL
rates them like the ring, n/(2(n-1)), under a per-channel NVLSTree cap of its own; the
published sweeps modelled here ran 2.20-2.26 (2.27 at the latest)."""


NVLS_TREE_CHUNK_BYTES = 128 * 1024
"""NCCL_NVLS_CHUNKSIZE's default, the NVLSTree chunk on fewer than four nodes (``enqueue.cc``,
2.21-2.26: ``NCCL_NVLSTREE_MAX_CHUNKSIZE`` defaults to it, or to 64 KiB from four nodes). NCCL
2.20.3 starts instead from the Simple step (512 KiB under the default buffer) and halves it at
32 and 16 loops of the channels' heads before the steps below, so its chunks are the same
below 16 loops (256 MiB on two 8-GPU nodes) and larger above."""


def nvls_tree_chunk_bytes(nbytes: float, per_node: int, nodes: int) -> int:
    """The chunk NCCL's NVLSTree uses (``enqueue.cc``, ``computeCollChunkInfo``, 2.21-2.26): 128 KiB
    (64 KiB from four nodes), halved to 64 KiB below 4 and to 32 KiB below 1 loop of the
    channels' heads."""
    concurrent = NVLS_CHANNELS * per_node
    chunk = NVLS_TREE_CHUNK_BYTES if nodes < 4 else 64 * 1024
    for loops, smaller in ((4, 64 * 1024), (1, 32 * 1024)):
        if nbytes < loops * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_tree_plan(planner: CollectivePlanner, nbytes: float,
                   instances: tuple[tuple[int, ...], ...]) -> Plan | None:
    """The NVLSTree plan of an all-reduce over ``instances``, or None where NCCL cannot run it:
    one node, nodes without NVLink SHARP, or fewer than ``NVLS_MIN_RANKS`` GPUs (or uneven
    counts) per node."""
    node = planner.cluster.node
    nodes = planner.nodes_of(instances[0])
    counts = {len(m) for m in nodes.values()}
    if not node.nvls or len(nodes) < 2 or len(counts) != 1:
        return None
    per_node = counts.pop()
    if per_node < NVLS_MIN_RANKS:
        return None
    share = (1.0 if len(nodes) == 2 else 2.0) * nbytes / per_node
    loads: dict[Link, float] = defaultdict(float)
    topology = planner.topology
    for group in instances:
        members = list(planner.nodes_of(group).values())
        for here, there in zip(members, members[1:] + members[:1]):
            for src, dst in zip(here, there):
                for link in topology.path(src, dst):
                    loads[link] += share
    levels = math.ceil(math.log2(len(nodes)))
    round_bytes = NVLS_CHANNELS * per_node * nvls_tree_chunk_bytes(nbytes, per_node, len(nodes))
    loops = math.ceil(nbytes / round_bytes)
    latency = (NVLS_LATENCY_S + loops * NVLS_LOOP_OVERHEAD_S
               + 2 * levels * (NVLS_TREE_NET_HOP_US * 1e-6 + node.nic_latency_s))
    intra = nbytes / (node.scale_up_bandwidth * node.nvls_efficiency)
    network = max((b / topology.capacity(link) for link, b in loads.items()), default=0.0)
    plan = Plan(Algorithm.NVLS_TREE, Protocol.SIMPLE, latency, intra, tuple(loads.items()))
    stages = [intra] + [network] * (2 * levels) + [intra]
    return plan.with_fill(staged_fill_s(stages, round_bytes, nbytes)).rated(
        max(intra, network) / NVLS_TREE_ALGBW_RATIO)

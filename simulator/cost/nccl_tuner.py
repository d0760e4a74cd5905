"""NCCL's tuner: which algorithm and protocol NCCL runs, from its own model of their times.

NCCL predicts each candidate's time as latency + bytes / bandwidth (``src/graph/tuning.cc``,
``ncclTopoGetAlgoTime``) and runs the smallest; the physical model (``collectives.py``,
``nvls_tree.py``, ``chunk_pipeline.py``) then costs the candidate chosen. NCCL's prediction
differs from the physical cost in these ways, each from its source:
- the chunk pipeline's fill is not in it (its tree latency counts the hops only);
- its bandwidth part is the plan's rating where NCCL rates it apart from the cost
  (``Plan.rated_s``): a tree at 0.92 x 1/2 of its graph under its channels' cap
  (``tree_plan.py``), NVLSTree at 5/6 of its graph (``nvls_tree.py``);
- "Trees are not perfectly sticking to the model for medium sizes": the tree all-reduce's
  bandwidth is multiplied by a static factor per power of two of the size, 64 B to 256 MiB
  (``treeCorrectionFactor``, 0.4-1.0 by protocol);
- "Plateau effect of ring": a Simple ring all-reduce across nodes has its latency multiplied by
  1.4 (1.9 before compute capability 8.0) once every channel gives each rank 64 B or more;
- the latency the net plugin reports (``NodeSpec.net_plugin_latency_s``; 0 for NCCL's own
  InfiniBand transport, 75 us from aws-ofi-nccl on p4d/p5) is added to every network hop of the
  algorithm, and again with Simple for the receive's flush (``interLat += latencyInter``): a
  ring all-reduce has 2(nodes - 1) such hops (all-gather and reduce-scatter nodes - 1), a tree
  or NVLSTree 2 floor(log2(nodes)), CollNet one.
"""

from __future__ import annotations

import math

from clustersim.simulator.cost.collectives import Algorithm, Plan, Protocol
from clustersim.workloads.trace import CollectiveKind

TREE_CORRECTION = {
    Protocol.LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8,
                  .9, 1.0, 1.0, 1.0, 1.0),
    Protocol.LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
                     .9, .9, .9, 1.0, 1.0),
    Protocol.SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8,
                      .7, .7, .8, .9, .9),
}
"""tuning.cc ``treeCorrectionFactor[protocol][log2(bytes / 64)]``, applied below index 23
(the table's 24th column is never read for all-reduce)."""
RING_PLATEAU = {True: 1.4, False: 1.9}
"""tuning.cc: the Simple ring all-reduce's latency factor across nodes, by compute capability
at least 8.0."""
RING_PLATEAU_BYTES = 64
"""The plateau applies from nBytes / (nChannels x nRanks) >= 64."""


def tree_correction(proto: Protocol, nbytes: float) -> float:
    """NCCL's factor on a tree all-reduce's bandwidth at this size (1 outside its table)."""
    index = int(math.log2(nbytes / 64)) if nbytes >= 64 else -1
    table = TREE_CORRECTION[proto]
    return table[index] if 0 <= index < len(table) else 1.0


def network_hops(algorithm: Algorithm, kind: CollectiveKind, nodes: int) -> int:
    """Network hops of NCCL's latency model for ``algorithm`` (``tuning.cc``): those that pay
    the plugin's reported latency."""
    if nodes < 2:
        return 0
    if algorithm is Algorithm.RING:
        if kind is CollectiveKind.ALL_REDUCE:
            return 2 * (nodes - 1)
        if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
            return nodes - 1
        return 0
    if algorithm in (Algorithm.TREE, Algorithm.NVLS_TREE):
        return 2 * int(math.log2(nodes))
    return 1 if algorithm is Algorithm.COLLNET else 0


def predicted_s(plan: Plan, kind: CollectiveKind, nbytes: float, network_s: float, *,
                ranks: int, nodes: int, channels: int, ampere_or_later: bool,
                net_latency_s: float = 0.0) -> float:
    """NCCL's own prediction of ``plan``'s time: its latency without the pipeline's fill, with
    the plugin's reported ``net_latency_s`` on every network hop (twice with Simple), the ring
    plateau, and its bandwidth part as NCCL rates it (``Plan.rated_s``) over the tree
    correction."""
    reported = net_latency_s * (2 if plan.protocol is Protocol.SIMPLE else 1)
    latency = plan.latency_s - plan.fill_s + network_hops(plan.algorithm, kind, nodes) * reported
    bandwidth = max(plan.intra_s, network_s) if plan.rated_s is None else plan.rated_s
    if kind is CollectiveKind.ALL_REDUCE:
        if plan.algorithm is Algorithm.TREE:
            bandwidth /= tree_correction(plan.protocol, nbytes)
        if (plan.algorithm is Algorithm.RING and plan.protocol is Protocol.SIMPLE and nodes > 1
                and nbytes / (channels * ranks) >= RING_PLATEAU_BYTES):
            latency *= RING_PLATEAU[ampere_or_later]
    return latency + bandwidth

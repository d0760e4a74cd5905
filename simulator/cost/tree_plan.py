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
  the GPU's NVLinks carry the graph's channels (``search.cc``: "increase bwIntra for trees (2
  nodes or collnet)"; NVLink at 20 GB/s a link on A100, 20.6 on H100, 40.1 on B200, ``topo.h``),
  and caps the tree at a bandwidth per channel (``perChMaxTreeBws``, two-node column; LL128 also
  ``perChMaxTreeLL128Bws``), with one channel per NIC. On two p4d (4 x 100 Gb/s, NVLink carrying
  five times the network) the tree is rated 0.92 of the ring's bus bandwidth against the ring's
  16/30 and NCCL runs it (aws-ofi-nccl 1.13.2 has no tuner for p4d); on two NDm A100 v4 nodes
  (8 x 200 Gb/s) NVLink allows 1.3x and the cap, 8 x 23.6 GB/s, leaves the tree below the ring,
  which nccl-tests measured there (184-188 GB/s, ``collectives_dev.csv``). From three nodes the
  tuner rates the tree at 0.46 of the ring's bus bandwidth, under the same per-channel cap (the
  N4 column).
- The channels' cap is also the tree's cost: a tree all-reduce moves at most as much as its
  channels (thread blocks) do. NCCL's maintainer: "NVLSTree can achieve peak bandwidth with only
  16 SMs ... whereas tree would require 32 SMs to achieve the same performance. Given the
  default number of SMs is 16 ... Tree usually achieves significantly lower bandwidth"
  (NVIDIA/nccl#1649, 2025-03-20). The cap (search channels x ``perChMaxTreeBws``; the
  communicator runs two channels per search channel) is NCCL's own per-channel maximum. On
  8 x 8 H100 (8 x 400 Gb/s) it makes the tree with Simple 8 x 36 GB/s of bus bandwidth, 283.5
  GB/s in nccl-tests' terms, where NVIDIA/nccl-tests#309 measured 287-300 GB/s at 512 MiB-1 GiB,
  and with LL128 8 x 29, 228 GB/s, measured 228 at 128 MiB.
- The chunk pipeline's fill (``chunk_pipeline.py``): the network levels and, with Simple, the
  NVLink hops of the node's chain of GPUs (at the GPU's NVLink rate), over rounds of every
  channel's chunk; a tree across nodes runs two channels per NIC (:func:`tree_channels`).
"""

from __future__ import annotations

from clustersim.simulator.cost.chunk_pipeline import (
    staged_fill_s, tree_chunk_bytes, tree_stage_times_s,
)
from clustersim.simulator.cost.collectives import (
    ARCH_OF_SCALE_UP, COLL_CHANNELS, Algorithm, CollectivePlanner, Plan, Protocol, bus_factor,
    nccl_channels,
)
from clustersim.workloads.trace import CollectiveKind

TREE_BUS_FRACTION = 0.92
TREE_ALGBW_RATIO = 0.5
"""tuning.cc: a tree all-reduce's bus bandwidth x 0.92, its algorithm bandwidth half of that."""
TWO_NODE_INTRA_RAISE = 2.0
"""search.cc: a tree graph's bwIntra is raised while below twice its bwInter."""
NCCL_NVLINK_GBPS = {"nvlink2": 6 * 20.0, "nvlink3": 12 * 20.0, "nvlink4": 18 * 20.6,
                    "nvlink5": 18 * 40.1}
"""A GPU's NVLinks as NCCL's topology counts them (``topo.h``: SM70/SM80 20, SM90 20.6, SM100
40.1 GB/s a link; V100 6 links, A100 12, H100 and B200 18), GB/s."""
TREE_CHANNEL_GBPS = {
    "volta": {2: 18.5, 4: 10.0}, "ampere": {2: 23.6, 4: 17.8}, "hopper": {2: 41.4, 4: 36.0},
    "blackwell": {2: 42.8, 4: 24.0},
}
TREE_LL128_CHANNEL_GBPS = {
    "volta": {2: 20.0, 4: 20.0}, "ampere": {2: 20.0, 4: 20.0}, "hopper": {2: 36.7, 4: 29.0},
    "blackwell": {2: 31.67, 4: 20.0},
}
"""tuning.cc ``perChMaxTreeBws`` and ``perChMaxTreeLL128Bws``, the two-node (N2) and the
more-node (N4) columns, GB/s of bus bandwidth per search channel: the same for Volta, Ampere
and Hopper from 2.19.3 to 2.29 (e.g. v2.26.2-1 f44ac759, tuning.cc lines 164-175); Blackwell's
from 2.28.3 (f1308997, lines 181-192; 2.26 took twice Hopper's). LL128 takes the lower of its
own and 120/128 of the Simple cap (``busBw = min(busBw*.92, nc*perChMaxTreeBw)``, then
``min(busBw*120/128, nc*perChMaxTreeLL128Bw)``); LL is capped by NCCL's LL bandwidth instead."""
LL128_DATA_RATIO = 120 / 128
MAX_CHANNELS = 32
"""NCCL's MAXCHANNELS."""


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
        two_node = two_node_tree_bus_bandwidth(planner, plan, ring_bytes * nbytes)
        if two_node is not None:
            rated = nbytes / (TREE_ALGBW_RATIO * two_node)
        plan = Plan(plan.algorithm, plan.protocol, plan.latency_s, plan.intra_s,
                    tuple((link, b / ring_bytes) for link, b in plan.loads))
    cap = tree_channel_bus_bandwidth(planner, plan.protocol, len(members))
    if cap is not None:
        channel_s = nbytes / (TREE_ALGBW_RATIO * cap)
        rated = max(rated, channel_s)
        plan = Plan(plan.algorithm, plan.protocol, plan.latency_s, max(plan.intra_s, channel_s),
                    plan.loads)
    channels = nccl_channels(plan.protocol, nbytes, n, tree_channels(planner))
    chunk = tree_chunk_bytes(plan.protocol, nbytes, channels, len(members), per_node,
                             planner.cluster.node.nccl_buffer_bytes)
    stages = tree_stage_times_s(plan.protocol, len(members), per_node,
                                max(plan.intra_s, planner.network_s(plan)),
                                nbytes / planner.scale_up)
    return plan.with_fill(staged_fill_s(stages, channels * chunk, nbytes)).rated(rated)


def search_channels(planner: CollectivePlanner) -> int:
    """Channels NCCL's topology search finds for a tree across nodes: one per NIC (at the
    fastest speed of ``speedArrayInter`` a NIC carries, ``search.cc``), which it duplicates only
    where that speed is 25 GB/s or more (and on compute capability 9.0 and later 50 GB/s or more,
    or at most 4 channels: ``ncclTopoDupChannels``); no node of the catalog's multi-node data
    qualifies (p4d's 100 Gb/s NICs give 12 GB/s a channel, A3 Mega's 200 Gb/s 24, H100's eight
    400 Gb/s 48), so duplication is not modelled."""
    return min(planner.cluster.node.nic_count, MAX_CHANNELS)


def tree_channels(planner: CollectivePlanner) -> int:
    """Channels a tree all-reduce across nodes runs on before NCCL drops some for small
    messages: twice the search channels (``connect.cc``, ncclTopoPostset: "Duplication should
    be complete now", nChannels*2), at most the node's own channel count (``COLL_CHANNELS``).
    On p4d (4 NICs) 8 channels, as nccl_channels then trims; the chunk pipeline's round is
    these channels' chunks."""
    generation = planner.cluster.device.scale_up_generation
    own = COLL_CHANNELS.get(generation, 16)
    nics = search_channels(planner)
    return min(own, 2 * nics) if nics >= 1 else own


def tree_channel_bus_bandwidth(planner: CollectivePlanner, proto: Protocol,
                               nodes: int) -> float | None:
    """The most bus bandwidth (bytes/s) NCCL's tree across ``nodes`` nodes gets from its
    channels: the per-channel maximum of ``tuning.cc`` (N2 or N4 column) times the search
    channels, one per NIC (``search.cc``; the communicator runs each twice, ``connect.cc``
    ncclTopoPostset: "Duplication should be complete now", nChannels*2). None where NCCL's
    tables have no entry (an architecture they do not know, or LL) or the nodes have no NIC."""
    arch = ARCH_OF_SCALE_UP.get(planner.cluster.device.scale_up_generation)
    nics = search_channels(planner)
    if arch not in TREE_CHANNEL_GBPS or proto is Protocol.LL or nodes < 2 or nics < 1:
        return None
    column = 2 if nodes == 2 else 4
    per_channel = TREE_CHANNEL_GBPS[arch][column]
    if proto is Protocol.LL128:
        per_channel = min(per_channel * LL128_DATA_RATIO, TREE_LL128_CHANNEL_GBPS[arch][column])
    return nics * per_channel * 1e9


def two_node_tree_bus_bandwidth(planner: CollectivePlanner, plan: Plan,
                                ring_volume: float) -> float | None:
    """NCCL's bus bandwidth of a two-node tree (bytes/s): 0.92 of the graph's bandwidth raised
    to twice the ring's network bandwidth, at most the GPU's NVLinks, capped per channel
    (:func:`tree_channel_bus_bandwidth`); None where NCCL's tables have no entry (no NVLink
    generation they know, or LL)."""
    generation = planner.cluster.device.scale_up_generation
    cap = tree_channel_bus_bandwidth(planner, plan.protocol, 2)
    network_s = planner.network_s(plan)
    if generation not in NCCL_NVLINK_GBPS or cap is None or network_s <= 0:
        return None
    graph = min(TWO_NODE_INTRA_RAISE * ring_volume / network_s, NCCL_NVLINK_GBPS[generation] * 1e9)
    return min(TREE_BUS_FRACTION * graph, cap)

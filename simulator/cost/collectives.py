"""NCCL's collective algorithms as cost plans: a latency, an NVLink-bound time, network loads.

For each algorithm and protocol NCCL would consider, a :class:`Plan` gives
- ``latency_s``: ``baseLat + steps x hwLat`` with NCCL's constants (``src/graph/tuning.cc``);
- ``intra_s``: the time the bytes need on each GPU's scale-up port (NVLink/NVSwitch/xGMI);
- ``loads``: bytes each network link carries, summed over every group instance that runs the
  collective at the same time (so a spine shared by 8 DP groups sees all 8).
Alone on the fabric a plan takes ``latency + max(intra, max(load / capacity))``; under the flow
model the network part shares links with other traffic (``simulator/flows.py``).

Algorithms (NCCL docs, "Collective Operations"; Jeaugey, NCCL 2.x talks):
- ring: all-reduce moves 2(n-1)/n of the buffer through every rank, all-gather and
  reduce-scatter (n-1)/n (nccl-tests' bus factors); each ring crosses every node boundary once,
  and its channels leave a node on the NICs of the group's members there;
- tree (all-reduce, several nodes): double binary trees, ~log2(nodes) network hops;
- NVLS (all-reduce, one NVSwitch node with NVLink SHARP): every GPU sends and receives the buffer
  once, the switch reduces;
- CollNet (all-reduce across nodes, InfiniBand SHARP): reduce inside nodes, every node sends and
  receives its share once through the switch tree;
- direct: all-to-all sends n-1 pieces of S/n, send/recv one transfer.
LL carries 4 data bytes per 8, LL128 120 per 128 (NCCL docs, NCCL_PROTO).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from clustersim.hardware_specs import ClusterSpec, ScaleUpKind
from clustersim.hardware_specs.topology import Link, LinkKind, Topology, links_of
from clustersim.workloads.trace import CollectiveKind


class Algorithm(enum.Enum):
    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"
    COLLNET = "collnet"
    DIRECT = "direct"


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
    Algorithm.NVLS: {Protocol.SIMPLE: 0.0},
    Algorithm.COLLNET: {Protocol.SIMPLE: 0.0},
}
HOP_LATENCY_US = {
    Hop.NVLINK: {Algorithm.TREE: {Protocol.LL: 0.6, Protocol.LL128: 1.25, Protocol.SIMPLE: 4.0},
                 Algorithm.RING: {Protocol.LL: 0.6, Protocol.LL128: 1.9, Protocol.SIMPLE: 3.4},
                 Algorithm.NVLS: {Protocol.SIMPLE: 25.0},
                 Algorithm.COLLNET: {Protocol.SIMPLE: 3.7}},
    Hop.PCI: {Algorithm.TREE: {Protocol.LL: 1.0, Protocol.LL128: 1.9, Protocol.SIMPLE: 4.0},
              Algorithm.RING: {Protocol.LL: 1.0, Protocol.LL128: 2.5, Protocol.SIMPLE: 5.7},
              Algorithm.NVLS: {Protocol.SIMPLE: 0.0},
              Algorithm.COLLNET: {Protocol.SIMPLE: 3.7}},
    Hop.NET: {Algorithm.TREE: {Protocol.LL: 5.0, Protocol.LL128: 8.5, Protocol.SIMPLE: 14.0},
              Algorithm.RING: {Protocol.LL: 2.7, Protocol.LL128: 4.0, Protocol.SIMPLE: 14.0},
              Algorithm.NVLS: {Protocol.SIMPLE: 18.0},
              Algorithm.COLLNET: {Protocol.SIMPLE: 31.0}},
}
# NCCL's tuner (src/graph/tuning.cc, 2.21 to 2.29) refines protocol bandwidth: LL ring bus
# bandwidth is half the link's (4 data bytes per 8; NCCL 2.20 and older took 1/4 for all-reduce),
# capped per architecture and node count (llMaxBws, N1/N2/N4 columns); LL128 is 0.92 of it, 0.7
# with one GPU per node. On 8x H100 the 512 KiB and 1 MiB all-reduces (LL) take 21.2 and 28.6 us
# (analysis/data/collectives_h100_p5.csv): 1/4 of the link would make them 25.5 and 36.0 us.
LL_FRACTION = 0.5
LL_MAX_BUS_GBPS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
                   "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
LL128_FRACTION = {True: 0.92, False: 0.7}
ARCH_OF_SCALE_UP = {"nvlink2": "volta", "nvlink3": "ampere", "nvlink4": "hopper",
                    "nvlink5": "blackwell"}
# Measured where NCCL's tables are optimistic, by scale-up generation (others keep NCCL's values).
# Two nccl-tests all-reduce sweeps on 8x A100 with one process per GPU, outside the dev set
# (analysis/data/collectives_a100_sweeps.csv: NCCL 2.16 on Azure, and a second machine), run up
# to 22% slower from 8 to 64 MiB than NCCL's tuner table predicts, then close to it from
# 256 MiB: a fixed cost the table puts too low. A chained Simple step on NVLink3 (two slice
# hand-offs, each a fence, a flag and a poll across NVLink) takes 7 us rather than the table's
# 3.4 (ring) or 4 (tree): 8.4 + 14 x 7 = 106 us of latency for a ring of 8 GPUs, against
# intercepts of 59 and 121 us fitted to the two sweeps from 32 MiB. LL128 moves 0.76 of the link
# (177 GB/s bus bandwidth between the 8 and 16 MiB rows) rather than the tuner's 0.92. With
# both, every row of the two sweeps from 1 MiB is within 9%.
SIMPLE_STEP_US = {"nvlink3": 7.0}
LL128_NODE_FRACTION = {"nvlink3": 0.76}
SINGLE_GPU_PER_NODE_EFFICIENCY = 0.75
"""A ring with one GPU per node drives its NIC alone (no PXN fan-in, two channels): nccl-tests
across two NDm A100 v4 nodes with one GPU each reached 15.8-18.7 GB/s bus bandwidth on a
200 Gb/s HDR NIC (mscclpp docs/performance-ndmv4.md), 0.63-0.75 of the 0.92 x line rate that
8 GPUs per node reach; NCCL's own tuner derates LL128 the same way (0.7 for one GPU per node)."""
REDUCTION_EFFICIENCY = 0.913
"""Reducing collectives run their NVLink ring slower than copying ones (each step adds the
incoming chunk on the SMs): nccl-tests on the same 8x A100 node measured all-reduce 231.45 GB/s and
all-gather 253.59 GB/s bus bandwidth (Azure NDm A100 v4, microsoft/mscclpp
docs/performance-ndmv4.md)."""
NVLS_CHANNELS = 16
"""Channels NCCL gives every NVLS collective (NCCL_NVLS_NCHANNELS default; "16 nvls channels"
in the NCCL log of an 8x H200 node, stas00/ml-engineering network/README.md)."""
NVLS_LOOP_OVERHEAD_S = 7.3e-6
NVLS_LATENCY_S = 32e-6
"""NVLS all-reduce on one node (NCCL all_reduce.h, runNvls): each channel loops over
nHeads x chunk bytes, scattering them to the heads, reducing and broadcasting through the switch,
gathering the result, and every loop iteration pays a hand-off between those stages; the chunk
shrinks for smaller messages (``nvls_chunk_bytes``). Fitted, with the port fraction 0.67 (the
``nvls_efficiency`` default), to the 8x H100 nccl-tests sweep of p5.48xlarge
(analysis/data/collectives_h100_p5.csv): 7.3 us per loop, 32 us latency (NCCL's tuner assumes
25). Independent checks: the same fit on the 8x H200 sweep of ml-engineering gives 0.68 and
6.7 us, and an 8x B200 node's 838 GB/s needs 0.674 of its port."""
NVLS_MIN_RANKS = 5
"""NVLink SHARP pays only above four GPUs: "partitions that have less than or equal to four GPUs
will not benefit from multicast" (NVIDIA GB200 NVL partition guide), and on 8x H200 NCCL runs
the ring at 4 GPUs and NVLS from 5 (stas00/ml-engineering network/README.md, SHARP section)."""
TREE_ALGBW_RATIO = 0.5
TREE_CHAIN_FRACTION = {Protocol.LL: 0.92 / 3.8, Protocol.LL128: 0.92 * 7.0 / 9.0,
                       Protocol.SIMPLE: 0.92}
"""NCCL's tuner for a tree on one node (tuning.cc): bus bandwidth x 0.92, LL x 1/3.8, LL128
x 7/9, then algorithm bandwidth = 0.5 x bus bandwidth."""
COPY_KERNEL_S = 5e-6
"""One small device-to-device copy kernel, launch-bound (CUDA launch latency ~5 us)."""

# NCCL's per-collective channel count (src/enqueue.cc, getAlgoInfo, "Ring/Tree channel tuning",
# unchanged 2.12-2.18): start from the communicator's channels and drop one while
# nBytes < nChannels x nThreads x threadThreshold. Thresholds are bytes per thread
# (src/include/comm.h: LL 8, LL128 8, Simple 64; tuning.cc multiplies the ring LL one by nRanks);
# threads per block: LL 512, LL128 640, Simple 512 (src/include/devcomm.h, tuning.cc).
THREAD_THRESHOLD = {Protocol.LL: 8, Protocol.LL128: 8, Protocol.SIMPLE: 64}
MAX_THREADS = {Protocol.LL: 512, Protocol.LL128: 640, Protocol.SIMPLE: 512}
COLL_CHANNELS = {"nvlink3": 24, "nvlink4": 32, "nvlink5": 32}
"""Ring channels NCCL builds on one NVSwitch node: 24 on 8x A100 (NCCL INFO "Channel 23/24",
NVIDIA/nccl-tests#100, HGX A100 80GB); 32 on H100/B200 (assumed, not checked here)."""
HOST_LAUNCH_S = 5.2e-6
HOST_PER_CHANNEL_S = 0.3e-6
"""Host cost of one communicator's kernel launch in ncclGroupEnd: a CUDA launch (~5 us) plus the
per-channel work NCCL builds and writes to its work FIFO (enqueue.cc addCollToPlan/uploadWork
loop over the collective's channels). Only visible when one thread drives several GPUs
(nccl-tests -g N: NCCL launches the N kernels one after another at ncclGroupEnd, sjeaugey in
NVIDIA/nccl#347); values fitted to the 8x A100 -g 8 sweep (stas00), 32 KiB-4 MiB rows."""


def bus_factor(kind: CollectiveKind, n: int) -> float:
    """Bytes each of ``n`` ranks sends per byte of a collective's buffer on a ring: nccl-tests'
    bus bandwidth factor (doc/PERFORMANCE.md, busbw = algbw x factor): all-reduce 2(n-1)/n,
    all-gather, reduce-scatter and all-to-all (n-1)/n, anything else 1. The one home of the
    ring factor."""
    if kind is CollectiveKind.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
        return (n - 1) / n
    return 1.0


def nccl_channels(proto: "Protocol", nbytes: float, n: int, channels: int) -> int:
    """Channels NCCL gives one ring collective of ``nbytes`` (enqueue.cc channel tuning)."""
    threshold = THREAD_THRESHOLD[proto] * (n if proto is Protocol.LL else 1)
    nc = channels
    while nc > 1 and nbytes < nc * MAX_THREADS[proto] * threshold:
        nc -= 1
    return nc


def nvls_chunk_bytes(nbytes: float, ranks: int) -> int:
    """NVLS chunk size NCCL picks for a message (enqueue.cc, computeColl, 2.18-2.21): 128 KiB,
    halved to 64, 32 and 16 KiB below 64, 8 and 2 loop sizes of the channels' heads."""
    concurrent = NVLS_CHANNELS * ranks
    chunk = 128 * 1024
    for loops, smaller in ((64, 64 * 1024), (8, 32 * 1024), (2, 16 * 1024)):
        if nbytes < loops * concurrent * chunk:
            chunk = smaller
    return chunk


def nvls_loops(nbytes: float, ranks: int) -> int:
    """Iterations of every NVLS channel's loop over ``ranks`` heads x the chunk."""
    return math.ceil(nbytes / (NVLS_CHANNELS * ranks * nvls_chunk_bytes(nbytes, ranks)))


SINGLE_PROCESS_SIMPLE_S = 70e-6
"""Extra time of a Simple-protocol collective when one process drives all the GPUs (nccl-tests
-g): NCCL then joins them with direct pointers, and Simple (LL and LL128 have no direct mode)
reads and writes the peers' user buffers instead of its persistent FIFOs. Measured, not
derived: the median gap between ``-g 8`` and one process per GPU on the same 8x A100 node over
the Simple sizes, 32 MiB to 4 GiB (3 to 379 us; analysis/data/collectives_a100_sweeps.csv)."""


def single_thread_launch_s(gpus_per_thread: int, channels: int) -> float:
    """Host time per iteration when one thread launches ``gpus_per_thread`` communicators'
    kernels back to back; nccl-tests' time per iteration cannot be shorter than this."""
    return gpus_per_thread * (HOST_LAUNCH_S + HOST_PER_CHANNEL_S * channels)


@dataclass(frozen=True, slots=True)
class Plan:
    algorithm: Algorithm
    protocol: Protocol
    latency_s: float
    intra_s: float
    loads: tuple[tuple[Link, float], ...]
    """Network bytes per link, over all concurrent group instances."""
    fill_s: float = 0.0
    """The part of ``latency_s`` that is a chunk pipeline filling (``chunk_pipeline.py``):
    physical time NCCL's tuner does not model."""
    rated_s: float | None = None
    """Bandwidth time as NCCL's tuner rates the plan, where it differs from the physical one
    (``tree_plan.py``); None: the physical one."""

    def network_s(self, topology: Topology) -> float:
        return max((b / topology.capacity(link) for link, b in self.loads), default=0.0)

    def time(self, topology: Topology) -> float:
        return self.time_given(self.network_s(topology))

    def time_given(self, network_s: float) -> float:
        """Its time alone on the fabric when its network part takes ``network_s``."""
        return self.latency_s + max(self.intra_s, network_s)

    def scaled(self, factor: float, intra_factor: float | None = None) -> "Plan":
        """The same plan with its bandwidth terms stretched (a degraded link, interference):
        the network part by ``factor``, the scale-up (NVLink) part by ``intra_factor``
        (default: the same)."""
        intra = factor if intra_factor is None else intra_factor
        return Plan(self.algorithm, self.protocol, self.latency_s, self.intra_s * intra,
                    tuple((l, b * factor) for l, b in self.loads), self.fill_s,
                    None if self.rated_s is None else self.rated_s * factor)

    def with_fill(self, fill_s: float) -> "Plan":
        """The same plan paying ``fill_s`` more of pipeline fill."""
        return Plan(self.algorithm, self.protocol, self.latency_s + fill_s, self.intra_s,
                    self.loads, self.fill_s + fill_s, self.rated_s)

    def rated(self, rated_s: float) -> "Plan":
        """The same plan, rated by NCCL's tuner at ``rated_s`` of bandwidth time."""
        return Plan(self.algorithm, self.protocol, self.latency_s, self.intra_s, self.loads,
                    self.fill_s, rated_s)


class CollectivePlanner:
    """Candidate plans for a collective on given group instances of one cluster."""

    def __init__(self, cluster: ClusterSpec, topology: Topology):
        self.cluster, self.topology = cluster, topology
        node = cluster.node
        self.intra_hop = Hop.PCI if node.scale_up_kind is ScaleUpKind.PCIE else Hop.NVLINK
        self.scale_up = node.scale_up_bandwidth * node.scale_up_efficiency
        self._unit: dict[tuple, tuple[tuple[Link, float], ...]] = {}
        self._columns: dict[int, tuple] = {}
        """id(unit loads) -> (unit loads, their links, per-link units, capacities)."""
        self._network: dict[int, tuple[tuple, float]] = {}
        """id(loads) -> (loads, their ``Plan.network_s``) of the loads :meth:`scaled` made."""

    # --- network loads per byte of volume ------------------------------------------------
    def nodes_of(self, group: tuple[int, ...]) -> dict[int, list[int]]:
        """The group's devices by node, nodes ascending, devices in the group's order."""
        per: dict[int, list[int]] = defaultdict(list)
        nodes = self.topology.fields()["node"][np.asarray(group, dtype=np.int64)].tolist()
        for node, device in zip(nodes, group):
            per[node].append(device)
        return dict(sorted(per.items()))

    def routed_loads(self, src: list[int], dst: list[int], weights: list[float],
                     by_link: bool = False) -> tuple[tuple[Link, float], ...]:
        """Bytes per network link when each ``src[i]`` sends ``weights[i]`` to ``dst[i]``, in
        the order the links are first crossed (``by_link``: in link order, as ``sorted`` puts
        them: by kind, then index). All transfers are routed at once (``Topology.routes``) and
        each link's bytes summed in transfer order, so the sums are those of adding transfer
        after transfer."""
        transfer, codes = self.topology.routes(np.asarray(src, dtype=np.int64),
                                               np.asarray(dst, dtype=np.int64))
        if not codes.size:
            return ()
        links, first, slot = np.unique(codes, return_index=True, return_inverse=True)
        sums = np.bincount(slot, weights=np.asarray(weights, dtype=float)[transfer],
                           minlength=len(links))
        if by_link:  # a code is kind x stride + index: unique's order is the links' order
            return tuple(zip(links_of(links), sums.tolist()))
        order = np.argsort(first, kind="stable")
        return tuple(zip(links_of(links[order]), sums[order].tolist()))

    def ring_unit_loads(self, instances: tuple[tuple[int, ...], ...]) -> tuple[tuple[Link, float], ...]:
        """Network bytes per byte of per-rank ring volume: at each node boundary, the volume
        leaves on the NICs of the members there, split evenly (one channel per member): the
        i-th member on a node sends to the (i mod m)-th of the m members on the group's next
        node (nodes in ascending order, the last back to the first)."""
        key = ("ring", instances)
        hit = self._unit.get(key)
        if hit is None:
            src, dst, share = self._ring_hops(instances)
            hit = self._unit[key] = self.routed_loads(src, dst, share, by_link=True)
        return hit

    def _ring_hops(self, instances: tuple[tuple[int, ...], ...]):
        """(src, dst, share) of every node-boundary hop of the rings, group by group, node by
        node, member by member: arrays over all groups at once."""
        sizes = np.fromiter(map(len, instances), dtype=np.int64, count=len(instances))
        device = np.fromiter(itertools.chain.from_iterable(instances), dtype=np.int64,
                             count=int(sizes.sum()))
        group = np.repeat(np.arange(len(instances)), sizes)
        node = self.topology.fields()["node"][device]
        order = np.lexsort((node, group))  # stable: members keep their order on a node
        device, node, group = device[order], node[order], group[order]
        new_run = np.r_[True, (node[1:] != node[:-1]) | (group[1:] != group[:-1])]
        starts = np.flatnonzero(new_run)  # one run: the members of one group on one node
        length = np.diff(np.r_[starts, len(device)])
        run = np.cumsum(new_run) - 1
        runs = np.bincount(group[starts], minlength=len(instances))
        first = np.cumsum(runs) - runs
        owner = group[starts]
        after = np.arange(1, len(starts) + 1)  # the next run, back to the group's first
        following = np.where(after < first[owner] + runs[owner], after, first[owner])[run]
        position = np.arange(len(device)) - starts[run]
        dst = device[starts[following] + position % length[following]]
        crossing = runs[group] >= 2
        return device[crossing], dst[crossing], (1.0 / length[run])[crossing]

    def direct_unit_loads(self, instances: tuple[tuple[int, ...], ...]) -> tuple[tuple[Link, float], ...]:
        """All-to-all: every rank sends 1/n of its buffer to every other rank."""
        key = ("a2a", instances)
        hit = self._unit.get(key)
        if hit is None:
            src: list[int] = []
            dst: list[int] = []
            piece: list[float] = []
            for group in instances:
                for s in group:
                    others = [d for d in group if d != s]
                    src += [s] * len(others)
                    dst += others
                    piece += [1.0 / len(group)] * len(others)
            hit = self._unit[key] = self.routed_loads(src, dst, piece)
        return hit

    def collnet_unit_loads(self, instances: tuple[tuple[int, ...], ...]) -> tuple[tuple[Link, float], ...]:
        """In-network reduction: each node's members send (and receive) 1/g of the buffer
        each, once, up the switch tree (modelled as the node's leaf uplinks)."""
        key = ("collnet", instances)
        hit = self._unit.get(key)
        if hit is None:
            loads: dict[Link, float] = defaultdict(float)
            for group in instances:
                for members in self.nodes_of(group).values():
                    for device in members:
                        loc = self.topology.location(device)
                        for kind in (LinkKind.NIC_TX, LinkKind.NIC_RX):
                            loads[(kind, loc.nic)] += 1.0 / len(members)
            hit = self._unit[key] = tuple(loads.items())
        return hit

    def scaled(self, unit: tuple[tuple[Link, float], ...], times: float,
               over: float) -> tuple[tuple[Link, float], ...]:
        """``(link, u * times / over)`` for every ``(link, u)`` of ``unit``, evaluated as that
        Python expression would (one array operation per step); the network time of the
        result is remembered for :meth:`network_s`."""
        hit = self._columns.get(id(unit))
        if hit is None or hit[0] is not unit:
            links = [link for link, _ in unit]
            hit = self._columns[id(unit)] = (
                unit, links, np.array([u for _, u in unit], dtype=float),
                np.array([self.topology.capacity(link) for link in links], dtype=float))
        _, links, units, capacity = hit
        values = units * times / over
        loads = tuple(zip(links, values.tolist()))
        self._network[id(loads)] = (loads, float((values / capacity).max()) if unit else 0.0)
        return loads

    def network_s(self, plan: Plan) -> float:
        """``plan.network_s(topology)``, without walking the loads again when :meth:`scaled`
        made them."""
        hit = self._network.get(id(plan.loads))
        if hit is not None and hit[0] is plan.loads:
            return hit[1]
        return plan.network_s(self.topology)

    # --- plans -------------------------------------------------------------------------------
    def _latency(self, algorithm: Algorithm, proto: Protocol, steps: int, inter: int,
                 per_node: int) -> float:
        node = self.cluster.node
        if node.collective_latency_s:
            return (1 + steps - inter) * node.collective_latency_s + inter * node.nic_latency_s
        intra = self._intra_hop_s(algorithm, proto, chained=steps > 1)
        if inter:
            # "Inter-node rings still have to launch nsteps * net overhead" (NCCL tuning.cc):
            # every step waits for the proxy thread's network post, three with Simple.
            intra = max(intra, node.net_post_overhead_s * (3 if proto is Protocol.SIMPLE else 1))
        # NCCL adds the network's own latency (graph->latencyInter) to every network hop. With
        # one GPU per node no NVLink step hides a network hop: "with ppn=1 latencies are fully
        # exposed, use the Tree network latency" (tuning.cc, NCCL 2.23 on). Across two NDm A100
        # v4 nodes with one GPU each, 1 KiB all-gather and all-reduce (LL) take 16.1 and 21.3 us
        # (dev set): the ring's 2.7 us network hop would make them 12.1 and 17.5.
        net_algorithm = Algorithm.TREE if per_node == 1 else algorithm
        return (BASE_LATENCY_US[algorithm][proto]
                + inter * HOP_LATENCY_US[Hop.NET][net_algorithm][proto]) * 1e-6 \
            + (steps - inter) * intra + inter * node.nic_latency_s

    def step_latency(self, multi: bool, per_node: int) -> float:
        """One direct send/recv step with the Simple protocol: NCCL's base latency and one
        hop, a network hop when the group spans nodes (with the proxy's post overheads)."""
        return self._latency(Algorithm.RING, Protocol.SIMPLE, 1, 1 if multi else 0, per_node)

    def _intra_hop_s(self, algorithm: Algorithm, proto: Protocol, chained: bool = True) -> float:
        """One step inside the node: NCCL's table, or the measured Simple step on NVLink when
        steps hand data on to each other (``chained``; a lone exchange keeps the table's)."""
        table = HOP_LATENCY_US[self.intra_hop][algorithm][proto]
        if chained and self.intra_hop is Hop.NVLINK and proto is Protocol.SIMPLE:
            return SIMPLE_STEP_US.get(self.cluster.device.scale_up_generation, table) * 1e-6
        return table * 1e-6

    def _tree_latency(self, proto: Protocol, per_node: int, nodes: int) -> float:
        """Double binary tree all-reduce (NCCL tuning.cc): up and down through the node's
        chain of GPUs and log2(nodes) network levels."""
        net = HOP_LATENCY_US[Hop.NET][Algorithm.TREE][proto] * 1e-6 + self.cluster.node.nic_latency_s
        return (BASE_LATENCY_US[Algorithm.TREE][proto] * 1e-6
                + 2 * ((per_node - 1) * self._intra_hop_s(Algorithm.TREE, proto)
                       + math.ceil(math.log2(nodes)) * net))

    def _chain_plan(self, proto: Protocol, n: int, nbytes: float) -> Plan:
        """Tree all-reduce inside one node: NCCL's tree there is a chain through the GPUs,
        reducing up and broadcasting down. NCCL's tuner (tuning.cc) rates its algorithm
        bandwidth at half the link's, derated 0.92 (LL128: 7/9 on one node, LL: 1/3.8), and
        its latency from 2(n-1) chain hops: LL128's shorter hops win around 1-2 MiB."""
        algbw = self.scale_up * TREE_ALGBW_RATIO * TREE_CHAIN_FRACTION[proto]
        return Plan(Algorithm.TREE, proto, self._tree_latency(proto, n, 1), nbytes / algbw, ())

    def _protocol_efficiency(self, proto: Protocol, nodes: int, per_node: int) -> float:
        """Fraction of the ring's link bandwidth a protocol delivers (NCCL tuner rules)."""
        if proto is Protocol.SIMPLE:
            return 1.0
        if proto is Protocol.LL128:
            if nodes == 1 and self.intra_hop is Hop.NVLINK:
                return LL128_NODE_FRACTION.get(self.cluster.device.scale_up_generation,
                                               LL128_FRACTION[True])
            return LL128_FRACTION[per_node >= 2]
        arch = ARCH_OF_SCALE_UP.get(self.cluster.device.scale_up_generation, "ampere")
        cap = LL_MAX_BUS_GBPS[arch][0 if nodes == 1 else (1 if nodes == 2 else 2)] * 1e9
        link = self.scale_up if nodes == 1 else self.topology.nic_capacity * per_node
        return min(LL_FRACTION, cap / link)

    def plans(self, kind: CollectiveKind, nbytes: float,
              instances: tuple[tuple[int, ...], ...]) -> list[Plan]:
        group = instances[0]
        n = len(group)
        nodes = self.nodes_of(group)
        per_node = max(len(m) for m in nodes.values())
        multi = len(nodes) > 1
        if kind is CollectiveKind.ALL_TO_ALL:
            volume = (per_node - 1) / n * nbytes
            unit = self.direct_unit_loads(instances) if multi else ()
            # NCCL runs all-to-all as grouped send/recv: one Simple-protocol hop each way, and
            # the proxy thread posts a send and a receive for every peer in another node.
            remote = n - per_node
            lat = self.step_latency(multi, per_node) + 2 * remote * self.cluster.node.net_post_overhead_s
            single = SINGLE_GPU_PER_NODE_EFFICIENCY if per_node == 1 else 1.0
            return [Plan(Algorithm.DIRECT, Protocol.SIMPLE, lat, volume / self.scale_up,
                         self.scaled(unit, nbytes, single))]
        if kind is CollectiveKind.ALL_REDUCE:
            volume, steps, inter = bus_factor(kind, n) * nbytes, 2 * (n - 1), 2 * (len(nodes) - 1)
        elif kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
            volume, steps, inter = bus_factor(kind, n) * nbytes, n - 1, len(nodes) - 1
        elif kind is CollectiveKind.BROADCAST:
            volume, steps, inter = nbytes, n - 1, len(nodes) - 1
        else:  # RING_EXCHANGE: one step of a ring, every rank to its successor
            volume, steps, inter = nbytes, 1, 1 if multi else 0
        ring = self.ring_unit_loads(instances) if multi else ()
        reducing = kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
        out = []
        single = SINGLE_GPU_PER_NODE_EFFICIENCY if per_node == 1 else 1.0
        # A ring's hops inside a node ride NVLink; where it leaves a node, the hop takes a NIC
        # instead. Each channel enters and leaves a node once, through different GPUs per
        # channel, so a GPU sends (g-1)/g of its ring volume over NVLink with g per node.
        nvlink_share = (per_node - 1) / per_node if multi else 1.0
        for proto in Protocol:
            if multi and proto is not Protocol.SIMPLE and self.cluster.node.net_simple_protocol_only:
                continue
            eff = self._protocol_efficiency(proto, len(nodes), per_node)
            loads = self.scaled(ring, volume, eff * single)
            reduce_eff = REDUCTION_EFFICIENCY if reducing else 1.0
            intra = volume * nvlink_share / (self.scale_up * eff * reduce_eff)
            out.append(Plan(Algorithm.RING, proto, self._latency(Algorithm.RING, proto, steps, inter,
                                                               per_node),
                            intra, loads))
            if kind is CollectiveKind.ALL_REDUCE and multi:
                out.append(Plan(Algorithm.TREE, proto, self._tree_latency(proto, per_node, len(nodes)),
                                intra, loads))
            elif kind is CollectiveKind.ALL_REDUCE and n > 2:
                out.append(self._chain_plan(proto, n, nbytes))
        node = self.cluster.node
        if kind is CollectiveKind.ALL_REDUCE and not multi and node.nvls and n >= NVLS_MIN_RANKS:
            out.append(Plan(Algorithm.NVLS, Protocol.SIMPLE,
                            NVLS_LATENCY_S + nvls_loops(nbytes, n) * NVLS_LOOP_OVERHEAD_S,
                            nbytes / (node.scale_up_bandwidth * node.nvls_efficiency), ()))
        if kind is CollectiveKind.ALL_REDUCE and multi and self.cluster.fabric.in_network_reduction:
            unit = self.collnet_unit_loads(instances)
            intra = bus_factor(kind, per_node) * nbytes / self.scale_up if per_node > 1 else 0.0
            lat = (HOP_LATENCY_US[Hop.NET][Algorithm.COLLNET][Protocol.SIMPLE]
                   + 2 * (per_node - 1) * HOP_LATENCY_US[self.intra_hop][Algorithm.RING][Protocol.SIMPLE]) * 1e-6
            out.append(Plan(Algorithm.COLLNET, Protocol.SIMPLE, lat, intra,
                            self.scaled(unit, nbytes, 1.0)))
        return out

    def p2p_pairs(self, nbytes: float, pairs: list[tuple[int, int]]) -> Plan:
        """Send/recv of ``nbytes`` between every (src, dst) device pair at once (Simple)."""
        node = self.topology.fields()["node"]
        src = np.array([p[0] for p in pairs], dtype=np.int64)
        dst = np.array([p[1] for p in pairs], dtype=np.int64)
        loads = self.routed_loads(src, dst, [nbytes] * len(pairs))
        local = bool(np.any(node[src] == node[dst]))
        hop = Hop.NET if loads else self.intra_hop
        lat = (BASE_LATENCY_US[Algorithm.RING][Protocol.SIMPLE]
               + HOP_LATENCY_US[hop][Algorithm.RING][Protocol.SIMPLE]) * 1e-6
        intra = nbytes / self.scale_up if local else 0.0
        return Plan(Algorithm.DIRECT, Protocol.SIMPLE, lat, intra, loads)

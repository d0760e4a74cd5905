"""The chunk pipeline of NCCL's trees across nodes: why mid-size all-reduces lose time.

NCCL moves a collective through its connections in steps of a fixed buffer: each connection
has ``NCCL_STEPS`` (8) slots of ``buffSize / NCCL_STEPS`` bytes per protocol (``device.h``,
``init.cc``: Simple 4 MiB unless NCCL_BUFFSIZE says otherwise, ``NodeSpec.nccl_buffer_bytes``;
LL128 120 x 640 x 8 x 8 B, LL 8 x 512 x 8 x 16 B). A tree all-reduce walks each channel's share of the buffer chunk by chunk (``all_reduce.h``, ``runTreeUpDown``);
the chunk is one step for a tree (``enqueue.cc``, ``calcCollChunking``: chunkSteps = 1 except
the Simple ring), shrunk for LL128 where the buffer is small against the tree's depth.

A chunk crosses the network as a whole: the sending proxy posts a step when all its data is
there (``net.cc``, ``sendProxyProgress``: the FIFO tail for Simple, every LL/LL128 flag of the
step otherwise), and the receiving proxy hands it to the GPU when the receive (and, for Simple
over GPU Direct RDMA, its flush) completes. With Simple a chunk also crosses every GPU of the
node's chain as a whole: the tree runs ``ProtoSimple<1, 1>`` (``all_reduce.h``: one step a
slice), and a GPU waits until its peer has posted the whole slice before it reduces and passes it
on (``prims_simple.h``, ``waitPeer``: ``connStepCache < step + StepPerSlice``; the peer's
``postPeer`` after the slice is stored). LL and LL128 pass data on line by line (a flag in every
8- or 128-byte line), so their chain does not hold a chunk back. (NCCL v2.23.4-1, 68b54236; the same in v2.28.3-1.)

A pipeline of D such stages moving k rounds takes (k + D - 1) round times; the bandwidth term of
``collectives.py`` counts the k, this module the D - 1 (Sanders, Speck, Traff, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009:
the pipelined tree's time (k + depth) x chunk time). A round is every channel's chunk at once;
below one round each channel carries its whole share as one piece, and the tree does not
pipeline at all.
"""

from __future__ import annotations

import math

from clustersim.simulator.cost.collectives import Protocol

NCCL_STEPS = 8
"""Slots of a connection's buffer (``src/include/device.h``)."""
BUFFER_BYTES = {Protocol.SIMPLE: 1 << 22, Protocol.LL128: 120 * 640 * NCCL_STEPS * 8,
                Protocol.LL: 8 * 512 * NCCL_STEPS * 16}
"""Default buffer per connection and protocol (``src/init.cc``: DEFAULT_BUFFSIZE 4 MiB;
DEFAULT_LL128_BUFFSIZE = 120 elements x 640 threads x NCCL_STEPS x 8 B; DEFAULT_LL_BUFFSIZE =
8 lines x 512 threads x NCCL_STEPS x 16 B)."""
LL128_DATA_FRACTION = 15 / 16
"""LL128 lines of 16 eight-byte elements carry 15 of data (NCCL_LL128_DATAELEMS)."""


def step_bytes(proto: Protocol, simple_buffer: int = BUFFER_BYTES[Protocol.SIMPLE]) -> int:
    """One step of a connection's buffer: buffSize / NCCL_STEPS; ``simple_buffer`` is the
    Simple protocol's (``NCCL_BUFFSIZE``, ``NodeSpec.nccl_buffer_bytes``), which sets no other
    protocol's (``init.cc``: NCCL_LL_BUFFSIZE and NCCL_LL128_BUFFSIZE are their own)."""
    if proto is Protocol.SIMPLE:
        return simple_buffer // NCCL_STEPS
    return BUFFER_BYTES[proto] // NCCL_STEPS


def tree_chunk_bytes(proto: Protocol, nbytes: float, channels: int, nodes: int,
                     per_node: int, simple_buffer: int = BUFFER_BYTES[Protocol.SIMPLE]) -> int:
    """Data bytes of one chunk of a tree all-reduce (``enqueue.cc``, ``calcCollChunking``): one
    step of data (LL: half the step, LL128: 15/16 of it); LL128 halves it while each channel
    holds fewer than ``nsteps x 64 / ppn`` chunks (down to 128 KiB) and ``nsteps x 16 / ppn``
    (down to 32 KiB), with ``nsteps = 1 + log2(nodes) + ppn / 10``."""
    step = step_bytes(proto, simple_buffer)
    if proto is Protocol.LL:
        return step // 2
    if proto is Protocol.SIMPLE:
        return step
    chunk = int(step * LL128_DATA_FRACTION)
    depth = 1 + int(math.log2(nodes)) + 0.1 * per_node
    for chunks, floor in ((64, 131072), (16, 32768)):
        while nbytes // (channels * chunk) < depth * chunks / per_node and chunk > floor:
            chunk //= 2
    return chunk


def tree_stages(nodes: int) -> int:
    """Network stages of a chunk's way up and down NCCL's tree, each handing on whole steps:
    the log2(nodes) network levels, each way."""
    return 2 * math.ceil(math.log2(nodes))


def chain_stages(proto: Protocol, per_node: int) -> int:
    """NVLink stages of a chunk's way up and down the tree that hand on whole steps: with
    Simple, the per_node - 1 hops of the deepest node's chain of GPUs up to the node's network
    connection, and as many back down (0 for LL and LL128, which forward line by line)."""
    return 2 * (per_node - 1) if proto is Protocol.SIMPLE else 0


def tree_stage_times_s(proto: Protocol, nodes: int, per_node: int, network_s: float,
                       nvlink_s: float) -> list[float]:
    """Each stage of a tree all-reduce's chunk pipeline with the time it takes for the whole
    message: the network levels (``tree_stages``) at ``network_s``, the chain's NVLink hops
    (``chain_stages``) at ``nvlink_s``; ``staged_fill_s`` turns them into the fill."""
    return [network_s] * tree_stages(nodes) + [nvlink_s] * chain_stages(proto, per_node)


def pipeline_fill_s(stages: int, round_bytes: float, nbytes: float, bandwidth_s: float) -> float:
    """The D - 1 extra round times of a ``stages``-deep pipeline whose rounds carry
    ``round_bytes`` (at most the whole buffer), when the whole ``nbytes`` take ``bandwidth_s``
    through its slowest stage."""
    if nbytes <= 0 or stages <= 1:
        return 0.0
    return (stages - 1) * min(round_bytes, nbytes) * bandwidth_s / nbytes


def staged_fill_s(stage_times_s: list[float], round_bytes: float, nbytes: float) -> float:
    """The fill of a pipeline whose stages move the whole ``nbytes`` in ``stage_times_s`` each
    (a stage's bytes over its own rate): k rounds through stages of per-round times t_i take
    sum(t_i) + (k - 1) max(t_i), so the fill over the bandwidth term k max(t_i) is
    sum(t_i) - max(t_i), each t_i the stage's time scaled to one round (at most the whole
    message). With equal stages this is ``pipeline_fill_s``'s (D - 1) rounds."""
    if nbytes <= 0 or len(stage_times_s) <= 1:
        return 0.0
    share = min(round_bytes, nbytes) / nbytes
    return share * (sum(stage_times_s) - max(stage_times_s))


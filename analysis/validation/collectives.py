"""What nccl-tests would measure on a cluster: one collective (or a ring of send/receives) over
a group of ranks, alone on the fabric, as the network model times it.

The columns follow nccl-tests (doc/PERFORMANCE.md): algbw = size / time, busbw = algbw x the
collective's bus factor (all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n).
``gpus_per_thread`` is nccl-tests' ``-g N``: one thread launches N GPUs' kernels back to back,
and small sizes then measure that host loop rather than the GPUs; the Simple protocol of one
process driving several GPUs also pays for NCCL's direct-pointer mode.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.cost.collectives import (
    COLL_CHANNELS, SINGLE_PROCESS_SIMPLE_S, Algorithm, Protocol, nccl_channels,
    single_thread_launch_s,
)
from clustersim.simulator.cost.network import NetworkModel, bus_factor
from clustersim.workloads.trace import CollectiveKind

OPS = {"all_reduce": CollectiveKind.ALL_REDUCE, "all_gather": CollectiveKind.ALL_GATHER,
       "reduce_scatter": CollectiveKind.REDUCE_SCATTER, "alltoall": CollectiveKind.ALL_TO_ALL,
       "broadcast": CollectiveKind.BROADCAST, "sendrecv": None}
"""The operations by nccl-tests' names (``alltoall_perf``, ...); sendrecv is a ring of p2p."""
OP_ALIASES = {"all_to_all": "alltoall"}
"""Other spellings accepted for an operation (the trace's name for the all-to-all)."""


def canonical_op(name: str) -> str:
    """nccl-tests' name of an operation (``all_to_all`` -> ``alltoall``)."""
    return OP_ALIASES.get(name, name)


@dataclass(frozen=True)
class CollectiveRow:
    bytes: float
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str
    protocol: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def measure(cluster: ClusterSpec, op: str, gpus: int, size: float,
            algorithm: Algorithm | None = None, gpus_per_thread: int = 1) -> CollectiveRow:
    """One nccl-tests line: ``op`` of ``size`` bytes over the first ``gpus`` devices.

    ``gpus_per_thread``: nccl-tests ``-g`` (one thread launching that many GPUs' kernels);
    1 for one process or thread per GPU (mpirun, ``-t``)."""
    kind = OPS[canonical_op(op)]
    network = NetworkModel(cluster, {kind: algorithm} if algorithm and kind else None)
    devices = tuple(cluster.device_of(r) for r in range(gpus))
    if kind is None:   # sendrecv: rank i sends to i+1, in a ring, all at once
        pairs = [(devices[i], devices[(i + 1) % gpus]) for i in range(gpus)]
        plan = network.p2p_plan(size, pairs)
        factor = 1.0
    else:
        plan = network.plan(kind, size, (devices,))
        factor = bus_factor(kind, gpus)
    t = plan.time(network.topology)
    if gpus_per_thread > 1 and kind is not None:
        channels = COLL_CHANNELS.get(cluster.device.scale_up_generation, 16)
        if plan.algorithm is Algorithm.RING:
            channels = nccl_channels(plan.protocol, size, gpus, channels)
        if plan.protocol is Protocol.SIMPLE:
            t += SINGLE_PROCESS_SIMPLE_S
        t = max(t, single_thread_launch_s(gpus_per_thread, channels))
    algbw = size / t / 1e9
    return CollectiveRow(size, t, algbw, algbw * factor, plan.algorithm.value, plan.protocol.value)


MAX_ROWS = 10_000


def sizes(lo: float, hi: float, factor: float = 2.0) -> list[float]:
    out, s = [], lo
    while s <= hi * (1 + 1e-9):
        out.append(s)
        s *= factor
    return out



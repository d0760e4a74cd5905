"""Checkpoint policies: how long a save pauses training, how long until it is usable, how long
a restore takes, from the checkpoint's size and the bandwidth of the tier it goes to.

Sizes come in as byte counts (:class:`CheckpointState`); ``checkpoint_state.py`` says what a
job's checkpoint holds.

Bandwidth: writers share a cluster-wide tier (a parallel file system) up to its bandwidth, and
each writer node is also bounded by its own path to storage; a node-scoped tier (local NVMe)
scales with the writers.

Intervals: Young (1974), "A first order approximation to the optimum checkpoint interval",
CACM 17(9): t = sqrt(2 d M) for checkpoint cost d and mean time between failures M, with waste
d/t + t/(2M) (+ R/M for a restart cost R). Daly (2006), "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3), eq. (37): t = sqrt(2 d M) [1 + sqrt(d/(2M))/3
+ d/(18 M)] - d for d < 2M, else M.

REFT: Wang et al., "Reliable and Efficient In-Memory Fault Tolerance of Large Language Model
Pretraining" (arXiv 2310.12670, 2023; v2 2024 "Fault-Tolerant Hybrid-Parallel Training at Scale
with Reliable and Efficient In-memory Checkpointing"). Each data-parallel peer snapshots only its
1/dp shard of its model-parallel part's parameters and optimizer state to its own host memory,
while the next forward and backward passes run (the parameters do not change until the optimizer
step), and protects the shards of a sharding group with parity (erasure coding: RAIM5 in v1):
a node loss within what the parity tolerates is rebuilt from the peers' host memory, without
storage. See :func:`reft_snapshot`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec, MemoryTierSpec


class CheckpointPolicy(enum.Enum):
    SYNC = "sync"
    """Training stops while the ranks of one data-parallel replica write the whole state
    (``torch.save`` from data-parallel rank 0 of every model-parallel shard)."""
    SHARDED = "sharded"
    """Training stops while every node writes its 1/N share (PyTorch DCP, Megatron's
    distributed checkpoint): all nodes' bandwidth to storage."""
    ASYNC = "async"
    """Training stops only to copy each GPU's state to host memory; all nodes persist it to
    storage in the background (Megatron async save, DCP async_save)."""
    IN_MEMORY = "in_memory"
    """GEMINI (Wang et al., SOSP'23): snapshot to host memory, replicate it to peer nodes' host
    memory in the background; every n-th checkpoint is also persisted to storage."""
    REFT = "reft"
    """REFT (Wang et al., arXiv 2310.12670): each data-parallel peer snapshots its 1/dp shard of
    the state to host memory while training goes on; parity over the sharding group's nodes
    survives ``tolerated_failures`` lost nodes per group; every n-th checkpoint is also persisted
    to storage."""


class IntervalRule(enum.Enum):
    FIXED = "fixed"
    YOUNG = "young"
    DALY = "daly"


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointLevel:
    """Where a checkpoint lives once saved, and what using it costs."""

    every: int
    """Every how many checkpoints reach this level."""
    background_s: float
    """Time after the pause until this copy is complete and usable."""
    load_s: float
    """Restore time from this level."""
    durable: bool
    """Survives the loss of the nodes that wrote it (storage); in-memory copies do not always."""

    def to_dict(self) -> dict:
        return {"every": self.every, "background_s": self.background_s, "load_s": self.load_s,
                "durable": self.durable}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointCost:
    policy: CheckpointPolicy
    state_bytes: float
    """Weights + optimizer state of the whole job (what storage holds)."""
    blocking_s: float
    """Training paused per checkpoint."""
    levels: tuple[CheckpointLevel, ...]
    """Fastest first; the last is durable."""

    @property
    def durable(self) -> CheckpointLevel:
        return self.levels[-1]

    @property
    def planned_save_s(self) -> float:
        """A save that must be durable before a planned stop: the pause plus the durable copy."""
        return self.blocking_s + self.durable.background_s

    def to_dict(self) -> dict:
        return {"policy": self.policy.value, "state_bytes": self.state_bytes,
                "blocking_s": self.blocking_s, "levels": [lv.to_dict() for lv in self.levels]}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointState:
    """What a checkpoint holds, in bytes: all the cost model needs to know of the job
    (:func:`~clustersim.simulator.longrun.checkpoint_state.checkpoint_state` reads it off a job)."""

    total_bytes: float
    """Weights + optimizer state of the whole model (what storage holds)."""
    device_bytes: float
    """Weights + optimizer state the fullest GPU holds: what it snapshots to host memory."""
    replica_devices: int
    """GPUs that together hold one full copy (tp x pp x cp): the writers of a sync save."""
    replicas: int = 1
    """Data-parallel replicas: the peers REFT shards each model-parallel part's state over."""
    group_nodes: int = 1
    """Nodes one GPU's data-parallel peers are spread over (REFT's sharding group)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSetup:
    """What the user chose; :func:`checkpoint_cost` turns it into times."""

    policy: CheckpointPolicy = CheckpointPolicy.SYNC
    storage: MemoryTierSpec
    node_storage_bandwidth: float = 0.0
    """Each node's path to storage, bytes/s; 0 = the node's network bandwidth."""
    save_time_s: float = 0.0
    """Measured pause per checkpoint; 0 = from sizes and bandwidths."""
    load_time_s: float = 0.0
    """Measured restore time from storage; 0 = from sizes and bandwidths."""
    peer_replicas: int = 1
    """In-memory: copies of each node's state on other nodes."""
    persist_every: int = 10
    """In-memory and REFT: every n-th checkpoint also goes to storage."""
    tolerated_failures: int = 1
    """REFT: lost nodes per sharding group the parity rebuilds (REFT v1's RAIM5: one)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReftSnapshot:
    """What one REFT snapshot costs a GPU."""

    copy_s: float
    """Its shard device -> host over its host link."""
    blocking_s: float
    """Training time it takes: HBM time the copy engine reads away from kernels, plus any part
    of the copy the forward and backward passes do not cover."""


def reft_snapshot(shard_bytes: float, host_bandwidth: float, hbm_bandwidth: float,
                  window_s: float) -> ReftSnapshot:
    """REFT's hierarchical asynchronous snapshot of ``shard_bytes`` per GPU: the copy runs
    during the ``window_s`` of forward and backward that follow the save point (parameters and
    optimizer state only change in the optimizer step); it must finish before that step, so the
    part of the copy longer than the window stalls training. Reading the shard from HBM takes
    ``shard / HBM bandwidth`` of the kernels' memory time (first order: the copy and the kernels
    share HBM bandwidth)."""
    copy = shard_bytes / host_bandwidth
    return ReftSnapshot(copy_s=copy, blocking_s=shard_bytes / hbm_bandwidth
                        + max(0.0, copy - window_s))


def checkpoint_cost(setup: CheckpointSetup, held: CheckpointState, cluster: ClusterSpec,
                    step_time_s: float = 0.0) -> CheckpointCost:
    """Pause, background and restore times of ``setup`` for a checkpoint of ``held`` on
    ``cluster`` (``step_time_s``: the training step REFT's snapshot overlaps; 0: none)."""
    state = held.total_bytes
    nodes = cluster.num_nodes
    gpn = cluster.devices_per_node
    node_bw = setup.node_storage_bandwidth or cluster.node.network_bandwidth
    replica_nodes = max(1, math.ceil(held.replica_devices / gpn))
    all_write = state / setup.storage.reach(nodes, gpn, True, node_bw)
    load = setup.load_time_s or state / setup.storage.reach(nodes, gpn, False, node_bw)
    device_state = held.device_bytes
    host_bw = min(cluster.node.pcie_bandwidth, cluster.per_device(cluster.host_memory, write=True))
    snapshot = device_state / host_bw
    policy = setup.policy
    if policy is CheckpointPolicy.SYNC:
        one_replica = setup.storage.reach(replica_nodes, gpn, True, node_bw)
        pause = setup.save_time_s or state / one_replica
        levels = (CheckpointLevel(every=1, background_s=0.0, load_s=load, durable=True),)
    elif policy is CheckpointPolicy.SHARDED:
        pause = setup.save_time_s or all_write
        levels = (CheckpointLevel(every=1, background_s=0.0, load_s=load, durable=True),)
    elif policy is CheckpointPolicy.ASYNC:
        pause = snapshot
        background = setup.save_time_s or all_write
        levels = (CheckpointLevel(every=1, background_s=background, load_s=load, durable=True),)
    else:
        node_state = device_state * gpn
        net = cluster.node.network_bandwidth
        gather = max(node_state / net, device_state / cluster.node.pcie_bandwidth)
        if policy is CheckpointPolicy.IN_MEMORY:
            pause = snapshot
            background = setup.peer_replicas * node_state / net
            peer_load = gather
        else:
            pause, background, peer_load = _reft_times(setup, held, cluster, host_bw, gather,
                                                       step_time_s)
        levels = (CheckpointLevel(every=1, background_s=background, load_s=peer_load,
                                  durable=False),
                  CheckpointLevel(every=setup.persist_every,
                                  background_s=setup.save_time_s or all_write, load_s=load,
                                  durable=True))
    return CheckpointCost(policy=policy, state_bytes=state, blocking_s=pause, levels=levels)


def _reft_times(setup: CheckpointSetup, held: CheckpointState, cluster: ClusterSpec,
                host_bw: float, gather_s: float, step_time_s: float
                ) -> tuple[float, float, float]:
    """(pause, background, restore) of a REFT snapshot; the window is the whole step (its
    forward and backward passes are nearly all of it). Background: the copy, then the parity:
    each node's shards enter ``t`` parity reductions over the group (a pipelined reduce moves
    each byte once per parity). Restore: a replacement node decodes its lost shards from
    ``g - t`` surviving blocks each, then every GPU gathers its part's state from its peers'
    host memory (the in-memory restore's gather)."""
    shard = held.total_bytes / (held.replica_devices * held.replicas)
    node_shard = shard * cluster.devices_per_node
    net = cluster.node.network_bandwidth
    snap = reft_snapshot(shard, host_bw, cluster.device.memory_bandwidth, step_time_s)
    t, g = setup.tolerated_failures, max(held.group_nodes, 1)
    parity = t * node_shard / net
    decode = max(g - t, 1) * node_shard / net
    return snap.blocking_s, snap.copy_s + parity, decode + gather_s


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): the first-order optimum sqrt(2 d M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006) eq. (37): the higher-order optimum."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def young_waste(interval_s: float, cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Young's first-order fraction of time wasted: d/t + t/(2M) + R/M."""
    return cost_s / interval_s + interval_s / (2.0 * mtbf_s) + restart_s / mtbf_s


def optimal_interval(rule: IntervalRule, cost: CheckpointCost, mtbf_s: float,
                     fixed_s: float = 0.0) -> float:
    """The interval ``rule`` gives. The cost that trades against lost work is the pause; an
    interval shorter than the background persist would stall on it, so it is raised to it."""
    if rule is IntervalRule.FIXED:
        return fixed_s
    d = max(cost.blocking_s, 1e-9)
    t = young_interval(d, mtbf_s) if rule is IntervalRule.YOUNG else daly_interval(d, mtbf_s)
    return max(t, cost.levels[0].background_s)

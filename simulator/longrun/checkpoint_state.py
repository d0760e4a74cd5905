"""What a job's checkpoint holds, in bytes: the one place the long-run simulator reads a job.

A checkpoint holds the weights and the optimizer state, not the gradients: 2 + 12 bytes per
parameter under mixed-precision Adam, 4 + 8 in FP32 (``workloads.memory.model_state_bytes``);
BLOOM-176B's checkpoints were 2.3 TB = 176e9 x 14 bytes (bigscience tr11-176B-ml README,
"Checkpoints").
"""

from __future__ import annotations

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.longrun.checkpointing import CheckpointState
from clustersim.workloads import Job
from clustersim.workloads.axes import Axis
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.memory import model_state_bytes


def checkpoint_bytes(job: Job) -> float:
    """Weights + optimizer state of the whole model (see the module docstring)."""
    per_param = model_state_bytes(job.training)
    return job.model.parameters * (per_param.weights + per_param.optimizer)


def device_state_bytes(job: Job) -> float:
    """Weights + optimizer state one GPU holds (largest pipeline stage): what it snapshots."""
    return max(s.memory.weights + s.memory.optimizer + s.offloaded_bytes for s in job.memory())


def sharding_groups(job: Job, cluster: ClusterSpec) -> tuple[tuple[int, ...], ...]:
    """REFT's sharding groups in nodes: for each node, the nodes that hold the data-parallel
    peers of its GPUs (distinct sets, in node order)."""
    s = job.strategy
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)
    groups: dict[tuple[int, ...], None] = {}
    by_node: dict[int, set[int]] = {}
    for rank in range(layout.world_size):
        peers = by_node.setdefault(cluster.node_of(rank), set())
        peers.update(cluster.node_of(p) for p in layout.group(Axis.DP, rank))
    for node in sorted(by_node):
        groups.setdefault(tuple(sorted(by_node[node])), None)
    return tuple(groups)


def checkpoint_state(job: Job, cluster: ClusterSpec | None = None) -> CheckpointState:
    """What ``job``'s checkpoint holds; ``cluster`` places it (REFT's sharding group)."""
    s = job.strategy
    group = max(map(len, sharding_groups(job, cluster)), default=1) if cluster else 1
    return CheckpointState(total_bytes=checkpoint_bytes(job), device_bytes=device_state_bytes(job),
                           replica_devices=s.tp * s.pp * s.cp, replicas=s.dp, group_nodes=group)

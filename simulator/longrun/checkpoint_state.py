"""What a job's checkpoint holds, in bytes: the one place the long-run simulator reads a job.

A checkpoint holds the weights and the optimizer state, not the gradients: 2 + 12 bytes per
parameter under mixed-precision Adam, 4 + 8 in FP32 (``workloads.memory.model_state_bytes``);
BLOOM-176B's checkpoints were 2.3 TB = 176e9 x 14 bytes (bigscience tr11-176B-ml README,
"Checkpoints").
"""

from __future__ import annotations

from clustersim.simulator.longrun.checkpointing import CheckpointState
from clustersim.workloads import Job
from clustersim.workloads.memory import model_state_bytes


def checkpoint_bytes(job: Job) -> float:
    """Weights + optimizer state of the whole model (see the module docstring)."""
    per_param = model_state_bytes(job.training)
    return job.model.parameters * (per_param.weights + per_param.optimizer)


def device_state_bytes(job: Job) -> float:
    """Weights + optimizer state one GPU holds (largest pipeline stage): what it snapshots."""
    return max(s.memory.weights + s.memory.optimizer + s.offloaded_bytes for s in job.memory())


def checkpoint_state(job: Job) -> CheckpointState:
    s = job.strategy
    return CheckpointState(total_bytes=checkpoint_bytes(job), device_bytes=device_state_bytes(job),
                           replica_devices=s.tp * s.pp * s.cp)

"""What a job's checkpoint holds, in bytes: the one place the long-run simulator reads a job.

A checkpoint holds the weights and the optimizer state, not the gradients. Mixed-precision Adam
keeps 2 (16-bit weights) + 12 (FP32 master weights, momentum, variance) bytes per parameter
(Rajbhandari et al., ZeRO, SC'20 sec. 3); BLOOM-176B's checkpoints were 2.3 TB = 176e9 x 14
bytes (bigscience tr11-176B-ml README, "Checkpoints"). FP32 training keeps 4 + 8.
"""

from __future__ import annotations

from clustersim.simulator.longrun.checkpointing import CheckpointState
from clustersim.workloads import Job


def checkpoint_bytes(job: Job) -> float:
    """Weights + optimizer state of the whole model (see the module docstring)."""
    per_param = 2.0 + 12.0 if job.training.precision.mixed else 4.0 + 8.0
    return job.model.parameters * per_param


def device_state_bytes(job: Job) -> float:
    """Weights + optimizer state one GPU holds (largest pipeline stage): what it snapshots."""
    return max(s.memory.weights + s.memory.optimizer + s.offloaded_bytes for s in job.memory())


def checkpoint_state(job: Job) -> CheckpointState:
    s = job.strategy
    return CheckpointState(total_bytes=checkpoint_bytes(job), device_bytes=device_state_bytes(job),
                           replica_devices=s.tp * s.pp * s.cp)

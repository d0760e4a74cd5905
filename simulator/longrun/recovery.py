"""Recovery policies: what a job does when a node fails, and how long each part takes.

Defaults are what an unoptimised PyTorch job gets, not what the best teams reach: detection waits
for the NCCL watchdog (``kProcessGroupNCCLDefaultTimeout`` = 10 min, PyTorch
``torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp``); the rest are planning figures to
replace with your own measurements (the README's failure section shows how).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class RecoveryKind(enum.Enum):
    RESTART = "restart"
    """Stop everything, replace failed nodes (spare pool, else wait for repair), restart all
    processes and load the last checkpoint."""
    HOT_SPARE = "hot_spare"
    """As restart, but spares are already provisioned and initialised: swapping one in takes
    ``hot_swap`` instead of ``reschedule``."""
    ELASTIC = "elastic"
    """Restart from the last checkpoint at once on the surviving data-parallel replicas (a
    smaller global batch); replaced replicas rejoin with a planned restart when ready."""
    REPLICA_FT = "replica_ft"
    """Replica-level fault tolerance (torchft-style): surviving replicas drop the failed one and
    keep training, losing only the step in flight; the replacement rejoins by copying the state
    from a live peer, without stopping the others."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryPolicy:
    kind: RecoveryKind = RecoveryKind.RESTART
    detection_s: float = 600.0
    """From the fault to the job knowing it (NCCL watchdog default: 10 min)."""
    drain_s: float = 60.0
    """Tearing down the surviving processes (or, replica_ft, re-forming the communicators)."""
    reschedule_s: float = 300.0
    """Provisioning a cold spare: scheduling, health checks, container start."""
    hot_swap_s: float = 30.0
    """Bringing in a hot spare."""
    process_restart_s: float = 300.0
    """Launching every process and initialising NCCL communicators at scale."""
    warmup_s: float = 120.0
    """First steps after a restart run slow (allocator, compilation, data loader)."""
    spare_nodes: int = 0
    """Spare nodes the job may draw on; failed nodes join them once repaired."""
    repair_time_s: float = 86400.0
    """Mean time to repair a failed node (exponentially distributed)."""
    min_replicas: int = 1
    """Elastic and replica_ft: below this many data-parallel replicas, wait for replacements."""
    evict_slow_after_s: float = 0.0
    """Treat a straggler or degraded link that lasts this long as a failure: save, swap the node
    for a spare, restart (FALCON, arXiv 2410.12588: the usual practice today). 0: never."""

    def provision_s(self) -> float:
        return self.hot_swap_s if self.kind is RecoveryKind.HOT_SPARE else self.reschedule_s

    def restart_s(self, load_s: float) -> float:
        """From the decision to restart to training at full speed again."""
        return self.process_restart_s + load_s + self.warmup_s

    def to_dict(self) -> dict:
        out = asdict(self)
        out["kind"] = self.kind.value
        return out

"""Failure exposure of a strategy: how much of a long run failures and checkpoints take.

With a sharded checkpoint (every node writes its share, as PyTorch DCP and Megatron's
distributed checkpoint do) saved at Young's optimum interval (never shorter than one step,
since checkpoints fall between steps), the fraction of time lost is Young's d/t + t/(2M)
(``simulator.longrun.checkpointing``), M being the job's mean time between unexpected interruptions
from the cluster's failure model. Restart time is left out here; ``clustersim failures``
studies recovery in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.longrun.checkpoint_state import checkpoint_state
from clustersim.simulator.longrun.checkpointing import (
    CheckpointPolicy, CheckpointSetup, IntervalRule, checkpoint_cost, optimal_interval,
    young_waste,
)
from clustersim.workloads import Job

POLICY = CheckpointPolicy.SHARDED


@dataclass(frozen=True, kw_only=True, slots=True)
class Exposure:
    interruptions_per_day: float
    checkpoint_pause_s: float
    checkpoint_interval_s: float
    waste: float
    """Fraction of wall time lost to checkpoint pauses and recomputed work."""

    def to_dict(self) -> dict:
        return {"interruptions_per_day": self.interruptions_per_day,
                "checkpoint_pause_s": self.checkpoint_pause_s,
                "checkpoint_interval_s": self.checkpoint_interval_s,
                "failure_waste": self.waste}


def exposure(job: Job, cluster: ClusterSpec, step_time_s: float) -> Exposure:
    mtbf = cluster.failure_model.job_mtbf_s(cluster.num_nodes)
    if mtbf == float("inf"):
        return Exposure(interruptions_per_day=0.0, checkpoint_pause_s=0.0,
                        checkpoint_interval_s=float("inf"), waste=0.0)
    cost = checkpoint_cost(CheckpointSetup(policy=POLICY, storage=cluster.checkpoint_storage),
                           checkpoint_state(job), cluster)
    interval = max(optimal_interval(IntervalRule.YOUNG, cost, mtbf), step_time_s)
    waste = min(1.0, young_waste(interval, cost.blocking_s, mtbf))
    return Exposure(interruptions_per_day=86400.0 / mtbf, checkpoint_pause_s=cost.blocking_s,
                    checkpoint_interval_s=interval, waste=waste)

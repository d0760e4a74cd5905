"""What a job *does*: models, training setup, parallel strategies, FLOP and memory formulas,
and the generators that turn them into a Trace."""

from clustersim.workloads.job import Job
from clustersim.workloads.layout import Axis, ParallelLayout
from clustersim.workloads.model import PRESETS, Mlp, Norm, Position, TransformerSpec
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import Offload, Recompute, Schedule, Strategy
from clustersim.workloads.training import AttentionKernel, Precision, TrainingSpec

__all__ = [
    "AttentionKernel", "Axis", "Job", "Mlp", "Norm", "Offload", "PRESETS", "ParallelLayout",
    "Position", "Precision", "Recompute", "Schedule", "Strategy", "TrainingSpec",
    "TransformerSpec", "resolve",
]

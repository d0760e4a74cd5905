"""The step's headline numbers from its time: throughput, model TFLOP/s per GPU, MFU, memory fit.

MFU counts model FLOPs only (no recompute), over the device's dense peak in the trace's compute
dtype (the average device's on a mixed cluster), as PaLM (Chowdhery et al. 2022) defined it.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import ClusterSpec, Dtype
from clustersim.workloads.trace import Trace


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetrics:
    tokens_per_s: float
    tflops_per_gpu: float
    """Model FLOPs (no recompute) per second per GPU, in TFLOP/s."""
    mfu: float
    peak_memory_bytes: float
    """The largest rank's peak."""
    fits_in_memory: bool


def peak_memory_bytes(trace: Trace) -> float:
    return max(p.peak_memory_bytes for p in trace.programs)


def step_metrics(step_s: float, trace: Trace, cluster: ClusterSpec,
                 capacities: tuple[float, ...]) -> StepMetrics:
    """Metrics of a step of ``step_s`` seconds running ``trace`` on ``cluster``, whose
    programs may each use ``capacities[i]`` bytes of memory per device. On a mixed cluster
    MFU's peak is the average device's."""
    peak_flops = cluster.mean_peak_flops(Dtype(trace.meta.get("peak_dtype", "bf16")))
    flops = trace.model_flops / step_s / trace.world_size if step_s > 0 else 0.0
    fits = all(p.peak_memory_bytes <= cap
               for p, cap in zip(trace.programs, capacities, strict=True))
    return StepMetrics(tokens_per_s=trace.tokens / step_s if step_s > 0 else 0.0,
                       tflops_per_gpu=flops / 1e12, mfu=flops / peak_flops,
                       peak_memory_bytes=peak_memory_bytes(trace), fits_in_memory=fits)

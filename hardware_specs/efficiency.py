"""Fraction-of-peak curves: how close an op of a given size gets to the device's peak rate.

Calibration (``clustersim calibrate fit``) measures such curves on real hardware and writes them
into a device profile; the compute cost model uses them in place of its analytic defaults.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from clustersim.hardware_specs.errors import SpecError

T = TypeVar("T")


class OpClass(enum.Enum):
    """Kinds of kernels whose efficiency differs: tensor-core GEMMs, fused attention,
    memory-bound element-wise work (norms, activations), and the optimizer step."""

    MATMUL = "matmul"
    ATTENTION = "attention"
    ATTENTION_FA3 = "attention_fa3"
    """FlashAttention-3-class fused attention (Hopper's asynchronous warpgroup MMA and TMA):
    its own efficiency; a device without one runs it as ``attention``."""
    ATTENTION_FA4 = "attention_fa4"
    """Blackwell's fused attention (FlashAttention-4, cuDNN's sm100 kernels: tcgen05 MMA with
    tensor memory): what FA3-class software runs on a Blackwell GPU."""
    ATTENTION_CUDNN_2024 = "attention_cudnn_2024"
    """Transformer Engine 1.x's cuDNN fused attention of early 2024 (cuDNN 9.0) on Hopper: a
    measured multiple of FlashAttention-2's rate (``attention``), with its in-training factor;
    a device without FlashAttention-3-class kernels runs it as ``attention``."""
    SSD = "ssd"
    """Mamba-2's chunked scan (mamba_ssm's Triton SSD kernels: tensor-core products inside
    chunks, a sequential pass between them): its own measured rate (``cost/compute.py``), with
    the GEMMs' in-training factor (``MEASURED_AS``)."""
    ELEMENTWISE = "elementwise"
    OPTIMIZER = "optimizer"
    """One fused streaming pass over parameters, gradients and optimizer state; timed by bytes
    like element-wise work, whose curve and factors it uses where it has none of its own (on
    CPUs a fused Adam streams several times faster than an erf-based GeLU)."""
    TRANSCENDENTAL = "transcendental"
    """Element-wise kernels whose per-element math is exp, erf or tanh (activations, softmax,
    cross-entropy): memory-bound on GPUs, where they use element-wise work's curve and factors
    unless they have their own, but arithmetic-bound on CPUs (on the 2-core calibration host
    an erf GeLU ran at 1.1 G elements/s and a residual add at 4.5 G elements/s)."""


ATTENTION_CLASSES = frozenset((OpClass.ATTENTION, OpClass.ATTENTION_FA3, OpClass.ATTENTION_FA4,
                               OpClass.ATTENTION_CUDNN_2024))
"""Fused attention kernels: timed like GEMMs over query tiles, the key length as inner loop."""

MEASURED_AS = {OpClass.ATTENTION_CUDNN_2024: OpClass.ATTENTION, OpClass.SSD: OpClass.MATMUL}
"""Classes timed as a measured multiple of another class, or at a measured rate of their own,
whose in-training factors they take from that class (a calibrated profile fits and writes only
the others): the SSD scan's rate comes from an isolated benchmark of tensor-core kernels, so it
takes the GEMMs' in-training factor."""

MEMORY_BOUND = frozenset((OpClass.ELEMENTWISE, OpClass.OPTIMIZER, OpClass.TRANSCENDENTAL))
"""Op classes timed by bytes moved (curve sizes in bytes), not by FLOPs."""


def for_class(values: Mapping[OpClass, T], op: OpClass) -> T | None:
    """``values[op]``, or for the optimizer step and transcendental kernels what element-wise
    work has."""
    if op in values:
        return values[op]
    return values.get(OpClass.ELEMENTWISE) if op in MEMORY_BOUND else None


@dataclass(frozen=True, slots=True)
class EfficiencyCurve:
    """Piecewise log-linear ``size -> fraction`` (size: FLOPs for compute ops, bytes for
    memory-bound ops); flat beyond the end points."""

    sizes: tuple[float, ...]
    fractions: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.fractions) or not self.sizes:
            raise SpecError("efficiency", "a curve needs as many fractions as sizes, at least one")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])):
            raise SpecError("efficiency", f"sizes must increase strictly, got {self.sizes}")
        if any(not 0 < f <= 1.5 for f in self.fractions):
            raise SpecError("efficiency", f"fractions must lie in (0, 1.5], got {self.fractions}")

    def __call__(self, size: float) -> float:
        if size <= self.sizes[0]:
            return self.fractions[0]
        if size >= self.sizes[-1]:
            return self.fractions[-1]
        i = bisect.bisect_right(self.sizes, size)
        x0, x1 = math.log(self.sizes[i - 1]), math.log(self.sizes[i])
        f0, f1 = self.fractions[i - 1], self.fractions[i]
        return f0 + (f1 - f0) * (math.log(size) - x0) / (x1 - x0)

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "fractions": list(self.fractions)}

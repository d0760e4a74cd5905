"""Compute times of an imported trace: what was measured, re-timed for the target device.

An op recorded on one device and simulated on another takes its measured time multiplied by
the ratio of the two devices' modelled times for the op's kernels (``ComputeModel``: the
calibrated or catalog rate of each op class at the op's shapes), so a GEMM moves with the
matmul rates and a norm with the memory bandwidths. Ops with no kernels (host gaps: framework
overhead between operators) keep their measured time, except between two CPU devices, where the
host is the device and they move with the ratio of its vector FLOP rates. Ops without a
measurement are timed by the target model as usual.
"""

from __future__ import annotations

from clustersim.hardware_specs import DeviceKind
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.workloads.trace import ComputeOp


class RetimedCompute:
    """``ComputeCost`` for traces whose ops carry ``measured_s`` (recorded on ``source``)."""

    def __init__(self, target: ComputeModel, source: ComputeModel | None):
        self.target, self.source = target, source
        both_cpu = (source is not None and source.device.kind is DeviceKind.CPU
                    and target.device.kind is DeviceKind.CPU)
        self.host_ratio = source.vector_peak / target.vector_peak if both_cpu else 1.0
        """Time factor of host work: the host is the device only on CPUs."""

    def ratio(self, op: ComputeOp) -> float:
        """Target time over source time of the op's kernels (1 with no source)."""
        if self.source is None:
            return 1.0
        if not op.kernels:
            return self.host_ratio
        return self.target.kernels_time(op.kernels) / self.source.kernels_time(op.kernels)

    def op_time(self, op: ComputeOp) -> float:
        if op.measured_s is None:
            return self.target.op_time(op)
        return op.measured_s * self.ratio(op)

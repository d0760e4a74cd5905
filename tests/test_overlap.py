"""Compute and communication that share a device: the engine stretches only the overlapping
part of a compute op, whichever started first, and calibration measures the slowdowns."""

import pytest

from clustersim.simulator import SimulationOptions, StepSimulation
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.network import Algorithm, NetworkModel, Plan, Protocol
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, GroupSet, Phase, Program, Stream, Trace,
)

from clustersim.analysis.calibration.fit import overlap_slowdowns
from clustersim.hardware_specs.measured_comm import AlphaBeta, CommOp

MS = 1e-3


class NamedTimes(ComputeModel):
    """Compute ops take the milliseconds their name ends with (``c0:10`` takes 10 ms)."""

    def op_time(self, op):
        return float(op.name.split(":")[1]) * MS


class FixedTransfer(NetworkModel):
    """Every collective moves data for ``transfer_ms`` (no latency term)."""

    def __init__(self, cluster, transfer_ms):
        super().__init__(cluster)
        self.plan_ = Plan(Algorithm.DIRECT, Protocol.SIMPLE, 0.0, transfer_ms * MS, ())

    def plan(self, kind, nbytes, instances, routing=None):
        return self.plan_


def _trace(*ops) -> Trace:
    program = Program("stage0", (0, 1), tuple(ops))
    return Trace(world_size=2, programs=(program,),
                 group_sets={"dp": GroupSet("dp", ((0, 1),))})


def _compute(i, name, deps=()):
    return ComputeOp(i, name, Phase.FORWARD, (), deps)


def _all_reduce(i, deps):
    return CollectiveOp(i, "grad_all_reduce", CollectiveKind.ALL_REDUCE, 1e6, "dp", Stream.DP,
                        deps)


def _run(catalog, trace, slowdown, transfer_ms=4.0, comm_slowdown=0.0):
    cluster = catalog.cluster(device="h100-sxm", num_devices=2)
    options = SimulationOptions(compute_slowdown_when_overlapped=slowdown,
                                comm_slowdown_when_overlapped=comm_slowdown)
    return StepSimulation(trace, cluster, options, compute=NamedTimes(cluster.device),
                          network=FixedTransfer(cluster, transfer_ms)).run()


def _ends(result):
    return {r.name: round(r.end / MS, 9) for r in result.records if r.stream == "compute"}


def test_compute_slows_only_while_the_transfer_moves_data(catalog):
    """A 4 ms transfer starts with a 10 ms op; at slowdown 1 the op runs at half speed for the
    4 ms, so it ends 2 ms late (not 10 ms late, as stretching the whole op would)."""
    trace = _trace(_compute(0, "c0:10"), _all_reduce(1, (0,)), _compute(2, "c1:10", (0,)),
                   _compute(3, "c2:1", (1, 2)))
    assert _ends(_run(catalog, trace, 1.0)) == {"c0:10": 10, "c1:10": 22, "c2:1": 23}
    assert _ends(_run(catalog, trace, 0.0)) == {"c0:10": 10, "c1:10": 20, "c2:1": 21}


def test_ops_that_start_during_the_transfer_share_its_window(catalog):
    """1 ms and then 10 ms of compute during [10, 14] ms at half speed: 2 ms of work gets done
    in the window, so the compute ends at 10 + 4 + 9 = 23 ms."""
    trace = _trace(_compute(0, "c0:10"), _all_reduce(1, (0,)), _compute(2, "c1:1", (0,)),
                   _compute(3, "c2:10", (2,)), _compute(4, "c3:0", (1, 3)))
    ends = _ends(_run(catalog, trace, 1.0))
    assert ends["c1:1"] == pytest.approx(12) and ends["c2:10"] == pytest.approx(23)


def test_a_transfer_outlasting_the_op_stretches_the_op_alone(catalog):
    """A 30 ms transfer over a 10 ms op at slowdown 0.5: the whole op runs 1.5x slower."""
    trace = _trace(_compute(0, "c0:10"), _all_reduce(1, (0,)), _compute(2, "c1:10", (0,)),
                   _compute(3, "c2:1", (1, 2)))
    ends = _ends(_run(catalog, trace, 0.5, transfer_ms=30.0))
    assert ends["c1:10"] == pytest.approx(25) and ends["c2:1"] == pytest.approx(41)


def test_slowdowns_from_an_all_reduce_during_gemms():
    """GEMMs that lose 40% of an overlapped transfer's time ran at 1/(1 + 2/3) speed; a
    transfer that took 1.5x its fitted time while they ran stretched by 0.5."""
    fit = AlphaBeta(latency_s=0.0, bandwidth=1e9)
    rows = [{"kind": "overlap", "op": "all_reduce", "world": 2, "bytes": b,
             "transfer_s": 1.5 * b / 1e9, "extra_s": 0.4 * 1.5 * b / 1e9}
            for b in (1 << 20, 1 << 24)]
    compute, comm = overlap_slowdowns(rows, {CommOp.ALL_REDUCE: fit})
    assert compute == pytest.approx(2 / 3) and comm == pytest.approx(0.5)
    assert overlap_slowdowns(rows, {}) is None and overlap_slowdowns([], {CommOp.ALL_REDUCE: fit}) is None

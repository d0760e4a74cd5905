"""Traces whose dispatcher kernels hold SMs (DeepEP, HybridEP) ride the folded replay: only the
collectives that hold SMs and the compute they may overlap run as SimPy events, and every op of
every class starts and ends at the same float as in the replay with an event per op."""

from __future__ import annotations

import pytest

from clustersim.analysis.config import load_config
from clustersim.analysis.step import simulation_options
from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.engine import NetworkMode
from clustersim.simulator.held_overlap import ops_beside_held
from clustersim.workloads import Job, Schedule, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.dispatch import Dispatcher
from clustersim.workloads.model import from_mapping
from clustersim.workloads.trace import ComputeOp

from tests.test_a2a_overlap import SMALL_MOE
from tests.test_dispatcher_sms import _dispatch
from tests.test_engine_log import compute
from tests.test_folding import _assert_identical, _both


def test_only_compute_between_a_held_collectives_inputs_and_users_is_beside_it():
    """c0 feeds the dispatch and c3 waits for it: only c1 and c2 (on the compute stream between
    them) can run while it holds SMs."""
    ops = (compute(0, "c0:1"), _dispatch(1, (0,), 20), compute(2, "c1:1", (0,)),
           compute(3, "c2:1", (2,)), compute(4, "c3:1", (1, 3)), compute(5, "c4:1", (4,)))
    assert ops_beside_held(ops) == {1, 2, 3}
    no_sms = ops[:1] + (_dispatch(1, (0,), 0),) + ops[2:]
    assert ops_beside_held(no_sms) == frozenset()


def _moe_job(schedule: Schedule, *, pp: int, v: int = 1, sms: int = 0) -> Job:
    strategy = Strategy(dp=8, pp=pp, ep=8, virtual_stages=v, schedule=schedule,
                        ep_dispatcher=Dispatcher.DEEPEP, ep_dispatcher_sms=sms,
                        moe_a2a_overlap=v > 1)
    return Job(from_mapping(SMALL_MOE), TrainingSpec(seq_len=2048, global_batch=8 * 8),
               strategy).checked(8 * pp)


@pytest.mark.parametrize("sms", [0, 32], ids=["default-sms", "32-sms"])
@pytest.mark.parametrize("schedule, pp, v", [(Schedule.ONE_F_ONE_B, 2, 1),
                                             (Schedule.INTERLEAVED, 2, 2),
                                             (Schedule.DUALPIPE, 2, 1)],
                         ids=["1f1b", "interleaved-a2a-overlap", "dualpipe"])
@pytest.mark.parametrize("network", list(NetworkMode), ids=lambda m: m.value)
def test_held_sms_fold_the_same_bit_for_bit(catalog, sms, schedule, pp, v, network):
    cluster = catalog.cluster(device="h100-sxm", num_devices=8 * pp)
    trace = build_trace(_moe_job(schedule, pp=pp, v=v, sms=sms))
    options = SimulationOptions(network=network)
    assert StepSimulation(trace, cluster, options).held
    _assert_identical(*_both(trace, cluster, options))


def test_dualpipe_overlaps_compute_with_held_dispatches(catalog):
    """The case the folding must get right is there: DualPipe runs one micro-batch's compute
    beside the other's dispatch and combine, 1F1B runs none beside them."""
    def beside(schedule):
        trace = build_trace(_moe_job(schedule, pp=2))
        return sum(isinstance(p.ops[i], ComputeOp) for p in trace.programs
                   for i in ops_beside_held(p.ops))
    assert beside(Schedule.DUALPIPE) > 0
    assert beside(Schedule.ONE_F_ONE_B) == 0


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.DUALPIPE],
                         ids=lambda s: s.value)
def test_faulted_ranks_with_held_sms_fold_the_same(catalog, schedule):
    """A straggler and a slow NIC split classes: their compute beside a dispatch still folds
    to the same floats."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(_moe_job(schedule, pp=2))
    faults = Faults(compute_slowdown={3: 1.3}, nic_slowdown={9: 2.0})
    _assert_identical(*_both(trace, cluster, faults=faults))


def test_an_expanded_held_sms_step_folds_to_the_collapsed_step_time(catalog):
    """Expanded (a class per rank, since lanes do not follow held SMs), the folded replay
    gives the collapsed step time with half the events of an event per op."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(_moe_job(Schedule.ONE_F_ONE_B, pp=2))
    collapsed = StepSimulation(trace, cluster).run()
    folded, evented = (StepSimulation(trace, cluster, SimulationOptions(expand=True), fold=fold)
                       .run() for fold in (None, False))
    assert len(folded.classes) == 16
    assert folded.step_time_s == evented.step_time_s == collapsed.step_time_s
    assert 2 * folded.events < evented.events


@pytest.mark.slow
def test_deepseek_v3_example_folds_the_same():
    cfg = load_config("deepseek_v3_h800")
    _assert_identical(*_both(build_trace(cfg.job), cfg.cluster, simulation_options(cfg)))


def test_a_trace_folds_by_default_unless_most_compute_is_beside_held_collectives(catalog):
    """1F1B runs no compute beside its dispatches and folds; DualPipe runs most of it beside
    them, where one process per stream is the cheaper replay (both give the same times)."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    folds = {schedule: StepSimulation(build_trace(_moe_job(schedule, pp=2)), cluster).fold
             for schedule in (Schedule.ONE_F_ONE_B, Schedule.DUALPIPE)}
    assert folds == {Schedule.ONE_F_ONE_B: True, Schedule.DUALPIPE: False}

"""The folded replay (ops that share nothing cost no SimPy event) against the replay with an
event per op: every op of every class starts and ends at the same float, bit for bit."""

from __future__ import annotations

import pytest

from clustersim.analysis.config import load_cnn_config, load_config
from clustersim.analysis.step import simulation_options
from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.engine import NetworkMode
from clustersim.workloads.builder import build_trace
from clustersim.workloads.cnn.builder import build_cnn_trace

from tests.conftest import tiny_job
from tests.test_engine import STRATEGIES


def _both(trace, cluster, options=SimulationOptions(), faults=Faults()):
    return [StepSimulation(trace, cluster, options, faults, fold=fold).replay()
            for fold in (True, False)]


def _assert_identical(folded, evented):
    assert len(folded.timelines) == len(evented.timelines)
    for a, b in zip(folded.timelines, evented.timelines):
        assert a.end_s == b.end_s and a.ready_s == b.ready_s   # ==, not approx
        assert a.send_posted_s == b.send_posted_s
        assert a.records == b.records
    assert folded.events < evented.events


@pytest.mark.parametrize("strategy", STRATEGIES,
                         ids=lambda s: f"tp{s.tp}pp{s.pp}dp{s.dp}cp{s.cp}z{s.zero}")
@pytest.mark.parametrize("network", list(NetworkMode), ids=lambda m: m.value)
def test_folded_and_event_per_op_replays_are_the_same_bit_for_bit(catalog, strategy, network):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(tiny_job(strategy, global_batch=16))
    _assert_identical(*_both(trace, cluster, SimulationOptions(network=network)))


def test_faulted_ranks_fold_the_same(catalog):
    """A straggler, a slow NIC, a slow host and late input split classes and stretch times."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(tiny_job(STRATEGIES[0], global_batch=16))
    faults = Faults(compute_slowdown={3: 1.3}, nic_slowdown={9: 2.0}, link_slowdown={12: 1.2},
                    launch_overhead_s={5: 2e-4}, input_stall_s={0: 0.01})
    _assert_identical(*_both(trace, cluster, faults=faults))


@pytest.mark.parametrize("example", ["llama3_8b_fsdp", "llama3_8b_subnetworks",
                                     "moe_fabric_contention", "moe_fabric_contention_rail"])
def test_examples_fold_the_same(example):
    cfg = load_config(example)
    _assert_identical(*_both(build_trace(cfg.job), cfg.cluster, simulation_options(cfg)))


def test_a_3d_cnn_folds_the_same():
    cfg = load_cnn_config("cosmoflow_a100")
    _assert_identical(*_both(build_cnn_trace(cfg.job), cfg.cluster, simulation_options(cfg)))


def test_interference_runs_every_op_as_events(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(tiny_job(STRATEGIES[0], global_batch=16))
    options = SimulationOptions(comm_slowdown_when_overlapped=0.2)
    assert not StepSimulation(trace, cluster, options).fold

"""Expanded runs follow every rank's clock as lanes of the collapsed classes (simulator/lanes.py).

References: the collapsed run with its fault-split classes, and the slow per-rank expansion (one
SimPy class per rank, ``lanes=False``), whose rank-by-rank agreement with the collapse is itself
tested in tests/test_engine.py and tests/property/test_invariants.py.
"""

import numpy as np
import pytest

from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.engine import NetworkMode
from clustersim.workloads import Schedule, Strategy
from clustersim.workloads.builder import build_trace

from tests.conftest import tiny_job

STRATEGIES = [
    Strategy(tp=2, pp=4, dp=8, sequence_parallel=True, zero=1),
    Strategy(tp=4, pp=4, dp=4, schedule=Schedule.INTERLEAVED, virtual_stages=2),
    Strategy(tp=2, pp=2, dp=8, cp=2, zero=1),
]
IDS = ["tp2pp4dp8", "tp4pp4dp4-interleaved", "tp2pp2dp8cp2"]
STRAGGLER = Faults(compute_slowdown={5: 1 / 0.7})
"""Rank 5 computes at 0.7x speed."""
DEGRADED_LINK = Faults(link_slowdown={3: 2.0})


def _setup(catalog, strategy):
    cluster = catalog.cluster(device="h100-sxm", num_devices=strategy.world_size)
    return build_trace(tiny_job(strategy, global_batch=4 * strategy.dp)), cluster


def _run(trace, cluster, network, faults=Faults(), expand=True, lanes=True):
    options = SimulationOptions(network=network, expand=expand, record=False)
    return StepSimulation(trace, cluster, options, faults, lanes=lanes).run()


def _every_rank_different(world: int, seed: int = 7) -> Faults:
    rng = np.random.default_rng(seed)
    return Faults(compute_slowdown={r: 1.0 + 0.1 * float(x) for r, x in enumerate(rng.random(world))},
                  link_slowdown={r: 1.0 + 0.5 * (r % 3) for r in range(world)})


def _flat(breakdown) -> dict[str, float]:
    parts = breakdown.to_dict()
    return {k: v for k, v in parts.items() if k != "exposed_comm_s"} | parts["exposed_comm_s"]


@pytest.mark.parametrize("network", list(NetworkMode), ids=lambda n: n.value)
@pytest.mark.parametrize("faults", [Faults(), STRAGGLER, DEGRADED_LINK],
                         ids=["healthy", "straggler", "degraded-link"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=IDS)
def test_expanded_gives_the_step_time_of_the_collapsed_split(catalog, strategy, faults, network):
    trace, cluster = _setup(catalog, strategy)
    collapsed = _run(trace, cluster, network, faults, expand=False)
    expanded = _run(trace, cluster, network, faults)
    assert expanded.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12, abs=0.0)
    assert len(expanded.rank_finish_s) == strategy.world_size
    assert expanded.rank_finish_s.max() == expanded.step_time_s
    if not faults.ranks():   # every rank of a class finishes with its class
        finish = {c.index: c.finish_s for c in collapsed.classes}
        assert [finish[c.index] for c in expanded.classes] == [c.finish_s for c in expanded.classes]


HOST_AND_LINK_FAULTS = {
    "nic": Faults(nic_slowdown={1: 2.0}), "nvlink": Faults(nvlink_slowdown={2: 3.0}),
    "slow-launches": Faults(launch_overhead_s={3: 2e-4}), "late-input": Faults(input_stall_s={4: 2e-3}),
    "all": Faults(compute_slowdown={3: 1.4}, link_slowdown={1: 2.0}, nic_slowdown={5: 1.5},
                  nvlink_slowdown={2: 2.0}, launch_overhead_s={6: 1e-4}, input_stall_s={0: 1e-3}),
}


@pytest.mark.parametrize("network", list(NetworkMode), ids=lambda n: n.value)
@pytest.mark.parametrize("name", list(HOST_AND_LINK_FAULTS))
def test_nic_nvlink_and_host_faults_give_the_collapsed_split_step_time(catalog, name, network):
    """A NIC or NVLink at a fraction of its bandwidth stretches only its part of a transfer; a
    slow host floors each compute op at its kernels' launches; late input delays the compute
    stream's start. The lanes follow each rank's own."""
    trace, cluster = _setup(catalog, STRATEGIES[0])
    faults = HOST_AND_LINK_FAULTS[name]
    collapsed = _run(trace, cluster, network, faults, expand=False)
    expanded = _run(trace, cluster, network, faults)
    assert expanded.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12, abs=0.0)
    if network is NetworkMode.ANALYTIC:
        per_rank = _run(trace, cluster, network, faults, lanes=False)
        finish = {c.representative: c.finish_s for c in per_rank.classes}
        assert expanded.rank_finish_s.tolist() == pytest.approx(
            [finish[r] for r in range(len(finish))], rel=1e-12, abs=0.0)


def test_a_mixed_cluster_runs_as_lanes_at_each_device_own_rates():
    """16 A100 and 16 H100 (cluster.groups), uneven samples per replica: each lane computes
    at its own device's rates."""
    from tests.test_mixed_cluster import A100, H100, config
    cfg = config([(A100, 16), (H100, 16)], replica_batch=[10, 10, 22, 22])
    trace = build_trace(cfg.job)
    for faults in (Faults(), STRAGGLER):
        collapsed = _run(trace, cfg.cluster, NetworkMode.FLOW, faults, expand=False)
        sim = StepSimulation(trace, cfg.cluster, SimulationOptions(expand=True, record=False),
                             faults)
        assert sim.lanes is not None
        assert sim.run().step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("strategy", STRATEGIES[:2], ids=IDS[:2])
def test_under_the_analytic_model_every_rank_follows_the_per_rank_replay(catalog, strategy):
    """Every rank slower by its own factor and every third link degraded: each rank's finish,
    and the breakdown of each class's slowest rank, are those of one class per rank."""
    trace, cluster = _setup(catalog, strategy)
    faults = _every_rank_different(strategy.world_size)
    lanes = _run(trace, cluster, NetworkMode.ANALYTIC, faults)
    per_rank = _run(trace, cluster, NetworkMode.ANALYTIC, faults, lanes=False)
    by_rank = {c.representative: c for c in per_rank.classes}
    assert lanes.rank_finish_s.tolist() == pytest.approx(
        [by_rank[r].finish_s for r in range(strategy.world_size)], rel=1e-12, abs=0.0)
    for c in lanes.classes:
        assert c.finish_s == by_rank[c.representative].finish_s
        assert _flat(c.breakdown) == pytest.approx(_flat(by_rank[c.representative].breakdown),
                                                   rel=1e-9, abs=1e-15)


@pytest.mark.slow
def test_under_the_flow_model_ranks_that_differ_stay_within_one_percent(catalog):
    """The flow model shares a class's links once, at its latest rank (lanes.py): with every
    rank different, that approximation stays within 1% of one class per rank."""
    strategy = STRATEGIES[0]
    trace, cluster = _setup(catalog, strategy)
    faults = _every_rank_different(strategy.world_size)
    lanes = _run(trace, cluster, NetworkMode.FLOW, faults)
    per_rank = _run(trace, cluster, NetworkMode.FLOW, faults, lanes=False)
    assert lanes.step_time_s == pytest.approx(per_rank.step_time_s, rel=0.01)
    finish = np.array([c.finish_s for c in sorted(per_rank.classes, key=lambda c: c.representative)])
    assert np.abs(lanes.rank_finish_s - finish).max() < 0.01 * per_rank.step_time_s


def test_interference_expands_one_class_per_rank(catalog):
    """Compute and transfers slowing each other down is per-device state: one class per rank."""
    strategy = Strategy(tp=2, pp=2, dp=2)
    trace, cluster = _setup(catalog, strategy)
    options = SimulationOptions(expand=True, record=False, comm_slowdown_when_overlapped=0.3)
    assert options.one_class_per_rank(cluster.device)
    result = StepSimulation(trace, cluster, options).run()
    assert len(result.classes) == strategy.world_size and result.rank_finish_s is None


def test_the_json_names_the_slowest_rank(catalog):
    strategy = Strategy(tp=2, pp=2, dp=2)
    trace, cluster = _setup(catalog, strategy)
    result = _run(trace, cluster, NetworkMode.FLOW, Faults(compute_slowdown={6: 2.0}))
    ranks = result.to_dict()["ranks"]
    assert ranks["count"] == 8 and ranks["finish_s_max"] == result.step_time_s
    assert result.rank_finish_s[ranks["slowest_rank"]] == result.step_time_s
    assert ranks["finish_s_min"] < ranks["finish_s_median"] <= ranks["finish_s_max"]


def test_the_summary_names_the_ranks_clocks_and_the_slowest(catalog):
    from clustersim.analysis.reports.summary import simulated_line
    strategy = Strategy(tp=2, pp=2, dp=2)
    trace, cluster = _setup(catalog, strategy)
    expanded = _run(trace, cluster, NetworkMode.FLOW, Faults(compute_slowdown={6: 2.0}))
    line = simulated_line(expanded, 8)
    slowest = int(expanded.rank_finish_s.argmax())
    assert line.startswith(f"8 ranks on their own clocks as lanes of {len(expanded.classes)} rank")
    assert line.endswith(f"(slowest: rank {slowest})")
    collapsed = _run(trace, cluster, NetworkMode.FLOW, expand=False)
    assert simulated_line(collapsed, 8).startswith("2 rank classes for 8 GPUs")

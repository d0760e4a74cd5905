"""Heterogeneous clusters (``cluster.groups``): parsing with errors naming the field, each
group computing at its own device's rates, its own NICs and memory capacity."""

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.reports.mixed import overflow
from clustersim.analysis.step import run_step
from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.topology import LinkKind
from clustersim.simulator.cost.grouped import GroupedNetwork
from clustersim.simulator.cost.network import NetworkModel

A100, H100, A100_40 = "a100-80gb", "h100-sxm", "a100-40gb"


def config(groups=None, cluster=None, tp=8, dp=4, zero=1, **strategy):
    return config_from_mapping({
        "model": "llama3-8b",
        "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1},
        "strategy": {"tp": tp, "pp": 1, "dp": dp, "zero": zero, **strategy},
        "cluster": cluster or {"groups": [{"gpu": g, "num_gpus": n} for g, n in groups]}})


@pytest.mark.parametrize("cluster, match", [
    ({"gpu": [H100, A100], "num_gpus": 32}, r"cluster.gpu: expected one device name; for mixed "
                                            r"devices give cluster.groups"),
    ({"groups": [{"gpu": H100, "num_gpus": 32}]}, r"cluster.groups: expected two or more"),
    ({"gpu": H100, "groups": [{"gpu": H100, "num_gpus": 16}, {"gpu": A100, "num_gpus": 16}]},
     r"cluster.gpu: is set per group"),
    ({"groups": [{"gpu": H100, "num_gpus": 12}, {"gpu": A100, "num_gpus": 20}]},
     r"cluster.groups\[0\].num_gpus: 12 is not a whole number of dgx-h100 nodes"),
    ({"groups": [{"gpu": H100, "num_gpus": 16}, {"gpu": "h100-96gb", "num_gpus": 16}]},
     r"cluster.groups\[1\].node: jupiter-gh200 has 4 devices and 4 NICs per node, dgx-h100 "
     r"\(groups\[0\]\) 8 and 8"),
    ({"groups": [{"gpu": H100, "num_gpus": 16}, {"gpu": "a100", "num_gpus": 16}]},
     r"cluster.groups\[1\].gpu: unknown device 'a100'"),
])
def test_bad_groups_are_errors_naming_the_field(cluster, match):
    with pytest.raises(SpecError, match=match):
        config(cluster=cluster)


def test_groups_of_one_device_simulate_as_the_homogeneous_cluster():
    mixed = run_step(config([(H100, 16), (H100, 16)])).result
    plain = run_step(config(cluster={"gpu": H100, "num_gpus": 32})).result
    assert mixed.step_time_s == plain.step_time_s
    assert mixed.mfu == pytest.approx(plain.mfu, rel=1e-12)


def test_each_group_computes_at_its_own_rates():
    """Even data parallelism on 16 A100 + 16 H100: the A100 replicas are the critical ones and
    the step takes about what 32 A100 take; giving the H100 replicas more samples shortens it."""
    mixed = run_step(config([(A100, 16), (H100, 16)])).result
    a100 = run_step(config(cluster={"gpu": A100, "num_gpus": 32})).result
    h100 = run_step(config(cluster={"gpu": H100, "num_gpus": 32})).result
    assert h100.step_time_s < mixed.step_time_s
    assert mixed.step_time_s == pytest.approx(a100.step_time_s, rel=0.02)
    assert mixed.classes[mixed.critical_class].representative < 16     # an A100 rank
    balanced = run_step(config([(A100, 16), (H100, 16)], replica_batch=[10, 10, 22, 22]))
    assert balanced.result.step_time_s < 0.7 * mixed.step_time_s
    assert balanced.to_dict()["cluster"]["groups"] == [
        {"gpu": A100, "node": "dgx-a100", "num_gpus": 16},
        {"gpu": H100, "node": "dgx-h100", "num_gpus": 16}]


def test_nics_run_at_their_own_nodes_speed():
    """DGX A100: 8 x 200 Gb/s HDR; DGX H100: 8 x 400 Gb/s NDR (catalog nodes); a group-spanning
    transfer is planned with the slower node (``cluster.node``)."""
    cfg = config([(A100, 16), (H100, 16)])
    topology = GroupedNetwork(cfg.cluster, NetworkModel).topology
    a100_nic, h100_nic = topology.location(0).nic, topology.location(16).nic
    assert topology.capacity((LinkKind.NIC_TX, h100_nic)) == pytest.approx(
        2 * topology.capacity((LinkKind.NIC_TX, a100_nic)))
    assert cfg.cluster.node.name == "dgx-a100"


def test_a_group_whose_devices_are_too_small_says_so():
    """TP1 DP32 llama3-8b with ZeRO-1 needs about 55 GiB per device: it fits the H100s' 80 GiB,
    not the A100 40GB's."""
    cfg = config([(A100_40, 16), (H100, 16)], tp=1, dp=32)
    report = run_step(cfg)
    assert not report.result.fits_in_memory
    assert overflow(cfg.cluster, report.trace).startswith("stage0 on a100-40gb needs ")
    assert "h100" not in overflow(cfg.cluster, report.trace)
    assert run_step(config([(A100, 16), (H100, 16)], tp=1, dp=32)).result.fits_in_memory


def test_collapsed_and_expanded_runs_agree_on_a_mixed_cluster():
    """Rank classes split by device group give the step time of following every rank."""
    from clustersim.simulator import SimulationOptions

    cfg = config([(A100, 16), (H100, 16)], replica_batch=[10, 10, 22, 22])
    collapsed = run_step(cfg).result
    expanded = run_step(cfg, options=SimulationOptions(expand=True)).result
    assert len(collapsed.classes) == 2
    assert expanded.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-9)


def test_each_group_issues_eager_kernels_at_its_own_hosts_cost():
    """Eager kernels on a cluster whose second group's hosts issue each kernel in 2 ms (a
    host far slower than any measured, so the host, not the GPU, sets that group's pace):
    those ranks wait on their host, the fast group on them (data-parallel gradients), and
    the collapsed lanes give what following every rank gives."""
    from dataclasses import replace

    from clustersim.simulator import SimulationOptions, StepSimulation
    from clustersim.workloads.builder import build_trace

    cfg = config([(H100, 16), (H100, 16)], tp=8, dp=4, cuda_graphs="none")
    trace = build_trace(cfg.job)
    first, second = cfg.cluster.groups
    slow = replace(cfg.cluster, groups=(first, replace(
        second, node=replace(second.node, name="slow-host", eager_issue_s=2e-3))))

    def run(cluster, expand=False):
        return StepSimulation(trace, cluster, SimulationOptions(expand=expand)).run()
    fast, collapsed, expanded = run(cfg.cluster), run(slow), run(slow, expand=True)
    assert expanded.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-9)
    assert collapsed.step_time_s > 1.5 * fast.step_time_s
    waits = {c.representative >= 16: c.breakdown for c in collapsed.classes}
    assert waits[True].host_s > 0.3 * collapsed.step_time_s      # the slow-host group
    assert waits[False].host_s < 1e-3 < waits[False].exposed_comm_s["dp"]

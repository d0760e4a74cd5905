"""Several jobs on one fabric: their transfers share links max-min, as one job's do.

The fabric of the first tests is small enough to follow by hand: 8 DGX A100 nodes (8 GPUs, 8
HDR NICs of 200 Gb/s each) on a rail-optimised tree whose leaves have 5 ports, 4 down and 1 up
(4:1): a leaf serves one rail of 4 nodes, and its uplink carries one NIC's bandwidth.
"""

from __future__ import annotations

import textwrap

import pytest

from clustersim.hardware_specs import SpecError, load_catalog
from clustersim.hardware_specs.allocation import JobPlacement, allocate
from clustersim.hardware_specs.topology import LinkKind, Topology
from clustersim.simulator.cost.collectives import SINGLE_GPU_PER_NODE_EFFICIENCY
from clustersim.simulator.cost.network import NetworkModel
from clustersim.simulator.shared_fabric import FabricJob, simulate_shared
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, GroupSet, Phase, Program, Stream, Trace,
)

GRADIENTS = 2e9
"""Bytes of the all-reduce (1 B parameters in bf16)."""

SMALL_RAIL_FABRIC = textwrap.dedent("""\
    fabrics:
      tiny-rail-4to1:
        kind: rail_optimized
        source: a test fabric (5-port leaves, 4 down and 1 up)
        tiers:
          - {name: leaf, radix: 5, oversubscription: 4, latency: 130 ns}
          - {name: spine, radix: 64, oversubscription: 1, latency: 130 ns}
    """)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    folder = tmp_path_factory.mktemp("catalog")
    (folder / "tiny.yaml").write_text(SMALL_RAIL_FABRIC)
    return load_catalog([folder])


def dp_step(world: int, tp: int, reductions: int = 1) -> Trace:
    """``reductions`` data-parallel all-reduces of the gradients one after the other, then an
    optimizer op that waits for them (all of their time is exposed DP time), on TP groups of
    ``tp`` consecutive ranks."""
    dp_groups = tuple(tuple(range(i, world, tp)) for i in range(tp))
    ops = tuple(CollectiveOp(i, f"dp_all_reduce{i}", CollectiveKind.ALL_REDUCE, GRADIENTS, "dp",
                             Stream.DP, (i - 1,) if i else ()) for i in range(reductions))
    ops += (ComputeOp(reductions, "optimizer", Phase.OPTIMIZER, (), (reductions - 1,)),)
    return Trace(world_size=world, programs=(Program("stage0", tuple(range(world)), ops),),
                 group_sets={"dp": GroupSet("dp", dp_groups)}, model_flops=1e12, tokens=1000)


def jobs_on(catalog, placement: JobPlacement, reductions=(1, 1)):
    fabric = catalog.cluster(device="a100-80gb", num_devices=64, fabric="tiny-rail-4to1")
    per_node = fabric.devices_per_node
    out = []
    for i, alloc in enumerate(allocate((32, 32), per_node, 64, placement)):
        cluster = catalog.cluster(device="a100-80gb", num_devices=32, fabric="tiny-rail-4to1",
                                  devices_per_node=alloc.per_node)
        out.append(FabricJob(name=f"team-{'ab'[i]}",
                             trace=dp_step(32, alloc.per_node, reductions[i]),
                             cluster=cluster, devices=alloc.devices))
    return fabric, out


def test_the_placements_give_each_job_the_devices_they_say():
    packed = allocate((16, 16), 8, 64, JobPlacement.PACKED)
    assert [a.devices for a in packed] == [tuple(range(16)), tuple(range(16, 32))]
    scattered = allocate((16, 16), 8, 64, JobPlacement.SCATTERED)
    assert [a.devices for a in scattered] == [tuple(range(8)) + tuple(range(16, 24)),
                                              tuple(range(8, 16)) + tuple(range(24, 32))]
    rail = allocate((16, 16), 8, 64, JobPlacement.RAIL_ALIGNED)
    assert rail[0].devices == (0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
    assert rail[1].devices == tuple(d + 4 for d in rail[0].devices)
    assert {a.per_node for a in rail} == {4}


def test_a_placement_the_cluster_cannot_hold_names_the_job():
    with pytest.raises(SpecError, match=r"jobs\[1\]\.gpus: 12 is not a whole number of nodes"):
        allocate((16, 12), 8, 64, JobPlacement.SCATTERED)
    with pytest.raises(SpecError, match="the jobs need 80 GPUs; the cluster has 64"):
        allocate((64, 16), 8, 64, JobPlacement.PACKED)
    with pytest.raises(SpecError, match=r"jobs\[0\]\.gpus: 6 is not a multiple of the job's 4"):
        allocate((6, 8), 8, 64, JobPlacement.RAIL_ALIGNED)


def test_scattered_rings_share_the_4to1_uplinks_and_each_gets_half(catalog):
    """Scattered, team A has nodes 0, 2, 4, 6 and team B nodes 1, 3, 5, 7. Each job's 8 DP
    rings (one per GPU position, one rail each) leave leaf group {0-3} once (2->4 for A, 3->5
    for B) and group {4-7} once: on every rail the leaf uplink carries 1 x the ring volume V
    of each job, the same bytes as the NIC of that rail on the sending node; the uplink has one
    NIC's capacity c. Alone, the NIC and the uplink are equally busy: the network part takes
    V / (0.75 c) (a lone GPU per node drives 0.75 of its NIC). Together, two transfers cross
    each uplink, and max-min gives each half: twice that. The job's exposed DP time (the
    optimizer waits for the whole all-reduce) grows by V / (0.75 c)."""
    fabric, jobs = jobs_on(catalog, JobPlacement.SCATTERED)
    result = simulate_shared(jobs, fabric)
    topology = Topology(fabric)
    c = topology.nic_capacity
    assert topology.leaf_capacity == pytest.approx(c)     # 4 nodes x c / 4
    volume = 2 * (4 - 1) / 4 * GRADIENTS                  # ring all-reduce over 4 ranks
    network = NetworkModel(fabric)
    instances = tuple(tuple(jobs[0].devices[r] for r in range(i, 32, 8)) for i in range(8))
    plan = network.plan(CollectiveKind.ALL_REDUCE, GRADIENTS, instances)
    # One GPU per node in a DP group: a ring drives its NIC at 0.75 of the line rate
    # (SINGLE_GPU_PER_NODE_EFFICIENCY, collectives.py), on the NIC and on the uplink alike.
    alone_network = volume / (SINGLE_GPU_PER_NODE_EFFICIENCY * c)
    assert plan.network_s(topology) == pytest.approx(alone_network, rel=1e-9)
    assert plan.intra_s < alone_network                   # one GPU per node: no NVLink part
    for outcome in result.jobs:
        alone = outcome.alone.breakdown.exposed_comm_s["dp"]
        together = outcome.together.breakdown.exposed_comm_s["dp"]
        assert alone == pytest.approx(plan.latency_s + alone_network, rel=1e-6)
        assert together == pytest.approx(plan.latency_s + 2 * alone_network, rel=1e-6)
        assert together - alone == pytest.approx(alone_network, rel=1e-6)
    hottest = result.hot_links[0]
    assert hottest.kind == "leaf_up" and set(hottest.jobs) == {"team-a", "team-b"}
    assert result.shared_links == 2 * 8 * 2               # up and down, 8 rails, 2 leaf groups


def test_a_shorter_job_keeps_stepping_while_the_longer_one_runs(catalog):
    """Team A reduces once per step, team B twice, over the same shared uplinks (scattered).
    Their first reductions share the uplinks: each takes lat + 2N (N: the network time alone).
    A's step ends there and its next step starts at once, so B's second reduction shares the
    uplinks with A's next one: lat + 2N again. B: 2 lat + 4N against 2 lat + 2N alone (it
    loses 2N); A: lat + 2N against lat + N (it loses N)."""
    fabric, jobs = jobs_on(catalog, JobPlacement.SCATTERED, reductions=(1, 2))
    result = simulate_shared(jobs, fabric)
    a, b = result.jobs
    n = a.together.step_time_s - a.alone.step_time_s
    assert n > 0.05
    assert b.alone.step_time_s == pytest.approx(2 * a.alone.step_time_s, rel=1e-9)
    assert b.lost_s == pytest.approx(2 * n, rel=1e-6)
    assert b.together.breakdown.exposed_comm_s["dp"] - b.alone.breakdown.exposed_comm_s["dp"] \
        == pytest.approx(2 * n, rel=1e-6)


def test_rail_aligned_jobs_never_meet_and_lose_nothing(catalog):
    """Rail-aligned, team A runs on GPUs 0-3 of every node and team B on GPUs 4-7: A's rings
    ride rails 0-3, B's rails 4-7, each rail its own leaves, so no link carries both and every
    number is the same as alone."""
    fabric, jobs = jobs_on(catalog, JobPlacement.RAIL_ALIGNED)
    result = simulate_shared(jobs, fabric)
    assert result.shared_links == 0
    for outcome in result.jobs:
        assert outcome.together.step_time_s == outcome.alone.step_time_s
        assert outcome.together.breakdown == outcome.alone.breakdown
        assert outcome.lost_s == 0.0
    a_rails = {Topology(fabric).location(d).rail for d in jobs[0].devices}
    assert a_rails == {0, 1, 2, 3}
    assert all(l.kind != LinkKind.POD_UP.name.lower() for l in result.hot_links)


def test_a_job_alone_on_the_shared_fabric_is_the_one_job_engine(catalog):
    """One job through the shared driver is the plain engine's step (same devices)."""
    from clustersim.simulator import StepSimulation
    fabric, jobs = jobs_on(catalog, JobPlacement.PACKED)
    shared = simulate_shared(jobs[:1], fabric).jobs[0]
    plain = StepSimulation(jobs[0].trace, jobs[0].cluster).run()
    assert shared.together.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)
    assert shared.lost_s == 0.0


def test_two_jobs_on_one_device_are_an_error(catalog):
    fabric, jobs = jobs_on(catalog, JobPlacement.PACKED)
    clash = [jobs[0], FabricJob(name="team-c", trace=jobs[1].trace, cluster=jobs[1].cluster,
                                devices=jobs[0].devices)]
    with pytest.raises(SpecError, match="team-c: device 0 is also team-a's"):
        simulate_shared(clash, fabric)


def test_the_example_loses_only_when_scattered_and_compare_varies_the_placement():
    """The bundled example from the command line: packed, each team has racks of its own and
    loses nothing; scattered, both lose the same time, all of it exposed DP time."""
    from clustersim.analysis.sweeps.compare import compare
    rows = compare(["shared_fabric_4to1"], ["placement=packed,scattered"])
    by = {(r["placement"], r["name"].rsplit(" / ", 1)[1]): r for r in rows}
    assert set(by) == {(p, t) for p in ("packed", "scattered") for t in ("team_a", "team_b")}
    for team in ("team_a", "team_b"):
        assert by[("packed", team)]["lost_s"] == 0.0
        assert by[("scattered", team)]["lost_s"] > 0.01
        assert by[("scattered", team)]["alone_step_time_s"] == \
            by[("packed", team)]["alone_step_time_s"]


def test_a_bad_job_field_names_the_job(tmp_path, capsys):
    from clustersim.analysis.cli.main import main
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        cluster: {gpu: a100-80gb, num_gpus: 32, fabric: fat-tree-hdr-4to1}
        placement: scattered
        jobs:
          - {gpus: 16, model: llama3-8b, training: {seq_len: 4096, global_batch: 16},
             strategy: {dp: 16}}
          - {gpus: 16, model: llama3-8b, training: {seq_len: 4096, global_batch: 16},
             strategy: {dp: 16, tp_size: 2}}
        """))
    assert main(["simulate", str(bad)]) == 2
    assert "jobs[1].strategy.tp_size: unknown field" in capsys.readouterr().err
    bad.write_text(bad.read_text().replace("placement: scattered", "placement: spread"))
    assert main(["simulate", str(bad)]) == 2
    assert "placement" in capsys.readouterr().err

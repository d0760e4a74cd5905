"""Collective costs against published nccl-tests runs, and the flow model's contention."""

import csv
import re

import pytest

from clustersim.analysis.validation.collectives import measure
from clustersim.hardware_specs import Placement
from clustersim.hardware_specs.topology import LinkKind, Topology
from clustersim.simulator.cost.collectives import Algorithm, Protocol
from clustersim.simulator.cost.network import NetworkModel
from clustersim.workloads.trace import CollectiveKind

from tests.conftest import REPO

ROWS = list(csv.DictReader((REPO / "analysis/data/collectives_dev.csv").open()))
AZURE = [r for r in ROWS if "mscclpp" in r["source"] and r["busbw_gbps"]]
SWEEP = [r for r in ROWS if "stas00" in r["source"]]


def _predict(catalog, row):
    gpus, nodes = int(row["gpus"]), int(row["nodes"])
    cluster = catalog.cluster(device="a100-80gb", num_devices=gpus, devices_per_node=gpus // nodes)
    launch = re.search(r"-g (\d+)", row["collective"])   # nccl-tests: one thread, -g GPUs
    return measure(cluster, row["collective"].split()[0], gpus, float(row["message_bytes"]),
                   gpus_per_thread=int(launch.group(1)) if launch else 1)


@pytest.mark.parametrize("row", AZURE, ids=lambda r: f"{r['collective'].split()[0]}-{r['gpus']}g{r['nodes']}n-{r['message_bytes']}")
def test_busbw_within_15_percent_of_azure_ndm_a100_nccl_tests(catalog, row):
    predicted = _predict(catalog, row).busbw_gbps
    assert predicted == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


@pytest.mark.parametrize("row", [r for r in SWEEP if int(r["message_bytes"]) >= 512 * 2**20],
                         ids=lambda r: r["message_bytes"])
def test_large_all_reduce_busbw_within_15_percent_of_the_8_gpu_sweep(catalog, row):
    predicted = _predict(catalog, row).busbw_gbps
    assert predicted == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


@pytest.mark.parametrize("row", [r for r in SWEEP if int(r["message_bytes"]) <= 4 * 2**20],
                         ids=lambda r: r["message_bytes"])
def test_small_all_reduce_of_the_8_gpu_sweep_is_one_thread_launching_eight_gpus(catalog, row):
    """``all_reduce_perf -g 8``: one thread launches eight kernels per iteration, each with
    NCCL's per-channel work, so up to 4 MiB the host loop sets the time (flat at ~100 us once
    all 24 channels are in use); within 15% from 1 MiB, 30% below."""
    predicted = _predict(catalog, row).busbw_gbps
    tolerance = 0.15 if int(row["message_bytes"]) >= 2**20 else 0.3
    assert predicted == pytest.approx(float(row["busbw_gbps"]), rel=tolerance)


MID = [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=(
    "16 MiB: +34% busbw. NCCL's tuner picks LL128 here, which has no direct mode, so the "
    "single-process cost does not apply; the -g 8 runs of other machines are 26-42% slower "
    "than the model at 8-16 MiB as well")))
       if r["message_bytes"] == str(16 * 2**20) else r
       for r in SWEEP if 8 * 2**20 <= int(r["message_bytes"]) <= 256 * 2**20]


@pytest.mark.parametrize("row", MID, ids=lambda r: r["message_bytes"])
def test_mid_size_all_reduce_of_the_8_gpu_sweep(catalog, row):
    """8 to 256 MiB: NVLink3's measured Simple step (7 us) and LL128 rate (0.76 of the link),
    plus the Simple protocol's direct-pointer cost of one process driving all GPUs."""
    assert _predict(catalog, row).busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


A100_SWEEPS = list(csv.DictReader((REPO / "analysis/data/collectives_a100_sweeps.csv").open()))
ONE_PROCESS_PER_GPU = [r for r in A100_SWEEPS if "-g 1" in r["collective"]
                       and int(r["message_bytes"]) >= 2**20]
ONE_PROCESS_SIMPLE = [r for r in A100_SWEEPS if "-g 1" not in r["collective"]
                      and int(r["message_bytes"]) >= 32 * 2**20]


def _a100(catalog, row, gpus_per_thread):
    device = "a100-40gb" if "40GB" in row["system"] else "a100-80gb"
    cluster = catalog.cluster(device=device, num_devices=8, devices_per_node=8)
    return measure(cluster, "all_reduce", 8, float(row["message_bytes"]),
                   gpus_per_thread=gpus_per_thread)


@pytest.mark.parametrize("row", ONE_PROCESS_PER_GPU,
                         ids=lambda r: f"{r['source'][:12]}-{r['message_bytes']}")
def test_a100_sweeps_with_one_process_per_gpu_within_15_percent_from_1_mib(catalog, row):
    """Two machines (NCCL 2.16 on Azure, and another): the data NVLink3's measured Simple step
    and LL128 rate come from."""
    assert _a100(catalog, row, 1).busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


@pytest.mark.parametrize("row", ONE_PROCESS_SIMPLE,
                         ids=lambda r: f"{r['source'][:12]}-{r['message_bytes']}")
def test_a100_sweeps_of_one_process_driving_8_gpus_from_32_mib(catalog, row):
    """The single-process Simple cost is the median gap of one machine's two sweeps; the DGX
    A100 40GB sweep (Hetu-Galvatron) is the independent check."""
    assert _a100(catalog, row, 8).busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


P5 = list(csv.DictReader((REPO / "analysis/data/collectives_h100_p5.csv").open()))


def _p5(catalog, row):
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    return measure(cluster, "all_reduce", 8, float(row["message_bytes"]))


@pytest.mark.parametrize("row", [r for r in P5 if int(r["message_bytes"]) >= 2**20],
                         ids=lambda r: r["message_bytes"])
def test_all_reduce_within_15_percent_of_an_8x_h100_sweep_from_1_mib(catalog, row):
    """The 8x H100 (p5.48xlarge) sweep that the NVLS loop overhead, latency and port fraction
    were fitted to (3 numbers for 14 rows): ring LL up to 2 MiB, then NVLink SHARP with NCCL's
    chunk schedule (16 to 128 KiB by message size)."""
    assert _p5(catalog, row).busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


H200_TORCH = list(csv.DictReader((REPO / "analysis/data/collectives_h200_torch.csv").open()))


@pytest.mark.parametrize("row", [r for r in H200_TORCH if int(r["message_bytes"]) >= 4 * 2**20],
                         ids=lambda r: r["message_bytes"])
def test_nvls_on_8x_h200_from_4_mib(catalog, row):
    """An independent NVLS sweep (8x H200, torch all_reduce_bench, NCCL 2.27.7): within 10%
    from 32 MiB, 30% from 4 MiB. Below that every call carries torch's barrier and launch skew
    (~20-25 us at 32 KiB), which nccl-tests' back-to-back loop does not."""
    measure_ = measure(catalog.cluster(device="h200", num_devices=8), "all_reduce", 8,
                       float(row["message_bytes"]))
    tolerance = 0.1 if int(row["message_bytes"]) >= 32 * 2**20 else 0.3
    assert measure_.busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=tolerance)


def test_nvls_chunk_schedule_is_nccls():
    """enqueue.cc (2.18-2.21): 128 KiB chunks, 64 KiB below 64 loops of 16 channels x 8 heads
    x 128 KiB (1 GiB), 32 KiB below 8 x 16 x 8 x 64 KiB (64 MiB), 16 KiB below 8 MiB."""
    from clustersim.simulator.cost.collectives import nvls_chunk_bytes, nvls_loops
    assert [nvls_chunk_bytes(2**k, 8) // 1024 for k in (22, 23, 25, 26, 29, 30, 33)] == [
        16, 32, 32, 64, 64, 128, 128]
    assert nvls_loops(2**30, 8) == 2**30 // (16 * 8 * 128 * 1024)
    assert nvls_loops(1, 8) == 1


@pytest.mark.parametrize("row", [r for r in P5 if int(r["message_bytes"]) < 2**20
                                 and r["message_bytes"] != "32"], ids=lambda r: r["message_bytes"])
def test_small_all_reduce_within_30_percent_of_an_8x_h100_sweep(catalog, row):
    """LL ring latency up to 512 KiB. (The 32 B row is left out: its out-of-place time,
    22.25 us, is 1.7x its own in-place time, a hiccup of that run.)"""
    measured = float(re.search(r"time ([0-9.]+) us", row["notes"]).group(1)) * 1e-6
    assert _p5(catalog, row).time_s == pytest.approx(measured, rel=0.3)


SHARP = list(csv.DictReader((REPO / "analysis/data/collectives_h200_b200.csv").open()))


def _sharp(catalog, row):
    device = "h200" if "H200" in row["system"] else "b200"
    ring = Algorithm.RING if "NCCL_NVLS_ENABLE=0" in row["notes"] else None
    return measure(catalog.cluster(device=device, num_devices=8), row["collective"],
                   int(row["gpus"]), float(row["message_bytes"]), ring)


@pytest.mark.parametrize("row", SHARP, ids=lambda r: f"{r['system'].split()[2]}-{r['gpus']}g-"
                         f"{r['collective']}-{r['notes'].split(';')[-1].strip().split()[-1]}")
def test_large_collectives_within_15_percent_on_8x_h200_and_8x_b200(catalog, row):
    """NVLS and rings at 8-16 GiB on 4 to 8 GPUs of an H200 and a B200 node (outside the dev
    set); only B200's NVLS efficiency, 0.53, was set from one of these rows (8 GPUs)."""
    assert _sharp(catalog, row).busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


def test_nvls_only_above_four_gpus_as_nccl_picks_it(catalog):
    for row in (r for r in SHARP if "NCCL picks" in r["notes"]):
        picked = row["notes"].rsplit("NCCL picks ", 1)[1].lower()
        if "AWS ofi tuner" in row["notes"] and row["gpus"] == "5":
            continue   # AWS's tuner plugin keeps the ring at 5 GPUs; NCCL's own rule is above 4
        assert _sharp(catalog, row).algorithm == picked, row["notes"]


def test_nccl_drops_channels_for_small_collectives():
    """enqueue.cc: a channel is dropped while bytes < channels x threads x per-thread threshold
    (ring LL on 8 ranks: 8 x 8 bytes x 512 threads = 32 KiB per channel)."""
    from clustersim.simulator.cost.collectives import Protocol, nccl_channels
    assert [nccl_channels(Protocol.LL, 2**k, 8, 24) for k in (15, 17, 19, 20)] == [1, 4, 16, 24]
    assert nccl_channels(Protocol.SIMPLE, 256 * 2**10, 8, 24) == 8
    assert nccl_channels(Protocol.SIMPLE, 2**30, 8, 24) == 24


LATENCY = [r for r in ROWS if "mscclpp" in r["source"] and not r["busbw_gbps"]]


@pytest.mark.parametrize("row", LATENCY, ids=lambda r: f"{r['collective'].split()[0]}-{r['gpus']}g{r['nodes']}n")
def test_1_kib_busbw_within_30_percent_of_azure_ndm_a100_nccl_tests(catalog, row):
    """One node, two nodes of one GPU, two nodes of eight: rings that cross nodes pay the
    proxy's network post per step (with one GPU per node, the tree's network hop), trees
    NCCL's up-and-down depth, all-to-all a post per remote peer (AMD EPYC hosts: 2 us each).
    Bus bandwidth is size x bus factor / time, so its error is measured / predicted time."""
    measured = float(re.search(r"([0-9.]+) ?us", row["notes"]).group(1)) * 1e-6
    assert measured / _predict(catalog, row).time_s == pytest.approx(1.0, rel=0.3)


def test_small_message_latency_is_nccls(catalog):
    # Azure NDm A100 v4, one node: 1 KiB all-reduce in 16.96 us (NCCL 2.17, LL protocol).
    row = next(r for r in ROWS if r["message_bytes"] == "1024" and r["gpus"] == "8"
               and "all_reduce" in r["collective"])
    measured = float(re.search(r"([0-9.]+) us", row["notes"]).group(1)) * 1e-6
    assert _predict(catalog, row).time_s == pytest.approx(measured, rel=0.3)


def test_busbw_rises_with_message_size(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    sizes = [2**k for k in range(10, 34)]
    bus = [measure(cluster, "all_reduce", 16, s).busbw_gbps for s in sizes]
    assert all(b2 >= b1 * 0.999 for b1, b2 in zip(bus, bus[1:]))


def test_nvls_beats_the_ring_for_large_all_reduce_on_nvswitch(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    auto = measure(cluster, "all_reduce", 8, 2**30)
    ring = measure(cluster, "all_reduce", 8, 2**30, Algorithm.RING)
    assert auto.algorithm == "nvls" and auto.busbw_gbps > 1.2 * ring.busbw_gbps


def test_tree_inside_one_node_is_a_chain(catalog):
    cluster = catalog.cluster(device="a100-80gb", num_devices=8)
    # NCCL's tuner rates the chain's LL128 at 31.5 us and 0.36 of the link, then divides the
    # tree's bandwidth by its medium-size correction (tuning.cc treeCorrectionFactor, LL128
    # 0.6-0.8 from 32 KiB to 8 MiB): on one 8x A100 node the ring wins at every size.
    chosen = {s: measure(cluster, "all_reduce", 8, s) for s in (2**16, 2**21, 2**23, 2**26)}
    assert [(r.algorithm, r.protocol) for r in chosen.values()] == [
        ("ring", "LL"), ("ring", "LL"), ("ring", "LL128"), ("ring", "Simple")]
    tiny = measure(cluster, "all_reduce", 8, 8, Algorithm.TREE)
    # NCCL tuning.cc: baseLat 6.8 us + 2 x (8 - 1) chain hops x 0.6 us (tree, LL, NVLink).
    assert (tiny.algorithm, tiny.protocol) == ("tree", "LL")
    assert tiny.time_s == pytest.approx((6.8 + 2 * 7 * 0.6) * 1e-6, rel=0.01)
    large = measure(cluster, "all_reduce", 8, 2**30, Algorithm.TREE)
    ring = measure(cluster, "all_reduce", 8, 2**30, Algorithm.RING)
    # algorithm bandwidth 0.5 x 0.92 of the link against the ring's n / 2(n-1) of it
    assert large.time_s / ring.time_s == pytest.approx((8 / 14) / (0.5 * 0.92), rel=0.12)


def test_a_forced_algorithm_that_cannot_run_falls_back_to_the_ring(catalog):
    cluster = catalog.cluster(device="a100-80gb", num_devices=8)   # no NVLink SHARP
    row = measure(cluster, "all_reduce", 8, 2**30, Algorithm.NVLS)
    assert row.algorithm == "ring"


def test_in_network_reduction_halves_inter_node_all_reduce_traffic(catalog):
    from dataclasses import replace
    cluster = catalog.cluster(device="h100-sxm", num_devices=64)
    sharp = replace(cluster, fabric=replace(cluster.fabric, in_network_reduction=True))
    group = (tuple(range(64)),)
    ring = next(p for p in NetworkModel(cluster).planner.plans(CollectiveKind.ALL_REDUCE, 2**30, group)
                if (p.algorithm, p.protocol) == (Algorithm.RING, Protocol.SIMPLE))
    network = NetworkModel(sharp)
    collnet = network.plan(CollectiveKind.ALL_REDUCE, 2**30, group)
    assert collnet.algorithm is Algorithm.COLLNET
    # Each node sends its data through the switch once instead of 2(n-1)/n times.
    ratio = collnet.network_s(network.topology) / ring.network_s(network.topology)
    assert ratio == pytest.approx(0.5 * 64 / 63, rel=0.02)
    assert collnet.time(network.topology) < ring.time(network.topology)


def test_rail_optimised_topology_keeps_a_rail_on_its_leaf(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=1024)
    topo = Topology(cluster)
    # GPU 3 of node 0 to GPU 3 of node 5: same rail, same leaf, no spine.
    path = topo.path(3, 5 * 8 + 3)
    assert [k for k, _ in path] == [LinkKind.NIC_TX, LinkKind.NIC_RX]
    # Different rail: PXN moves it to the destination's rail first; still one leaf.
    assert len(topo.path(3, 5 * 8 + 6)) == 2
    # Beyond the leaf's 32 nodes the path climbs to the spine.
    far = topo.path(3, 40 * 8 + 3)
    assert (LinkKind.LEAF_UP, topo.location(3).leaf) in far


def test_oversubscription_slows_only_traffic_that_leaves_the_leaf(catalog):
    flat = catalog.cluster(device="h100-sxm", num_devices=1024)
    over = catalog.cluster(device="h100-sxm", num_devices=1024, fabric="rail-optimized-2to1")
    assert over.fabric.tiers[0].oversubscription > 1
    in_leaf = tuple(range(3, 32 * 8, 8))        # one GPU per node on 32 nodes: one rail leaf
    wide = tuple(range(3, 1024, 8))              # 128 nodes: most pairs cross the spine
    for group, slower in ((in_leaf, False), (wide, True)):
        a = NetworkModel(flat).collective_time(CollectiveKind.ALL_TO_ALL, 2**28, (group,))
        b = NetworkModel(over).collective_time(CollectiveKind.ALL_TO_ALL, 2**28, (group,))
        assert (b > 1.2 * a) is slower
    # A ring crosses each leaf boundary once: its NICs, not the uplinks, stay the bottleneck.
    ring_flat = NetworkModel(flat).collective_time(CollectiveKind.ALL_REDUCE, 2**30, (wide,))
    ring_over = NetworkModel(over).collective_time(CollectiveKind.ALL_REDUCE, 2**30, (wide,))
    assert ring_over == pytest.approx(ring_flat, rel=1e-9)


def test_scattered_placement_puts_tp_groups_across_nodes(catalog):
    from dataclasses import replace
    cluster = replace(catalog.cluster(device="h100-sxm", num_devices=64),
                      placement=Placement.SCATTERED)
    nodes = {cluster.node_of(r) for r in range(8)}
    assert len(nodes) == 8


def _ep_step(example, fabric=None):
    from clustersim.analysis.config import config_from_mapping, read_yaml
    from clustersim.analysis.step import run_step
    data = dict(read_yaml(REPO / "examples" / example))
    data["training"] = {"seq_len": 4096, "global_batch": 32, "micro_batch": 1}
    if fabric:
        data["cluster"] = dict(data["cluster"], fabric=fabric)
    return run_step(config_from_mapping(data, REPO / "examples")).result


def test_parallel_groups_crossing_an_oversubscribed_fabric_slow_each_other():
    # 8 expert-parallel groups (one per GPU position) all-to-all across 8 nodes at once.
    fat_tree = _ep_step("moe_fabric_contention.yaml")
    rail = _ep_step("moe_fabric_contention_rail.yaml")
    ep = lambda r: r.breakdown.exposed_comm_s["ep"]
    # Rack-based fat-tree: the groups share the racks' 4:1 uplinks and lose time to each other.
    assert ep(fat_tree) > 1.25 * ep(rail)
    assert fat_tree.step_time_s > rail.step_time_s
    # Rail-aligned: each group stays on its rail's leaf, so the 4:1 uplinks cost nothing.
    unblocked = _ep_step("moe_fabric_contention_rail.yaml", "rail-optimized-nonblocking")
    assert rail.step_time_s == pytest.approx(unblocked.step_time_s, rel=1e-9)


MULTINODE = list(csv.DictReader((REPO / "analysis/data/collectives_multinode_sweeps.csv").open()))
IB_RING = [r for r in MULTINODE if "gj-aion" in r["source"] and "2-node Ring" in r["source"]
           and int(r["message_bytes"]) >= 64 * 2**20]


@pytest.mark.parametrize("row", IB_RING, ids=lambda r: r["message_bytes"])
def test_ring_across_two_h100_nodes_on_infiniband_within_15_percent_from_64_mib(catalog, row):
    """NVIDIA/nccl-tests#309, 2x 8 H100 with 8x 400 Gb/s InfiniBand, NCCL_ALGO=Ring: 384 GB/s at
    1 GiB against a 400 GB/s NIC limit. Outside the dev set."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    predicted = measure(cluster, "all_reduce", 16, float(row["message_bytes"]), Algorithm.RING)
    assert predicted.busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


def test_a_ring_across_nodes_leaves_each_node_on_a_nic_not_nvlink(catalog):
    # Each channel enters and leaves a node once: with 8 GPUs per node, 7 of every 8 hops of
    # a GPU's ring traffic ride NVLink; inside one node all 8 do.
    size = 2.0**30
    two = catalog.cluster(device="h100-sxm", num_devices=16)
    one = catalog.cluster(device="h100-sxm", num_devices=8)

    def ring_intra(cluster, n):
        plans = NetworkModel(cluster).planner.plans(CollectiveKind.ALL_GATHER, size,
                                                      (tuple(range(n)),))
        return next(p for p in plans if p.algorithm is Algorithm.RING
                    and p.protocol.value == "Simple").intra_s

    per_rank_volume = {16: 15 / 16 * size, 8: 7 / 8 * size}
    assert ring_intra(two, 16) / per_rank_volume[16] == pytest.approx(
        7 / 8 * ring_intra(one, 8) / per_rank_volume[8])


def _ring_loads_hop_by_hop(planner, instances):
    """The definition: at each node boundary of each group (nodes in ascending order, the last
    back to the first), the i-th member sends 1/m of the volume to member i mod m' of the
    next node, link by link along ``Topology.path``."""
    from collections import defaultdict
    loads = defaultdict(float)
    for group in instances:
        nodes = list(planner.nodes_of(group).values())
        if len(nodes) < 2:
            continue
        for here, there in zip(nodes, nodes[1:] + nodes[:1]):
            for i, src in enumerate(here):
                for link in planner.topology.path(src, there[i % len(there)]):
                    loads[link] += 1.0 / len(here)
    return tuple(sorted(loads.items()))


@pytest.mark.parametrize("device,gpus", [("h100-sxm", 1024), ("a100-80gb", 256)])
def test_ring_and_send_loads_computed_at_once_equal_the_hop_by_hop_sums(catalog, device, gpus):
    """Ring loads and send/recv loads are routed for every group at once (arrays); they must be
    the very floats of walking the hops one by one, for shuffled and uneven groups too."""
    import random
    from collections import defaultdict
    planner = NetworkModel(catalog.cluster(device=device, num_devices=gpus)).planner
    rng = random.Random(7)
    for size in (2, 3, 8, 16, 64):
        devices = list(range(gpus))
        rng.shuffle(devices)
        groups = [tuple(devices[g * size:(g + 1) * size]) for g in range(gpus // size // 2)]
        instances = tuple(groups) + (tuple(devices[-3:]),)
        assert planner.ring_unit_loads(instances) == _ring_loads_hop_by_hop(planner, instances)
        pairs = list(zip(devices[:size * 4], devices[-size * 4:]))
        expected = defaultdict(float)
        for src, dst in pairs:
            for link in planner.topology.path(src, dst):
                expected[link] += 3e6
        assert planner.p2p_pairs(3e6, pairs).loads == tuple(expected.items())

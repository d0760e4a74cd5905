"""NVLSTree all-reduce across nodes: NVLink SHARP inside each node, a tree of nodes outside
(simulator/cost/nvls_tree.py), against NCCL's source and a published two-node sweep."""

import csv

import pytest

from clustersim.analysis.validation.collectives import measure
from clustersim.hardware_specs.topology import LinkKind, Topology
from clustersim.simulator.cost.collectives import Algorithm
from clustersim.simulator.cost.network import NetworkModel
from clustersim.simulator.cost.nvls_tree import nvls_tree_chunk_bytes, nvls_tree_plan
from clustersim.workloads.trace import CollectiveKind

from tests.conftest import REPO

GIB = 2**30
ROWS = list(csv.DictReader((REPO / "analysis/data/collectives_multinode_sweeps.csv").open()))
TWO_NODES_DEFAULT = [r for r in ROWS if "gj-aion" in r["source"] and "2-of-8-node" in r["source"]]


def _nic_bytes(plan, topology, kind=LinkKind.NIC_TX):
    return {link[1]: b for link, b in plan.loads if link[0] is kind}


def test_two_nodes_send_each_node_partial_once_half_a_ring(catalog):
    """2 x 8 H100: each GPU heads 1/8 of the buffer and sends that node's partial once over its
    own NIC (S/8), where a ring sends 2(n-1)/n S / 8 through each NIC."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    net = NetworkModel(cluster)
    size = 1.0 * GIB
    group = (tuple(range(16)),)
    tree = nvls_tree_plan(net.planner, size, group)
    assert tree.algorithm is Algorithm.NVLS_TREE
    sent = _nic_bytes(tree, net.topology)
    assert len(sent) == 16 and all(b == pytest.approx(size / 8) for b in sent.values())
    received = _nic_bytes(tree, net.topology, LinkKind.NIC_RX).values()
    assert len(received) == 16 and all(b == pytest.approx(size / 8) for b in received)
    ring = next(p for p in net.planner.plans(CollectiveKind.ALL_REDUCE, size, group)
                if p.algorithm is Algorithm.RING and p.protocol.value == "Simple")
    assert max(_nic_bytes(ring, net.topology).values()) == pytest.approx(2 * 15 / 16 * size / 8)
    # The NVLink part is the one-node NVLS all-reduce's: the buffer through the port once.
    assert tree.intra_s == pytest.approx(size / (cluster.node.scale_up_bandwidth
                                                 * cluster.node.nvls_efficiency))


def test_more_nodes_carry_twice_the_buffer_and_fewer_than_five_gpus_per_node_cannot(catalog):
    four = catalog.cluster(device="h100-sxm", num_devices=32)
    net = NetworkModel(four)
    tree = nvls_tree_plan(net.planner, 1.0 * GIB, (tuple(range(32)),))
    sent = _nic_bytes(tree, net.topology).values()
    assert len(sent) == 32 and all(b == pytest.approx(2 * GIB / 8) for b in sent)
    # TP4 x DP8: the DP group has 1 GPU per node; 4 per node are too few for NVLink SHARP.
    assert nvls_tree_plan(net.planner, 1.0 * GIB, (tuple(range(0, 32, 8)),)) is None
    assert nvls_tree_plan(net.planner, 1.0 * GIB, (tuple(range(0, 32, 2)),)) is None
    a100 = catalog.cluster(device="a100-80gb", num_devices=16)
    assert nvls_tree_plan(NetworkModel(a100).planner, 1.0 * GIB, (tuple(range(16)),)) is None


@pytest.mark.parametrize(("nbytes", "nodes", "chunk_kib"), [
    (8 * GIB, 2, 128), (64 * 2**20, 2, 128), (63 * 2**20, 2, 64), (8 * 2**20, 2, 64),
    (7 * 2**20, 2, 32), (8 * GIB, 4, 64), (7 * 2**20, 4, 32)])
def test_chunk_follows_nccl_enqueue(nbytes, nodes, chunk_kib):
    # enqueue.cc (2.19-2.26), NVLS_TREE: 128 KiB (64 KiB from 4 nodes); 64 KiB below 4 loops
    # of 16 channels x 8 heads x chunk, 32 KiB below one.
    assert nvls_tree_chunk_bytes(nbytes, 8, nodes) == chunk_kib * 1024


@pytest.mark.parametrize("row", [r for r in TWO_NODES_DEFAULT if int(r["message_bytes"]) >= GIB],
                         ids=lambda r: f"{int(r['message_bytes']) >> 20}MiB")
def test_two_h100_nodes_default_all_reduce_within_10_percent_from_1_gib(catalog, row):
    """NVIDIA/nccl-tests#309 (gj-aion), 2 x 8 H100 on 8 x 400 Gb/s InfiniBand with NCCL's
    defaults (NVLSTree): 447-467 GB/s bus bandwidth from 1 GiB, above the 368 GB/s a ring can
    reach through eight 400 Gb/s NICs. Outside the dev set."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    predicted = measure(cluster, "all_reduce", 16, float(row["message_bytes"]))
    assert predicted.algorithm == Algorithm.NVLS_TREE.value
    assert predicted.busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.10)


@pytest.mark.parametrize("row", [r for r in TWO_NODES_DEFAULT
                                 if 64 * 2**20 <= int(r["message_bytes"]) < 512 * 2**20],
                         ids=lambda r: f"{int(r['message_bytes']) >> 20}MiB")
def test_two_h100_nodes_default_all_reduce_within_15_percent_from_64_mib(catalog, row):
    """64-256 MiB pay the chunk pipeline's fill: three rounds of 128 KiB x 16 channels x 8
    heads through the switch's reduction, the network up and down and the multicast."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    predicted = measure(cluster, "all_reduce", 16, float(row["message_bytes"]))
    assert predicted.algorithm == Algorithm.NVLS_TREE.value
    assert predicted.busbw_gbps == pytest.approx(float(row["busbw_gbps"]), rel=0.15)


@pytest.mark.parametrize("gpus", [16, 32, 64])
def test_the_pipeline_fill_is_every_stage_but_the_slowest_once(catalog, gpus):
    # 2 + 2 log2(nodes) stages: the switch's reduction, each network level up and down, the
    # multicast; a pipeline of stages t_i moving k rounds takes sum(t_i) + (k - 1) max(t_i).
    # At 1 GiB a round is 16 channels x 8 heads x the chunk (128 KiB; 64 KiB from 4 nodes).
    cluster = catalog.cluster(device="h100-sxm", num_devices=gpus)
    net = NetworkModel(cluster)
    size = 1.0 * GIB
    plan = nvls_tree_plan(net.planner, size, (tuple(range(gpus)),))
    intra, network = plan.intra_s, plan.network_s(net.topology)
    levels = {16: 1, 32: 2, 64: 3}[gpus]
    chunk = 128 * 1024 if gpus == 16 else 64 * 1024
    round_share = 16 * 8 * chunk / size
    expected = round_share * (2 * intra + 2 * levels * network - max(intra, network))
    assert plan.fill_s == pytest.approx(expected)
    # two nodes: the switch is the slowest stage; from four, the network levels (twice the buffer)
    assert (intra > network) == (gpus == 16)


@pytest.mark.parametrize("gpus", [16, 32, 64])
def test_nccls_tuner_rates_nvls_tree_at_five_sixths_of_its_bandwidth(catalog, gpus):
    """tuning.cc (v2.19.3-v2.27): NVLS and NVLSTree's algorithm bandwidth is 5/6 of the bus
    bandwidth their graph carries (``ratio *= 5.0/6.0``): the tuner's rating, not the cost."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=gpus)
    net = NetworkModel(cluster)
    tree = nvls_tree_plan(net.planner, 64 * 2**20, (tuple(range(gpus)),))
    bandwidth_s = max(tree.intra_s, net.planner.network_s(tree))
    assert tree.rated_s == pytest.approx(bandwidth_s * 6 / 5)
    assert tree.time(net.topology) == pytest.approx(tree.latency_s + bandwidth_s)

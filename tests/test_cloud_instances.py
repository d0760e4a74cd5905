"""Cloud instances in the catalog: each one is sourced and simulates (issue 19, item 1); their
published nccl-tests sweeps are replayed in tests/test_multinode_sweeps.py."""

import math

import pytest

from clustersim.analysis.api import simulate
from clustersim.hardware_specs.node import NicKind
from clustersim.hardware_specs.topology import Topology
from clustersim.simulator.cost.collectives import Protocol
from clustersim.simulator.cost.network import NetworkModel
from clustersim.workloads.trace import CollectiveKind


CLOUD = {"aws-p4d-24xlarge": "a100-40gb", "aws-p4de-24xlarge": "a100-80gb",
         "aws-p5-48xlarge": "h100-sxm", "aws-p5en-48xlarge": "h200",
         "aws-p6-b200-48xlarge": "b200", "azure-nd-h100-v5": "h100-sxm", "azure-nd-h200-v5": "h200",
         "gcp-a3-ultragpu-8g": "h200", "gcp-a3-megagpu-8g": "h100-sxm",
         "gcp-a4-highgpu-8g": "b200", "azure-nd-gb200-v6": "gb200"}


@pytest.mark.parametrize("name", sorted(CLOUD))
def test_cloud_node_is_sourced_and_matches_its_device(catalog, name):
    node = catalog.nodes[name]
    assert node.source and node.device == CLOUD[name]
    assert node.host_memory in catalog.memory_tiers and node.local_storage in catalog.memory_tiers


def test_azure_nd_v5_gives_every_gpu_its_own_400g_infiniband(catalog):
    # Azure ND H100 v5 and ND H200 v5 size series: "Each GPU ... its own dedicated,
    # topology-agnostic 400 Gbps NVIDIA Quantum-2 CX7 InfiniBand connection", 3.2 Tb/s per VM
    for name in ("azure-nd-h100-v5", "azure-nd-h200-v5"):
        node = catalog.nodes[name]
        assert node.nic_kind is NicKind.IB_NDR and node.nic_count == node.devices_per_node == 8
        assert node.network_bandwidth * 8 == pytest.approx(3.2e12)


def test_aws_instances_carry_the_published_efa_bandwidth(catalog):
    # EC2 accelerated-computing network table: p4d "4x 100 Gigabit"; p5, p5en, p6-b200 "3200
    # Gigabit" over 32, 16 and 8 network cards.
    gbps = {n: catalog.nodes[n].network_bandwidth * 8 / 1e9 for n in CLOUD if n.startswith("aws")}
    assert gbps == pytest.approx({"aws-p4d-24xlarge": 400, "aws-p4de-24xlarge": 400,
                                  "aws-p5-48xlarge": 3200, "aws-p5en-48xlarge": 3200,
                                  "aws-p6-b200-48xlarge": 3200})
    assert all(catalog.nodes[n].nic_kind is NicKind.EFA for n in gbps)


def test_a_gpu_with_four_efa_cards_drives_all_four(catalog):
    # p5: 32 cards for 8 GPUs; each GPU stripes over its 4 (aws-ofi-nccl multi-rail), so a GPU's
    # network link carries 4 x 100 Gb/s and the node's 8 links carry all 3200 Gb/s.
    topo = Topology(catalog.cluster(device="h100-sxm", num_devices=16, node="aws-p5-48xlarge"))
    node = catalog.nodes["aws-p5-48xlarge"]
    assert topo.nics_per_node == 8 and topo.nics_per_device == 4
    assert topo.nic_capacity == pytest.approx(4 * node.nic_bandwidth * node.nic_efficiency)
    assert len({topo.location(d).nic for d in range(8)}) == 8


@pytest.mark.parametrize("name", sorted(CLOUD))
def test_each_cloud_node_simulates_a_two_node_fsdp_step(name):
    config = {"name": f"cloud-{name}", "model": "llama3-8b",
              "training": {"seq_len": 2048, "global_batch": 16, "micro_batch": 1,
                           "precision": "bf16"},
              "strategy": {"dp": 16, "zero": 3},
              "cluster": {"gpu": CLOUD[name], "num_gpus": 16, "node": name}}
    row = simulate(config).iloc[0]
    assert math.isfinite(row["step_time_s"]) and row["step_time_s"] > 0
    assert row["exposed_dp_s"] >= 0


def test_efa_plans_only_the_simple_protocol_across_nodes(catalog):
    # aws-ofi-nccl sets NCCL_PROTO=simple on AWS: no LL/LL128 plan crosses EFA; InfiniBand keeps them.
    def protocols(node, device):
        cluster = catalog.cluster(device=device, num_devices=16, node=node)
        plans = NetworkModel(cluster).planner.plans(CollectiveKind.ALL_REDUCE, 2.0**20,
                                                    (tuple(range(16)),))
        return {p.protocol for p in plans}
    assert protocols("aws-p5-48xlarge", "h100-sxm") == {Protocol.SIMPLE}
    assert protocols("gcp-a3-megagpu-8g", "h100-sxm") == {Protocol.SIMPLE}
    assert Protocol.LL in protocols("dgx-h100", "h100-sxm")


@pytest.mark.parametrize("size", [2.0**20, 64 * 2.0**20, 8 * 2.0**30])
def test_two_a3_mega_nodes_all_reduce_as_gcps_tcpxo_profile_runs_them(catalog, size):
    # GCP's profile: NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0, NCCL_ALGO=Ring,Tree; its A3 Mega
    # tuner rules run every two-node all-reduce of 8 GPUs a node as the tree with Simple.
    cluster = catalog.cluster(device="h100-sxm", num_devices=16, node="gcp-a3-megagpu-8g")
    assert cluster.node.nccl_buffer_bytes == 8 * 2**20
    plan = NetworkModel(cluster).plan(CollectiveKind.ALL_REDUCE, size, (tuple(range(16)),))
    assert (plan.algorithm.value, plan.protocol) == ("tree", Protocol.SIMPLE)


# The published EFA and TCPXO sweeps on these instances: tests/test_multinode_sweeps.py.

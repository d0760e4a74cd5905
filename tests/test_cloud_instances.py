"""Cloud instances in the catalog: each one simulates, and the published EFA and TCPXO
nccl-tests sweeps replayed against the network model (issue 19, item 1)."""

import csv
import math

import pytest

from clustersim.analysis.api import simulate
from clustersim.analysis.validation.collectives import measure
from clustersim.hardware_specs.node import NicKind
from clustersim.hardware_specs.topology import Topology
from clustersim.simulator.cost.collectives import Protocol
from clustersim.simulator.cost.network import NetworkModel
from clustersim.workloads.trace import CollectiveKind

from tests.conftest import REPO

CLOUD = {"aws-p4d-24xlarge": "a100-40gb", "aws-p4de-24xlarge": "a100-80gb",
         "aws-p5-48xlarge": "h100-sxm", "aws-p5en-48xlarge": "h200",
         "aws-p6-b200-48xlarge": "b200", "azure-nd-h100-v5": "h100-sxm",
         "gcp-a3-ultragpu-8g": "h200", "gcp-a3-megagpu-8g": "h100-sxm",
         "gcp-a4-highgpu-8g": "b200", "azure-nd-gb200-v6": "gb200"}


@pytest.mark.parametrize("name", sorted(CLOUD))
def test_cloud_node_is_sourced_and_matches_its_device(catalog, name):
    node = catalog.nodes[name]
    assert node.source and node.device == CLOUD[name]
    assert node.host_memory in catalog.memory_tiers and node.local_storage in catalog.memory_tiers


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
    assert Protocol.LL in protocols("dgx-h100", "h100-sxm")


# ---- published EFA and TCPXO sweeps (analysis/data/collectives_multinode_sweeps.csv), 2 x 8 GPUs
ROWS = list(csv.DictReader((REPO / "analysis/data/collectives_multinode_sweeps.csv").open()))
SYSTEMS = {"AWS p4d.24xlarge": "aws-p4d-24xlarge", "AWS p4de.24xlarge": "aws-p4de-24xlarge",
           "AWS p5.48xlarge": "aws-p5-48xlarge", "GCP A3 Mega": "gcp-a3-megagpu-8g"}
SOURCES = {"awsdocs/aws-deep-learning-amis": "dlami-2021", "AWS DLAMI Developer Guide": "dlami-live",
           "aws-efa-eks": "eks-2022", "awsome-distributed-training": "awsome-2024",
           "create-a3mega-ztan-fork": "ztan-2025"}


# Rows the model misses, by mechanism (measured on this commit; the errors print on failure):
#  - p5 from 1 GiB runs NVLSTree (NVLS inside the node, a tree of the two nodes: half a ring's
#    network bytes), within 13% (simulator/cost/nvls_tree.py). From 1 to 512 MiB the modelled
#    NVLSTree is 23-120% too fast: its cost at mid sizes is not known (the same shape shows on
#    InfiniBand, tests/test_network.py), and the model picks it where it is not faster.
#  - p4d/p4de from 64 MiB (DLAMI live page, awsome 2024): busbw 73-78 GB/s exceeds the 50 GB/s
#    of 4x100 Gb/s: a two-node tree's traffic (half the ring's); the model's tree carries the
#    ring's bytes (46 GB/s). The 2021/2022 runs (older NCCL) stay near the ring and match.
#  - A3 Mega (GPUDirect-TCPXO, 8 x 200 Gb/s): from 1 GiB within 6% (NVLSTree); from 1 to 512 MiB
#    the model is 19-470% too fast: TCPXO's per-message cost (TCP offload to the NIC's data path,
#    with the host thread in the loop) is not modelled, and no NCCL protocol limit of its plugin
#    was found, so the model also runs LL/LL128 across it.
#  - below 64 MiB: with Simple only (net_simple_protocol_only) the model is still 1.2-3x too
#    fast (p4d 1 MiB +124% to +166%). The network hop latency is NCCL's InfiniBand figure;
#    EFA/SRD's own per-message cost is not published as a number (aws-ofi-nccl declares 75 us
#    of "internode latency" for p4d/p5 to NCCL's tuner, src/platform-aws.cpp, a tuning input:
#    the measured 1 MiB all-reduce takes 123 us in all, less than its two hops would).
WITHIN = {  # the rows the model meets today; every other row is a strict xfail
    "aws-p4d-24xlarge-dlami-live-32MiB", "aws-p4d-24xlarge-dlami-live-64MiB",
    "aws-p4de-24xlarge-awsome-2024-32MiB", "aws-p4de-24xlarge-awsome-2024-64MiB",
    "aws-p4d-24xlarge-eks-2022-512MiB", "aws-p4d-24xlarge-eks-2022-1024MiB",
    "aws-p4d-24xlarge-eks-2022-2048MiB", "aws-p4d-24xlarge-eks-2022-4096MiB",
    "aws-p5-48xlarge-awsome-2024-1024MiB", "aws-p5-48xlarge-awsome-2024-2048MiB",
    "aws-p5-48xlarge-awsome-2024-4096MiB", "aws-p5-48xlarge-awsome-2024-8192MiB",
    "aws-p5-48xlarge-awsome-2024-16384MiB",
    "gcp-a3-megagpu-8g-ztan-2025-1024MiB", "gcp-a3-megagpu-8g-ztan-2025-2048MiB",
    "gcp-a3-megagpu-8g-ztan-2025-4096MiB", "gcp-a3-megagpu-8g-ztan-2025-8192MiB"}
MISSING = ("model lacks a mechanism: NVLSTree's cost at mid sizes, the 2-node tree's traffic "
           "on p4d, and EFA's per-message cost (see the comment above)")


def _cloud_rows():
    for r in ROWS:
        system = next((n for s, n in SYSTEMS.items() if r["system"].startswith(s)), None)
        if system and int(r["message_bytes"]) >= 2**20:
            src = next(v for k, v in SOURCES.items() if k in r["source"])
            rid = f"{system}-{src}-{int(r['message_bytes']) >> 20}MiB"
            marks = () if rid in WITHIN else pytest.mark.xfail(strict=True, reason=MISSING)
            yield pytest.param(r, system, id=rid, marks=marks)


@pytest.mark.parametrize(("row", "system"), list(_cloud_rows()))
def test_cloud_sweep_busbw_within_15_percent_from_64_mib_and_30_from_1_mib(catalog, row, system):
    """busbw of a 2 x 8 GPU all_reduce on the instance, against the published nccl-tests line."""
    size = int(row["message_bytes"])
    cluster = catalog.cluster(device=catalog.nodes[system].device, num_devices=int(row["gpus"]),
                              node=system)
    predicted = measure(cluster, row["collective"], int(row["gpus"]), float(size)).busbw_gbps
    measured = float(row["busbw_gbps"])
    print(f"{system} {size >> 20} MiB: measured {measured:.2f} GB/s, model {predicted:.2f} GB/s, "
          f"error {predicted / measured - 1:+.1%}")
    assert predicted == pytest.approx(measured, rel=0.15 if size >= 64 * 2**20 else 0.30)

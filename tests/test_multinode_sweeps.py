"""Every published multi-node nccl-tests all-reduce row from 1 MiB (InfiniBand, EFA,
GPUDirect-TCPXO; 2 to 8 nodes of 8 GPUs, and two GB200 NVL72 racks of 72 joined by InfiniBand;
analysis/data/collectives_multinode_sweeps.csv)
against the network model: bus bandwidth within 15% from 64 MiB and 30% from 1 MiB (issue 19).
Rows the model does not meet are strict xfails, each with what is known of the gap."""

import csv
from dataclasses import replace

import pytest

from clustersim.analysis.validation.collectives import measure
from clustersim.simulator.cost.collectives import Algorithm

from tests.conftest import REPO

MIB = 2**20
ROWS = list(csv.DictReader((REPO / "analysis/data/collectives_multinode_sweeps.csv").open()))
RUNS = {  # a phrase of the source (and system) -> (run id, catalog node, algorithm forced by env)
    ("issue description by qoofyk", ""): ("ib-qoofyk-2n", "dgx-h100", None),
    ("comment by qoofyk (2025-05-23)", ""): ("ib-qoofyk-4n-vm", "dgx-h100", None),
    ("gj-aion (2025-06-18) 8-node run", ""): ("ib-gj-aion-8n", "dgx-h100", None),
    ("2-of-8-node run", ""): ("ib-gj-aion-2n", "dgx-h100", None),
    ("4-of-8-node run", ""): ("ib-gj-aion-4n", "dgx-h100", None),
    ("8-node tuned run", ""): ("ib-gj-aion-8n-tuned", "dgx-h100", None),
    ("2-node Ring run", ""): ("ib-gj-aion-2n-ring", "dgx-h100", Algorithm.RING),
    ("aws-deep-learning-amis", ""): ("efa-p4d-dlami-2021", "aws-p4d-24xlarge", Algorithm.RING),
    ("AWS DLAMI Developer Guide", ""): ("efa-p4d-dlami-live", "aws-p4d-24xlarge", None),
    ("awsome-distributed-training", "AWS p4de"): ("efa-p4de-awsome-2024", "aws-p4de-24xlarge", None),
    ("awsome-distributed-training", "AWS p5"): ("efa-p5-awsome-2024", "aws-p5-48xlarge", None),
    # the repository's MPIJob example sets NCCL_ALGO=RING, and the run's 43.8 GB/s at 4 GiB is
    # the ring's limit through four 100 Gb/s NICs where the tree on p4d reaches 76
    ("aws-efa-eks", ""): ("efa-p4d-eks-2022", "aws-p4d-24xlarge", Algorithm.RING),
    ("create-a3mega-ztan-fork", ""): ("tcpxo-a3mega-ztan-2025", "gcp-a3-megagpu-8g", None),
    ("coreweave/nccl-tests", ""): ("ib-coreweave-gb200-2racks", "gb200-nvl72", None),
}


NCCL_DEFAULT_BUFFER = {"efa-p4d-dlami-2021", "efa-p4d-eks-2022", "efa-p4d-dlami-live"}
"""Runs under aws-ofi-nccl before 1.16 (1.13.2 on the DLAMI page, 2021-2022 releases), which
left NCCL_BUFFSIZE at NCCL's 4 MiB, and did not set it themselves; the catalog's AWS nodes
carry the 8 MiB the plugin sets from 1.16 (and the awsome-distributed-training runs set)."""


def _run(row):
    return next(v for (source, system), v in RUNS.items()
                if source in row["source"] and row["system"].startswith(system))


def _rows():
    for row in ROWS:
        size = int(row["message_bytes"])
        if size >= MIB:
            run, node, forced = _run(row)
            yield row, f"{run}-{size // MIB}MiB", node, forced


def predicted_busbw(catalog, row, node, forced):
    gpus = int(row["gpus"])
    cluster = catalog.cluster(device=catalog.nodes[node].device, num_devices=gpus, node=node)
    if _run(row)[0] in NCCL_DEFAULT_BUFFER:
        cluster = replace(cluster, node=replace(cluster.node, nccl_buffer_bytes=4 * MIB))
    return measure(cluster, row["collective"], gpus, float(row["message_bytes"]), forced).busbw_gbps


def tolerance(row):
    return 0.15 if int(row["message_bytes"]) >= 64 * MIB else 0.30


CHAIN = ("the tree's chunk pipeline, which now counts the 14 NVLink hops of a node's chain of "
         "GPUs (Simple hands on whole steps: all_reduce.h ProtoSimple<1, 1>, prims_simple.h "
         "waitPeer) besides its network levels, over rounds of two channels per NIC "
         "(search.cc, connect.cc)")
P4D_BUFFER = ("p4d's DLAMI run (NCCL 2.23.4, aws-ofi-nccl 1.13.2) below 512 MiB: 17-77% slower "
              "than the model's Simple tree; " + CHAIN + ". aws-ofi-nccl sets NCCL_BUFFSIZE=8 "
              "MiB on p4d only from 1.16 (platform-aws.cpp), so the test runs NCCL's 4 MiB, "
              "whose 512 KiB steps halve the fill; with 8 MiB (as p4de's run, which now meets "
              "it from 1 MiB) these rows are within 12% from 8 MiB, and 67-77% fast at 1-4 MiB "
              "either way. Whether the image set NCCL_BUFFSIZE elsewhere is not shown")
P4DE_DIP = ("a dip in the published sweep: 47.6 GB/s at 64 MiB between 40.9 at 32 MiB and 64.3 "
            "at 128 MiB (32 to 64 MiB at 30 GB/s of algorithm bandwidth, 64 to 128 MiB at 53); "
            "the model's tree is 18% fast there, 2-6% either side")
P5_NVLS_TREE = ("p5's NVLSTree below 512 MiB (but 8 MiB): 20-57% slower than the model. NVLSTree "
                "has no chain of GPUs (the switch reduces inside the node), so the chain's fill "
                "that brings p4de's and TCPXO's trees in does not apply; measured, the rate "
                "climbs slowly with the size (bus bandwidth 209 GB/s at 64 MiB, 343 at 256 MiB, "
                "437 at 1 GiB, 487 at 16 GiB; 123 us in all at 1 MiB). aws-ofi-nccl runs its "
                "RDMA-write protocol on p5, one NCCL device over four 100 Gb/s EFA rails, "
                "messages up to 256 KiB on one rail, larger ones striped; SRD's per-message "
                "cost and rate per queue pair are not published as numbers. aws-ofi-nccl's "
                "75 us reported latency is a tuner input, not a measurement (as a cost it would "
                "add 300 us to a two-node all-reduce)")
OLD_RING = ("NCCL 2.9.9 forced to the ring on two p4d (EKS, 2022) below 512 MiB: 1.2-2.1x "
            "slower than the model's Simple ring, within 11% from 512 MiB. NCCL 2.7.8-2.9.9 "
            "logs on two p4d with aws-ofi-nccl print '2 coll channels' (NVIDIA/nccl#527, "
            "aws/aws-ofi-nccl#64), where this run's 43.8 GB/s at 4 GiB needs all four NICs: "
            "what channels and chunks it ran is not shown")
LL128_OFF = ("157-178 us (and 93 us on the same nodes' 1-2 MiB default runs) is the Simple "
             "protocol's latency (the model's Simple ring: 142-180 us), not LL128's (65-127 us), "
             "which NCCL's tuner and the model pick: consistent with LL128 being off across this "
             "network (NCCL enables it only for NICs behind a PCIe switch or PXN, tuning.cc), "
             "which the posts do not show")
TREE_LL128 = ("4 nodes from 1 to 8 MiB, the tree with LL128 (which NCCL's tuner picks there; "
              "NVIDIA/nccl#1752's log shows it at 16 MiB on 8 x H200 nodes): 33-242% faster than "
              "measured although it runs at most at its channels' rate (8 x 29 GB/s, tuning.cc). "
              "gj-aion's 4-node run takes 227-317 us from 1 to 8 MiB where qoofyk's takes 82-217 "
              "us (its 2 MiB, 191 us, lies between 82 us at 1 MiB and 151 us at 4 MiB): a per-run "
              "cost (network latency, LL128 over these NIC paths) that the posts do not show")
TREE_LL128_8N = ("8 nodes at 4 MiB, the tree with LL128: 38% faster than measured (147 against "
                 "204 us) with the tree's 16 channels (two per NIC, search.cc, connect.cc; 28% "
                 "with the node's 32), which shorten LL128's round; the same run's 1-2 MiB are "
                 "within 11% and the tuned run's 4 MiB (181 us) within 23%: a per-run cost as on "
                 "4 nodes")
NVLS_TREE_FILL = ("NVLSTree on qoofyk's 4 VMs at 16 MiB: 125 GB/s measured, 35% over the model, "
                  "whose chunk pipeline (64 KiB chunks from four nodes, enqueue.cc; six stages, "
                  "each at its own rate, nvls_tree.py) leaves it 260 us; the same sweep's 32 MiB "
                  "and gj-aion's 4- and 8-node 16-64 MiB now meet it. A 16 MiB round on four "
                  "nodes is 8 MiB (16 channels x 8 heads x 64 KiB): two rounds, where how far "
                  "the network levels overlap the switch's stages decides the time; not derived")
TUNED_RING = ("the tuned 8-node run (NCCL_MIN_CTAS=24, NCCL_IB_QPS_PER_CONNECTION=2) at 128-256 "
              "MiB: 189-240 GB/s, below the default run's 228-270 GB/s at the same sizes (which "
              "the model meets with the ring and LL128, NVLSTree being rated at 5/6 by NCCL's "
              "tuner) and above it from 1 GiB; what the extra CTAs and queue pairs cost or save "
              "at each size is not modelled")
DIP = ("a dip in the published sweep: 8 MiB at 13-19 GB/s between 40-46 GB/s at 4 MiB and "
       "65-87 GB/s at 16 MiB; 256 MiB on 4 nodes at 234 GB/s between 246 at 128 MiB and 289 at "
       "512 MiB")
MNNVL_SMALL = ("two GB200 NVL72 racks from 512 MiB to 2 GiB: 494-680 GB/s where the model's "
               "NVLSTree gives 17-41% more (within 12% from 4 GiB). With each stage of its chunk "
               "pipeline at its own rate (nvls_tree.py) the fill is 1.3 rounds of the rack's "
               "switch, the 72 NICs making the network levels short; these rows met the model "
               "only while every stage ran at the switch's rate (3 rounds). The same cluster's "
               "one-rack run (the same README) is 30% below its 8 GiB rate at 512 MiB (586 "
               "against 835 GB/s) where the model's single-rack NVLS is 7% below: a cost per "
               "call on the rack's NVLink fabric that shrinks with size, not measured apart "
               "from the sweep")
MISSED = {  # run -> sizes in MiB the model misses, and why
    "ib-coreweave-gb200-2racks": ((512, 1024, 2048), MNNVL_SMALL),
    "tcpxo-a3mega-ztan-2025": ((1,), (
        "GPUDirect-TCPXO at 1 MiB: 36% slower than the model's tree with Simple (203 against "
        "149 us), which the run's environment makes NCCL run (GCP's nccl-env-profile.sh: "
        "NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple, NCCL_BUFFSIZE=8 MiB, NCCL 2.21.5). With " + CHAIN
        + " 2 MiB to 8 GiB are within 27% (within 10% from 16 MiB); below one round (16 "
        "channels x 1 MiB) the whole message crosses the 16 stages in turn, and what the 54 us "
        "left costs (TCPXO's receive path: RxDM bounce buffers, the kernel's unpack of each "
        "step, two TCP flows a connection) is not published")),
    "efa-p4d-dlami-2021": ((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), (
        "NCCL 2.7.8 on EFA (2021): 28.7 GB/s at 1 GiB where the same instance reached 42.5 GB/s "
        "in 2022; the whole sweep is 1.6-2.7x slower than the model: that stack is not modelled")),
    "efa-p4d-eks-2022": ((1, 2, 4, 8, 16, 32, 64, 128, 256), OLD_RING),
    "efa-p4d-dlami-live": ((1, 2, 4, 8, 16, 32, 64, 128, 256), P4D_BUFFER),
    "efa-p4de-awsome-2024": ((64,), P4DE_DIP),
    "efa-p5-awsome-2024": ((1, 2, 4, 16, 32, 64, 128, 256), P5_NVLS_TREE),
    "ib-gj-aion-2n-ring": ((1, 2, 4, 8), LL128_OFF),
    "ib-gj-aion-2n": ((1, 2), LL128_OFF),
    "ib-qoofyk-4n-vm": (((2, 8), TREE_LL128), ((16,), NVLS_TREE_FILL)),
    "ib-gj-aion-4n": (((1, 2, 4, 8), TREE_LL128), ((256,), DIP)),
    "ib-gj-aion-8n": (((4,), TREE_LL128_8N), ((8,), DIP)),
    "ib-gj-aion-8n-tuned": (((128, 256), TUNED_RING), ((8,), DIP)),
}


def _reason(run_id, mib):
    entry = MISSED.get(run_id)
    if entry is None:
        return None
    parts = entry if isinstance(entry[1], tuple) else (entry,)
    return next((why for sizes, why in parts if mib in sizes), None)


def _params():
    for row, rid, node, forced in _rows():
        why = _reason(rid.rsplit("-", 1)[0], int(row["message_bytes"]) // MIB)
        marks = (pytest.mark.xfail(strict=True, reason=why),) if why else ()
        yield pytest.param(row, node, forced, id=rid, marks=marks)


@pytest.mark.parametrize(("row", "node", "forced"), list(_params()))
def test_published_multinode_all_reduce_busbw(catalog, row, node, forced):
    measured = float(row["busbw_gbps"])
    predicted = predicted_busbw(catalog, row, node, forced)
    print(f"{row['message_bytes']} B: measured {measured:.2f} GB/s, model {predicted:.2f} GB/s "
          f"({predicted / measured - 1:+.1%})")
    assert predicted == pytest.approx(measured, rel=tolerance(row))


def test_every_run_of_the_file_is_mapped_and_every_missed_size_exists():
    runs = {_run(row)[0] for row in ROWS}
    assert runs == {run for run, _, _ in RUNS.values()}
    sizes = {(run, int(r["message_bytes"]) // MIB) for r in ROWS for run in [_run(r)[0]]}
    for run, entry in MISSED.items():
        parts = entry if isinstance(entry[1], tuple) else (entry,)
        assert all((run, mib) in sizes for listed, _ in parts for mib in listed)

"""Expert-parallel dispatch and combine: NCCL all-to-all volumes against the analytic formula,
and DeepEP's kernels against DeepEP's published H800 tables (analysis/data/deepep_h800.csv)."""

import csv
from dataclasses import replace

import numpy as np
import pytest

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.topology import LinkKind
from clustersim.simulator.cost.collectives import SINGLE_GPU_PER_NODE_EFFICIENCY
from clustersim.simulator.cost.expert_dispatch import hit_probability
from clustersim.simulator.cost.network import NetworkModel
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace
from clustersim.workloads.model import PRESETS
from clustersim.workloads.dispatch import Dispatcher, TokenRouting
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.trace import CollectiveKind, CollectiveOp
from clustersim.workloads.trace_io import trace_from_dict, trace_to_dict
from clustersim.workloads.training import training_from_mapping

from tests.conftest import REPO

ROWS = list(csv.DictReader((REPO / "analysis/data/deepep_h800.csv").open()))
DISPATCHERS = {"normal": Dispatcher.DEEPEP, "low_latency": Dispatcher.DEEPEP_LL}
TOLERANCE = 0.20


def h800(catalog, gpus: int):
    """8x H800 nodes (the catalog's hgx-h800: NVLink 400 GB/s both directions, one 400 Gb/s
    CX7 NIC per GPU)."""
    return catalog.cluster(device="h800", num_devices=gpus, devices_per_node=8)


def _routing(row: dict) -> TokenRouting:
    return TokenRouting(dispatcher=DISPATCHERS[row["mode"]], tokens=float(row["tokens"]),
                        token_bytes=float(row["token_bytes"]), top_k=int(row["top_k"]),
                        experts=int(row["experts"]), groups=int(row["groups"]),
                        groups_per_token=int(row["groups_per_token"]))


def _benchmark_routing(row: dict, seed: int = 0) -> tuple[float, float]:
    """Mean ranks and nodes a token reaches under the routing DeepEP's benchmark draws
    (tests/legacy/test_internode.py: |N(0,1)| + 1 scores, groups = nodes ranked by their best
    score, min(nodes, 4) kept, then the top-k scores of the kept groups)."""
    rng = np.random.default_rng(seed)
    tokens, experts, k = int(row["tokens"]), int(row["experts"]), int(row["top_k"])
    ep, groups, kept = int(row["ep"]), int(row["groups"]), int(row["groups_per_token"])
    scores = np.abs(rng.standard_normal((tokens, experts))) + 1
    best = scores.reshape(tokens, groups, -1).max(axis=-1)
    keep = np.zeros((tokens, groups), bool)
    np.put_along_axis(keep, np.argsort(-best, axis=1)[:, :kept], True, axis=1)
    masked = np.where(np.repeat(keep, experts // groups, axis=1), scores, 0.0)
    chosen = np.argsort(-masked, axis=1)[:, :k]

    def distinct(blocks):
        return float(np.mean([len(set(row)) for row in chosen // blocks]))
    return distinct(experts // ep), distinct(experts // int(row["nodes"]))


def _measured_s(row: dict) -> float:
    """The time behind a published bandwidth, with the bytes DeepEP's benchmark counts."""
    if row["measured_latency_us"]:
        return float(row["measured_latency_us"]) * 1e-6
    ranks, nodes = _benchmark_routing(row)
    copies = ranks if row["bandwidth_metric"] == "nvlink_recv" else nodes
    return float(row["tokens"]) * copies * float(row["token_bytes"]) / (float(row["measured_gbps"]) * 1e9)


def _predicted_s(catalog, row: dict) -> float:
    ep = int(row["ep"])
    routing = _routing(row)
    return NetworkModel(h800(catalog, ep)).collective_time(
        CollectiveKind.ALL_TO_ALL, routing.payload_bytes, (tuple(range(ep)),), routing=routing)


UNKNOWN = {
    "deepep_ll_ep8_dispatch": "inside one node the low-latency kernels take 77 and 114 us (98 "
    "and 127 GB/s of messages) where the bytes at NVLink speed and one NVLink step give 51 and "
    "87: they send one message per token and expert as NVLink peer stores with a completion "
    "flag each (DeepEP#173, merged 2025-05; the maintainers describe the low-latency kernels "
    "as built for RDMA, DeepEP#22 and #25), and what those stores cost is not published; "
    "DeepEP#173's H20 figures (37 and 59 us at EP8, on NVLink 2.25x as fast) leave a "
    "different remainder, so neither a fixed latency nor a bandwidth derate explains it",
}
UNKNOWN["deepep_ll_ep8_combine"] = UNKNOWN["deepep_ll_ep8_dispatch"]
CASES = [pytest.param(r, id=r["id"], marks=pytest.mark.xfail(strict=True, reason=UNKNOWN[r["id"]]))
         if r["id"] in UNKNOWN else pytest.param(r, id=r["id"]) for r in ROWS]


@pytest.mark.parametrize("row", [r for r in ROWS if r["mode"] == "normal" and int(r["ep"]) > 8],
                         ids=lambda r: r["id"])
def test_fan_out_matches_a_draw_of_deepeps_benchmark_routing(row):
    """Ranks and nodes a token reaches, as the cost model counts them, within 2% of the
    routing DeepEP's benchmark draws (group-limited above 4 nodes)."""
    ranks, nodes = _benchmark_routing(row)
    routing, ep, n = _routing(row), int(row["ep"]), int(row["nodes"])
    assert ep * hit_probability(routing.experts // ep, routing) == pytest.approx(ranks, rel=0.02)
    assert n * hit_probability(routing.experts // n, routing) == pytest.approx(nodes, rel=0.02)


@pytest.mark.parametrize("row", CASES)
def test_deepep_time_within_20_percent_of_its_published_h800_tables(catalog, row):
    """Normal kernels: NVLink and RDMA bytes at the node's NVLink and NIC rates (intranode EP8
    153-158 GB/s, internode 43-58 GB/s); low-latency kernels: their published latencies."""
    assert _predicted_s(catalog, row) == pytest.approx(_measured_s(row), rel=TOLERANCE)


@pytest.mark.slow
def test_deepep_tables_mean_error_under_10_percent(catalog):
    errors = [abs(_predicted_s(catalog, r) / _measured_s(r) - 1) for r in ROWS if r["id"] not in UNKNOWN]
    assert len(errors) == len(ROWS) - len(UNKNOWN)
    assert sum(errors) / len(errors) < 0.10


# --- NCCL all-to-all: what each rank sends --------------------------------------------------

@pytest.mark.parametrize("ep, per_node", [(2, 8), (4, 8), (8, 8), (16, 8), (32, 8), (8, 1), (16, 2)])
def test_all_to_all_sends_tokens_x_hidden_x_bytes_x_top_k_x_ep_minus_1_over_ep(catalog, ep, per_node):
    """Per rank: NVLink bytes + bytes out of its NIC = T x h x b x k x (ep-1)/ep (a lone GPU
    per node drives its NIC at a derated rate, which the plan carries as extra load)."""
    tokens, hidden, elem, top_k = 4096, 4096, 2, 2
    routing = TokenRouting(dispatcher=Dispatcher.ALLTOALL, tokens=tokens, token_bytes=hidden * elem,
                           top_k=top_k, experts=8)
    cluster = catalog.cluster(device="h100-sxm", num_devices=ep, devices_per_node=per_node)
    net = NetworkModel(cluster)
    plan = net.plan(CollectiveKind.ALL_TO_ALL, routing.payload_bytes, (tuple(range(ep)),), routing)
    nic_out = sum(b for (kind, *_), b in plan.loads if kind is LinkKind.NIC_TX) / ep
    nic_out *= SINGLE_GPU_PER_NODE_EFFICIENCY if per_node == 1 else 1.0
    nvlink = plan.intra_s * net.planner.scale_up
    assert nvlink + nic_out == pytest.approx(tokens * hidden * elem * top_k * (ep - 1) / ep)


def test_deepep_sends_each_token_once_per_node_and_once_per_gpu(catalog):
    """DeepSeek-V3's routing (256 experts, top 8, at most 4 of 8 nodes) on EP64: the network
    carries a token to 4 x 7/8 remote nodes on average, not 8 x 56/64 expert copies."""
    routing = TokenRouting(dispatcher=Dispatcher.DEEPEP, tokens=4096, token_bytes=7168, top_k=8,
                           experts=256, groups=8, groups_per_token=4)
    net = NetworkModel(h800(catalog, 64))
    plan = net.plan(CollectiveKind.ALL_TO_ALL, routing.payload_bytes, (tuple(range(64)),), routing)
    nic_out = sum(b for (kind, *_), b in plan.loads if kind is LinkKind.NIC_TX) / 64
    assert nic_out == pytest.approx(4096 * 7168 * 4 * 7 / 8)
    alltoall = replace(routing, dispatcher=Dispatcher.ALLTOALL)
    nccl = net.plan(CollectiveKind.ALL_TO_ALL, alltoall.payload_bytes, (tuple(range(64)),), alltoall)
    assert sum(b for (kind, *_), b in nccl.loads if kind is LinkKind.NIC_TX) / 64 == \
        pytest.approx(4096 * 7168 * 8 * 56 / 64)
    assert plan.time(net.topology) < nccl.time(net.topology)


def test_ep_dispatcher_is_an_enum_named_in_the_error():
    assert strategy_from_mapping({"ep": 8, "dp": 8, "ep_dispatcher": "deepep"}).ep_dispatcher \
        is Dispatcher.DEEPEP
    with pytest.raises(SpecError, match=r"strategy\.ep_dispatcher.*alltoall\|deepep\|deepep_ll"):
        strategy_from_mapping({"ep": 8, "dp": 8, "ep_dispatcher": "nccl"})


@pytest.mark.parametrize("dispatcher", list(Dispatcher))
def test_trace_dispatches_micro_batch_tokens_x_hidden_x_bytes_x_top_k_and_round_trips(dispatcher):
    """Mixtral-8x7B (top 2), seq 4096, micro-batch 1, TP2 with sequence parallelism: each rank
    dispatches and combines its 2048 tokens x 4096 x 2 bytes x 2 experts."""
    model = PRESETS["mixtral-8x7b"]
    strategy = strategy_from_mapping({"tp": 2, "dp": 4, "ep": 4, "sequence_parallel": True,
                                      "ep_dispatcher": dispatcher.value})
    training = training_from_mapping({"seq_len": 4096, "global_batch": 8, "micro_batch": 1,
                                      "precision": "bf16"})
    trace = build_trace(Job(model, training, strategy).checked(8))
    ops = [op for op in trace.programs[0].ops if isinstance(op, CollectiveOp) and op.group == "ep"]
    assert ops and all(op.bytes == 2048 * 4096 * 2 * 2 for op in ops)
    assert {op.routing.dispatcher for op in ops} == {dispatcher}
    assert trace_from_dict(trace_to_dict(trace)) == trace


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_multi_node_all_to_all_runs_at_the_nics_rate_times_n_over_n_minus_1(catalog, nodes):
    """NCCL's all-to-all across nodes of 8 H100 is bound by each GPU's NIC; its nccl-tests bus
    bandwidth is 'N/(N-1)x the bandwidth per GPU, N being the number of nodes' (sjeaugey,
    NVIDIA/nccl-tests#130): (n-1)/n of the buffer leaves the GPU, (n-g)/n of it through the NIC.
    Large messages, within 3% (latency)."""
    gpus = 8 * nodes
    cluster = catalog.cluster(device="h100-sxm", num_devices=gpus)
    net = NetworkModel(cluster)
    nbytes = 2.0 ** 30
    seconds = net.collective_time(CollectiveKind.ALL_TO_ALL, nbytes, (tuple(range(gpus)),))
    busbw = nbytes / seconds * (gpus - 1) / gpus
    nic = net.topology.nic_capacity
    assert busbw == pytest.approx(nic * (gpus - 1) / (gpus - 8), rel=0.03)
    assert busbw == pytest.approx(nic * nodes / (nodes - 1), rel=0.08)

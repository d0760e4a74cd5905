"""The host's eager kernel issue (``HostOp``, ``Strategy.cuda_graphs``): the host issues every
op in program order, each kernel at the measured eager cost, and runs ahead of the device
except at a device-to-host sync. Only what follows a sync can leave the device waiting."""

from __future__ import annotations

import dataclasses

import pytest

from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.cost.host import EAGER_ISSUE_S, issue_time
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.dispatch import Dispatcher
from clustersim.workloads.model import from_mapping
from clustersim.workloads.routing import MoeRouting
from clustersim.workloads.strategy import CudaGraphs, strategy_from_mapping
from clustersim.workloads.trace import CollectiveOp, ComputeOp, HostOp, Program
from clustersim.workloads.trace_io import trace_from_dict, trace_to_dict
from tests.test_engine_log import MS, compute, log, replay, trace
from tests.test_folding import _assert_identical, _both
from tests.test_moe_trace import SMALL_DEEPSEEK

ISSUE_MS = EAGER_ISSUE_S / MS


def test_the_eager_cost_is_te_issue_2053s_torch_linear_on_each_host(catalog):
    """13.48 us of CPU time per torch.nn.Linear forward (one GEMM kernel) on the DGX H100's
    Xeon Platinum 8480C (every x86 node's), 33.17 us on GH200's and 37.08 us on GB200's Grace
    (GB300's trays carry the same Grace); a slow host's longer launch time wins."""
    assert EAGER_ISSUE_S == 13.48e-6
    hosts = {name: catalog.nodes[name].eager_issue_s for name in
             ("dgx-h100", "dgx-b200", "jupiter-gh200", "gb200-nvl72", "azure-nd-gb200-v6",
              "gb300-nvl72")}
    assert hosts == pytest.approx({"dgx-h100": 13.48e-6, "dgx-b200": 13.48e-6,
                                   "jupiter-gh200": 33.17e-6, "gb200-nvl72": 37.08e-6,
                                   "azure-nd-gb200-v6": 37.08e-6, "gb300-nvl72": 37.08e-6},
                                  rel=1e-12)
    assert issue_time(10, EAGER_ISSUE_S) == pytest.approx(134.8e-6, rel=1e-12)
    assert issue_time(10, EAGER_ISSUE_S, slow_host_s=40e-6) == pytest.approx(400e-6, rel=1e-12)


def _two_ops(sync: bool, launches: int):
    """c0 (20 ms, one kernel), then c1 (1 ms) whose ``launches`` kernels the host issues after
    c0's (and, with ``sync``, only once c0 has ended: a device-to-host read)."""
    return trace(Program("stage0", (0, 1), (
        HostOp(0, "c0.issue", 1), compute(1, "c0:20", (0,)),
        HostOp(2, "c1.issue", launches, deps=(1,) if sync else ()), compute(3, "c1:1", (1, 2)))))


def test_the_host_runs_ahead_of_the_device_without_a_sync():
    """1,000 launches (13.48 ms of host time) are issued while c0 still runs: c1 starts when
    c0 ends, only c0's own issue is exposed."""
    result = replay(_two_ops(sync=False, launches=1000))
    assert log(result) == [
        (0, "c0.issue", "host", 0, round(ISSUE_MS, 9), "host"),
        (0, "c1.issue", "host", round(ISSUE_MS, 9), round(1001 * ISSUE_MS, 9), "host"),
        (0, "c0:20", "compute", round(ISSUE_MS, 9), round(ISSUE_MS + 20, 9), "forward"),
        (0, "c1:1", "compute", round(ISSUE_MS + 20, 9), round(ISSUE_MS + 21, 9), "forward"),
    ]


def test_after_a_sync_the_device_waits_for_the_host_to_issue_the_stretch():
    """The host reads c0's result, then spends 13.48 ms issuing c1's 1,000 kernels: the device
    idles that long (charged to host issue), host-bound; 10 launches after the sync cost
    0.135 ms."""
    result = replay(_two_ops(sync=True, launches=1000))
    start = ISSUE_MS + 20 + 1000 * ISSUE_MS
    assert [(r.name, round(r.start / MS, 9)) for r in result.records
            if r.name == "c1:1"] == [("c1:1", round(start, 9))]
    assert result.step_time_s == pytest.approx((start + 1) * MS, rel=1e-12)
    assert result.breakdown.host_s == pytest.approx((ISSUE_MS + 1000 * ISSUE_MS) * MS,
                                                    rel=1e-9)
    assert result.breakdown.other_s == 0.0
    assert result.breakdown.total_s == pytest.approx(result.step_time_s, rel=1e-12)
    short = replay(_two_ops(sync=True, launches=10))
    assert short.step_time_s == pytest.approx((ISSUE_MS + 21 + 10 * ISSUE_MS) * MS, rel=1e-12)


def _moe_job(graphs: CudaGraphs, moe: MoeRouting = MoeRouting(), **strategy) -> Job:
    training = TrainingSpec(seq_len=512, global_batch=8, moe=moe)
    s = Strategy(**({"dp": 4, "pp": 2, "ep": 4, "cuda_graphs": graphs} | strategy))
    return Job(from_mapping(SMALL_DEEPSEEK), training, s).checked(8)


def _host_ops(t, program=None):
    programs = t.programs if program is None else (t.programs[program],)
    return [op for p in programs for op in p.ops if isinstance(op, HostOp)]


def test_by_default_every_kernel_is_graphed_and_the_trace_has_no_host_ops():
    assert Strategy().cuda_graphs is CudaGraphs.FULL
    assert strategy_from_mapping({}).cuda_graphs is CudaGraphs.FULL
    assert not _host_ops(build_trace(_moe_job(CudaGraphs.FULL)))


def test_dropless_forward_dispatches_wait_for_the_router_and_padded_ones_do_not():
    t = build_trace(_moe_job(CudaGraphs.NONE))
    ops = t.programs[0].ops
    waiting = [op for op in _host_ops(t, 0) if op.deps]
    assert waiting and all(ops[op.id + 1].name.endswith("ep_dispatch") for op in waiting)
    assert all(not ops[op.id + 1].name.startswith("bwd") for op in waiting)
    assert all(op.deps == ops[op.id + 1].deps[:1] for op in waiting)   # the router's end
    every_op = [op for op in ops if isinstance(op, (ComputeOp, CollectiveOp))]
    assert all(isinstance(ops[op.id - 1], HostOp) for op in every_op)
    padded = build_trace(_moe_job(CudaGraphs.NONE, MoeRouting(capacity_factor=1.0,
                                                              pad_to_capacity=True)))
    assert _host_ops(padded) and not [op for op in _host_ops(padded) if op.deps]


def test_under_deepep_the_host_reads_the_counts_before_the_grouped_gemms():
    """DeepEP and HybridEP return the counts on the device; TEGroupedMLP reads them (tolist)
    before the experts, so the host waits for the dispatch there."""
    t = build_trace(_moe_job(CudaGraphs.NONE, ep_dispatcher=Dispatcher.DEEPEP))
    ops = t.programs[0].ops
    waiting = [op for op in _host_ops(t, 0) if op.deps]
    assert waiting and all(ops[op.id + 1].name.endswith("mlp.experts") for op in waiting)
    assert all(ops[op.deps[0]].name.endswith("ep_dispatch") for op in waiting)


def test_moe_router_graphs_issue_the_forward_router_as_one_launch():
    """(The backward's router op holds the shared experts too, which no graph holds.)"""
    eager = build_trace(_moe_job(CudaGraphs.NONE)).programs[0].ops
    graphed = build_trace(_moe_job(CudaGraphs.MOE_ROUTER)).programs[0].ops

    def router_launches(ops):
        return {ops[op.id - 1].launches for op in ops
                if isinstance(op, ComputeOp) and op.name.endswith("mlp.router")
                and op.name.startswith("fwd")}
    assert router_launches(graphed) == {1}
    assert min(router_launches(eager)) > 1


def test_host_ops_fold_exactly_and_survive_json(catalog):
    t = build_trace(_moe_job(CudaGraphs.NONE))
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    _assert_identical(*_both(t, cluster))
    _assert_identical(*_both(t, cluster, faults=Faults(launch_overhead_s={3: 40e-6})))
    assert trace_from_dict(trace_to_dict(t)) == t


def test_expanded_lanes_give_the_collapsed_step_time(catalog):
    t = build_trace(_moe_job(CudaGraphs.NONE))
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    faults = Faults(launch_overhead_s={3: 40e-6})
    step = [StepSimulation(t, cluster, SimulationOptions(expand=expand, record=False),
                           faults).run().step_time_s for expand in (False, True)]
    assert step[1] == pytest.approx(step[0], rel=1e-12, abs=0.0)


def test_a_sync_makes_the_eager_step_slower_than_the_graphed_one(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)

    def step(graphs):
        return StepSimulation(build_trace(_moe_job(graphs)), cluster).run().step_time_s
    full, eager = step(CudaGraphs.FULL), step(CudaGraphs.NONE)
    assert eager > full


def test_unknown_graph_scope_is_an_error_naming_the_field():
    from clustersim.hardware_specs import SpecError
    with pytest.raises(SpecError, match="cuda_graphs"):
        strategy_from_mapping({"cuda_graphs": "attn"})


def test_cuda_graphs_is_kept_in_the_strategy_dict():
    s = dataclasses.replace(Strategy(), cuda_graphs=CudaGraphs.MOE_ROUTER)
    assert s.to_dict()["cuda_graphs"] == "moe_router"
    assert strategy_from_mapping({"cuda_graphs": "moe_router"}).cuda_graphs is CudaGraphs.MOE_ROUTER


def test_moe_router_graphs_on_a_dense_model_are_an_error(catalog):
    from clustersim.hardware_specs import SpecError
    from tests.conftest import tiny_job
    with pytest.raises(SpecError, match=r"strategy\.cuda_graphs: moe_router"):
        tiny_job(Strategy(dp=2, cuda_graphs=CudaGraphs.MOE_ROUTER))


def test_a_dense_model_issued_eagerly_never_waits_for_the_device():
    from tests.conftest import tiny_job
    t = build_trace(tiny_job(Strategy(dp=2, tp=2, cuda_graphs=CudaGraphs.NONE)))
    assert _host_ops(t) and not [op for op in _host_ops(t) if op.deps]


def test_attn_graphs_launch_each_attention_module_once_and_the_router_too():
    """``attn_moe_router``: the attention module (its kernels and its TP communication)
    replays from one graph, one launch issued before its first op; later ops of the module
    follow that launch and issue nothing of their own. The forward router stays graphed."""
    graphed = build_trace(_moe_job(CudaGraphs.ATTN_MOE_ROUTER, tp=2, dp=2, etp=1, sequence_parallel=True)).programs[0].ops
    router = build_trace(_moe_job(CudaGraphs.MOE_ROUTER, tp=2, dp=2, etp=1, sequence_parallel=True)).programs[0].ops

    def attention_launches(ops):
        return sum(op.launches for op in ops if isinstance(op, HostOp) and ".attn" in op.name)
    attn_ops = [op for op in graphed if ".attn" in op.name and not isinstance(op, HostOp)]
    modules = {op.name.split(".attn")[0] for op in attn_ops}
    assert attention_launches(graphed) == len(modules)
    assert attention_launches(router) > 2 * len(modules)
    for op in attn_ops:   # each waits for its module's one launch
        assert any(isinstance(graphed[d], HostOp) and graphed[d].name.split(".attn")[0]
                   == op.name.split(".attn")[0] for d in op.deps)
    assert {graphed[op.id - 1].launches for op in graphed if isinstance(op, ComputeOp)
            and op.name.startswith("fwd") and op.name.endswith("mlp.router")} == {1}
    assert strategy_from_mapping({"cuda_graphs": "attn_moe_router"}).cuda_graphs \
        is CudaGraphs.ATTN_MOE_ROUTER


def test_a_grace_host_issues_each_kernel_at_its_own_measured_cost(catalog):
    """The same eager trace on a GB200 rack (Grace host, 37.08 us a kernel) and on DGX B200s
    (x86, 13.48 us): each host op takes its node's cost times its launches."""
    t = build_trace(_moe_job(CudaGraphs.NONE))

    def issue_ms(node):
        cluster = catalog.cluster(device=catalog.nodes[node].device, num_devices=8, node=node)
        result = StepSimulation(t, cluster).run()
        ops = t.programs[0].ops
        return {r.name: (r.end - r.start) / MS / ops[r.op_id].launches for r in result.records
                if r.rank_class == 0 and isinstance(ops[r.op_id], HostOp)}
    grace, xeon = issue_ms("gb200-nvl72"), issue_ms("dgx-b200")
    assert grace and sorted(grace.values()) == pytest.approx([37.08e-3] * len(grace), rel=1e-9)
    assert xeon and sorted(xeon.values()) == pytest.approx([13.48e-3] * len(xeon), rel=1e-9)

"""Engine invariants: pipeline bubbles, rank-class collapse, monotonicity, determinism."""

from dataclasses import replace

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.simulator import SimulationOptions, StepSimulation, simulate
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.memory import MemoryModel
from clustersim.simulator.cost.network import Algorithm, NetworkModel, Plan, Protocol
from clustersim.workloads import Recompute, Schedule, Strategy
from clustersim.workloads.builder import build_trace
from clustersim.workloads.trace_io import trace_from_dict, trace_to_dict

from tests.conftest import tiny_job


FREE = Plan(Algorithm.DIRECT, Protocol.SIMPLE, 0.0, 0.0, ())


class FreeNetwork(NetworkModel):
    """Communication that takes no time: leaves a compute-only schedule."""

    def plan(self, kind, nbytes, instances, routing=None):
        return FREE

    def p2p_plan(self, nbytes, pairs):
        return FREE


class LayersOnly(ComputeModel):
    """Embedding and LM head cost nothing: every stage does the same work."""

    def op_time(self, op):
        return 0.0 if op.name.endswith((".embedding", ".head")) else super().op_time(op)


WIDE = {"hidden": 4096, "heads": 32, "vocab": 128}


def _run(job, cluster, **kw):
    return StepSimulation(build_trace(job), cluster, **kw).run()


def _schedule_only(job, cluster):
    """A compute-only run of identical stages: what the pipeline schedule alone costs."""
    return _run(job, cluster, network=FreeNetwork(cluster), compute=LayersOnly(cluster.device))


@pytest.mark.parametrize("pp, micro", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_1f1b_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(catalog, pp, micro):
    cluster = catalog.cluster(device="h100-sxm", num_devices=pp)
    job = tiny_job(Strategy(pp=pp), global_batch=micro, layers=2 * pp, **WIDE)
    first = _schedule_only(job, cluster).classes[0].breakdown
    idle = first.bubble_s / (first.bubble_s + first.compute_s)
    assert idle == pytest.approx((pp - 1) / (micro + pp - 1), rel=1e-3)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_divides_the_bubble_by_v(catalog, v):
    pp, micro = 4, 8
    cluster = catalog.cluster(device="h100-sxm", num_devices=pp)
    plain = _schedule_only(tiny_job(Strategy(pp=pp), global_batch=micro, layers=16, **WIDE),
                           cluster)
    inter = _schedule_only(tiny_job(Strategy(pp=pp, schedule=Schedule.INTERLEAVED,
                                             virtual_stages=v),
                                    global_batch=micro, layers=16, **WIDE), cluster)
    assert inter.classes[0].breakdown.bubble_s == pytest.approx(
        plain.classes[0].breakdown.bubble_s / v, rel=1e-3)


STRATEGIES = [
    Strategy(tp=2, pp=2, dp=4, sequence_parallel=True, zero=1, recompute=Recompute.SELECTIVE),
    Strategy(tp=2, pp=2, dp=2, cp=2, zero=1),
    Strategy(pp=4, dp=4, schedule=Schedule.INTERLEAVED, virtual_stages=2, recompute=Recompute.FULL),
    Strategy(dp=16, zero=3),
    Strategy(tp=4, dp=4, zero=2),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: f"tp{s.tp}pp{s.pp}dp{s.dp}cp{s.cp}z{s.zero}")
def test_collapsed_and_expanded_runs_agree(catalog, strategy):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    job = tiny_job(strategy, global_batch=16)
    collapsed = _run(job, cluster)
    per_rank = _run(job, cluster, options=SimulationOptions(expand=True), lanes=False)
    lanes = _run(job, cluster, options=SimulationOptions(expand=True))
    assert len(per_rank.classes) == 16 and len(collapsed.classes) == strategy.pp
    assert per_rank.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12)
    assert lanes.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12)
    assert len(lanes.rank_finish_s) == 16


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: f"tp{s.tp}pp{s.pp}dp{s.dp}cp{s.cp}z{s.zero}")
def test_breakdown_sums_to_step_time_for_every_class(catalog, strategy):
    cluster = catalog.cluster(device="a100-80gb", num_devices=16)
    result = _run(tiny_job(strategy, global_batch=32), cluster)
    for c in result.classes:
        assert c.breakdown.total_s == pytest.approx(c.finish_s, rel=1e-9)
    assert result.breakdown.total_s == pytest.approx(result.step_time_s, rel=1e-9)


def _scaled_cluster(cluster, flops=1.0, bandwidth=1.0):
    device = replace(cluster.device, peak_flops={d: v * flops for d, v in cluster.device.peak_flops.items()},
                     memory_bandwidth=cluster.device.memory_bandwidth * flops)
    node = replace(cluster.node, scale_up_bandwidth=cluster.node.scale_up_bandwidth * bandwidth,
                   nic_bandwidth=cluster.node.nic_bandwidth * bandwidth)
    return replace(cluster, device=device, node=node)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: f"tp{s.tp}pp{s.pp}dp{s.dp}cp{s.cp}z{s.zero}")
@pytest.mark.parametrize("flops, bandwidth", [(2.0, 1.0), (1.0, 2.0), (1.0, 10.0), (1.5, 1.5)])
def test_more_bandwidth_or_flops_never_makes_a_step_slower(catalog, strategy, flops, bandwidth):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    job = tiny_job(strategy, global_batch=32)
    base = _run(job, cluster).step_time_s
    faster = _run(job, _scaled_cluster(cluster, flops, bandwidth)).step_time_s
    assert faster <= base * (1 + 1e-12)


def test_same_config_same_result(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    job = tiny_job(STRATEGIES[0], global_batch=32)
    a = simulate(build_trace(job), cluster).to_dict()
    b = simulate(build_trace(job), cluster).to_dict()
    a["simulation"].pop("wall_time_s"), b["simulation"].pop("wall_time_s")
    assert a == b


def test_trace_survives_a_json_round_trip(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    trace = build_trace(tiny_job(STRATEGIES[1], global_batch=16))
    again = trace_from_dict(trace_to_dict(trace))
    assert again == trace
    assert simulate(again, cluster).step_time_s == simulate(trace, cluster).step_time_s


def test_a_straggler_splits_its_class_and_slows_the_step(catalog):
    from clustersim.simulator import Faults
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    job = tiny_job(STRATEGIES[0], global_batch=16)
    healthy = simulate(build_trace(job), cluster)
    slow = simulate(build_trace(job), cluster, faults=Faults(compute_slowdown={5: 1.5}))
    assert len(slow.classes) > len(healthy.classes)
    assert slow.step_time_s > healthy.step_time_s * 1.1


def test_deepspeed_era_zero3_reduces_per_tensor_and_gathers_after_a_device_sync():
    """Per-tensor ZeRO-3 as DeepSpeed ran it in 2021: one reduce-scatter per parameter from a
    list of per-rank slices (a copy per rank), and every gather waits for the reduce-scatters
    in flight (``torch.cuda.synchronize()`` before each per-parameter all-gather)."""
    from clustersim.workloads.shards import layer_tensors
    from clustersim.workloads.strategy import Zero3Granularity, Zero3Prefetch
    from clustersim.workloads.trace import CollectiveKind, CollectiveOp
    job = tiny_job(Strategy(dp=8, zero=3, zero3_granularity=Zero3Granularity.TENSOR,
                            zero3_prefetch=Zero3Prefetch.NONE), global_batch=8, layers=2)
    ops = build_trace(job).programs[0].ops
    coll = [o for o in ops if isinstance(o, CollectiveOp)]
    rs = [o for o in coll if o.kind is CollectiveKind.REDUCE_SCATTER and ".layer" in o.name]
    tensors = len(layer_tensors(job.model, 0))
    assert len(rs) == job.model.layers * tensors and all(o.per_rank_copies for o in rs)
    # The backward gather of layer 0 (after layer 1's backward) waits for layer 1's last
    # reduce-scatter, not only for the compute before it.
    last_rs_layer1 = max(o.id for o in rs if "layer1" in o.name)
    gather0 = next(o for o in coll if o.name == "bwd0.layer0.zero3_all_gather.t0")
    assert last_rs_layer1 in gather0.deps


def test_zero3_backward_only_prefetch_exposes_the_forward_gathers(catalog):
    """FSDP2 on a CPU prefetches backward gathers only: forward ones wait for the layer before,
    so the step sits between full prefetch and none, and only its forward got slower."""
    from clustersim.workloads.strategy import Zero3Prefetch
    cluster = catalog.cluster(device="a100-80gb", num_devices=8)
    steps = {p: _run(tiny_job(Strategy(dp=8, zero=3, zero3_prefetch=p), global_batch=8,
                              layers=4), cluster).step_time_s
             for p in Zero3Prefetch}
    assert steps[Zero3Prefetch.ALL] < steps[Zero3Prefetch.BACKWARD] < steps[Zero3Prefetch.NONE]


def test_zero3_prefetch_reads_booleans_and_names():
    from clustersim.workloads.strategy import Zero3Prefetch, strategy_from_mapping
    assert strategy_from_mapping({"zero3_prefetch": False}).zero3_prefetch is Zero3Prefetch.NONE
    assert strategy_from_mapping({}).zero3_prefetch is Zero3Prefetch.ALL
    assert strategy_from_mapping({"zero3_prefetch": "backward"}).zero3_prefetch \
        is Zero3Prefetch.BACKWARD
    with pytest.raises(SpecError, match="zero3_prefetch: expected true, false or one of"):
        strategy_from_mapping({"zero3_prefetch": "sometimes"})


def test_offload_tier_sets_the_copy_bandwidth(catalog):
    """ZeRO-Infinity to local NVMe: 8 GPUs of a DGX H100 share its 8 drives (56 GB/s read,
    28 GB/s write: 7 and 3.5 GB/s each), far below PCIe Gen5 (64 GB/s); host DRAM (563 GB/s
    for 8) leaves PCIe the limit."""
    from clustersim.analysis.config import offload_tier
    from clustersim.workloads.trace import CopyKind
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    dram = MemoryModel(cluster)
    nvme = MemoryModel(replace(cluster, offload_tier=offload_tier(catalog, "dgx-h100-nvme")))
    gb = 1e9
    assert dram.copy_time(CopyKind.DEVICE_TO_HOST, gb) == pytest.approx(10e-6 + gb / 64e9)
    assert nvme.copy_time(CopyKind.DEVICE_TO_HOST, gb) == pytest.approx(10e-6 + gb / 3.5e9)
    assert nvme.copy_time(CopyKind.HOST_TO_DEVICE, gb) == pytest.approx(10e-6 + gb / 7e9)
    assert nvme.copy_time(CopyKind.HOST_COMPUTE, gb) == pytest.approx(gb / 7e9)
    with pytest.raises(SpecError, match="strategy.offload_tier: parallel-fs is parallel_fs"):
        offload_tier(catalog, "parallel-fs")


def test_flashattention3_runs_at_its_in_training_figure_on_hopper_and_as_fa2_elsewhere(catalog):
    """FA3-class kernels on H100: 0.45 of peak measured inside a training step (447 TFLOPS on
    H200), with no in-training factor on top; A100 has none and runs FlashAttention-2."""
    from clustersim.hardware_specs import Dtype, OpClass
    from clustersim.workloads.layer_ops import Kernel

    def kernel(op):   # 16 sequences x 32 heads of 8K tokens, head dim 128
        return Kernel("flash_attn", op, 1e14, 1e9, 8192, 8192, 128, 512, Dtype.BF16)

    h100 = ComputeModel(catalog.device("h100-sxm"))
    assert h100.efficiency(kernel(OpClass.ATTENTION_FA3)) == pytest.approx(0.45, rel=0.02)
    fa2 = h100.efficiency(kernel(OpClass.ATTENTION))
    assert fa2 == pytest.approx(0.35 * 0.51, rel=0.02)
    a100 = ComputeModel(catalog.device("a100-80gb"))
    assert a100.kernel_time(kernel(OpClass.ATTENTION_FA3)) == a100.kernel_time(
        kernel(OpClass.ATTENTION))


def test_flash3_changes_the_kernel_not_the_memory(catalog):
    from clustersim.workloads import AttentionKernel
    from clustersim.workloads.memory import memory_per_stage
    job = tiny_job(Strategy(dp=2), seq_len=4096, **WIDE)
    fa3 = replace(job, training=replace(job.training, attention=AttentionKernel.FLASH3))
    assert memory_per_stage(fa3.model, fa3.training, fa3.strategy) == memory_per_stage(
        job.model, job.training, job.strategy)
    h100 = catalog.cluster(device="h100-sxm", num_devices=2)
    assert _run(fa3, h100).step_time_s < _run(job, h100).step_time_s
    a100 = catalog.cluster(device="a100-80gb", num_devices=2)
    assert _run(fa3, a100).step_time_s == _run(job, a100).step_time_s


def _collective_bytes(trace, group, kind=None):
    return sum(op.bytes for prog in trace.programs for op in prog.ops
               if getattr(op, "group", None) == group and (kind is None or op.kind is kind))


def test_tp_comm_overlap_streams_the_tensor_parallel_collectives_beside_the_gemms(catalog):
    """Megatron-Core's --tp-comm-overlap: the same bytes move, but only a first and a last
    chunk of each all-gather / reduce-scatter wait; the rest runs beside the GEMMs."""
    base = tiny_job(Strategy(tp=4, sequence_parallel=True), seq_len=4096, **WIDE)
    over = replace(base, strategy=replace(base.strategy, tp_comm_overlap=True))
    cluster = catalog.cluster(device="h100-sxm", num_devices=4)
    assert _collective_bytes(build_trace(over), "tp") == pytest.approx(
        _collective_bytes(build_trace(base), "tp"))
    plain, overlapped = _run(base, cluster), _run(over, cluster)
    assert overlapped.breakdown.exposed_comm_s["tp"] < 0.5 * plain.breakdown.exposed_comm_s["tp"]
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.step_time_s >= overlapped.breakdown.compute_s


def test_overlap_param_gather_moves_the_gather_into_the_next_forward(catalog):
    from clustersim.workloads.trace import CollectiveKind
    base = tiny_job(Strategy(dp=8, zero=1), global_batch=32, seq_len=2048, **WIDE)
    over = replace(base, strategy=replace(base.strategy, overlap_param_gather=True))
    gathered = {job: _collective_bytes(build_trace(job), "dp", CollectiveKind.ALL_GATHER)
                for job in (base, over)}
    assert gathered[over] == pytest.approx(gathered[base])
    cluster = catalog.cluster(device="h100-sxm", num_devices=16, devices_per_node=2)
    plain, overlapped = _run(base, cluster), _run(over, cluster)
    assert overlapped.breakdown.exposed_comm_s["dp"] < plain.breakdown.exposed_comm_s["dp"]
    assert overlapped.step_time_s < plain.step_time_s


@pytest.mark.parametrize("fields, message", [
    ({"tp": 2, "tp_comm_overlap": True}, "strategy.tp_comm_overlap: needs sequence_parallel"),
    ({"dp": 2, "overlap_param_gather": True}, "strategy.overlap_param_gather: needs the "
                                              "distributed optimizer (zero 1 or 2), got zero 0"),
])
def test_overlaps_without_what_they_need_are_errors(fields, message):
    from clustersim.workloads.strategy import check_strategy, strategy_from_mapping
    job = tiny_job(Strategy(), **WIDE)
    with pytest.raises(SpecError) as err:
        check_strategy(strategy_from_mapping(fields), job.model, job.training)
    assert str(err.value).startswith(message)


def test_waiting_on_offload_copies_is_charged_to_offload_not_other():
    """ZeRO-3 with parameters offloaded to host memory: the compute stream waits on the
    host-to-device copies, and the breakdown names them (it said "other" before)."""
    from clustersim.analysis.config import config_from_mapping
    from clustersim.analysis.step import run_step
    base = {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch": 64},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}
    offloaded = run_step(config_from_mapping(
        {**base, "strategy": {"dp": 8, "zero": 3, "recompute": "full", "offload": "params"}}))
    b = offloaded.result.breakdown
    assert b.offload_s > 0.02 * offloaded.result.step_time_s
    assert b.other_s < 1e-6 * offloaded.result.step_time_s
    assert b.total_s == pytest.approx(offloaded.result.step_time_s, rel=1e-9)
    kept = run_step(config_from_mapping(
        {**base, "strategy": {"dp": 8, "zero": 3, "recompute": "full"}})).result.breakdown
    assert kept.offload_s == 0.0

"""One home for shard sizes: what the trace gathers and reduces is what the memory model says
each device holds (issue: with 8 experts, dp=8, zero=3 the trace gathered 140 MiB per layer at
every ep while the memory model counted 132, 66 and 33 MiB of expert weights)."""

import itertools
from dataclasses import replace

import pytest

from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.axes import EXPERT_DATA_GROUP, Axis
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.memory import memory_per_stage
from clustersim.workloads.model import PRESETS, from_mapping
from clustersim.workloads.model_sources import preset_names, resolve
from clustersim.workloads.shards import ParamKind, layer_tensors, mtp_tensors, stage_shards
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, Stream

MIB = 2.0**20

# The issue's model: h = 1024 MHA (8 MiB of attention per layer in 16-bit), 8 SwiGLU experts
# of 2816 (132 MiB per layer in 16-bit).
ISSUE_MOE = {"name": "moe-issue", "layers": 4, "hidden": 1024, "heads": 16, "vocab": 256,
             "mlp": "swiglu", "ffn_hidden": 2816, "num_experts": 8, "top_k": 2}
# Every kind of tensor: biases (row-parallel ones stay whole over TP), LayerNorm with bias,
# learned positions, a dense first layer, a shared expert, a router bias.
RICH_MOE = {"name": "moe-rich", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4,
            "vocab": 1000, "mlp": "swiglu", "ffn_hidden": 1024, "num_experts": 8, "top_k": 2,
            "bias": True, "position": "learned", "max_positions": 1024, "shared_experts": 1,
            "router_bias": True, "first_dense_layers": 1}


def _job(model: dict, strategy: Strategy, global_batch: int = 8) -> Job:
    training = TrainingSpec(seq_len=256, global_batch=global_batch, micro_batch=1)
    return Job(from_mapping(model), training, strategy).checked(strategy.world_size)


def _group_size(trace, op) -> int:
    return len(trace.group_sets[op.group].groups[0])


def _moved(trace, stage: int, kinds, prefix: str = "") -> float:
    """What the stage's data-parallel collectives bring in from the other ranks, per device:
    bytes x (1 - 1/n) over a group of n (the share a device did not hold already)."""
    return sum(op.bytes * (1 - 1 / _group_size(trace, op)) for op in trace.programs[stage].ops
               if isinstance(op, CollectiveOp) and op.stream is Stream.DP
               and op.group != "embedding" and op.kind in kinds and op.name.startswith(prefix))


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_the_issue_example_gathers_what_the_memory_model_shards(ep):
    """8 experts, dp=8, zero=3: each layer gathers its 8 MiB of dense weights over the 8 data
    ranks and its 132/ep MiB of experts over the 8/ep ranks holding the same experts."""
    job = _job(ISSUE_MOE, Strategy(dp=8, ep=ep, zero=3))
    ops = build_trace(job).programs[0].ops
    layer = [op for op in ops if isinstance(op, CollectiveOp) and op.name.startswith(
        "fwd0.layer1.zero3_all_gather")]
    by_group = {op.group: op.bytes / MIB for op in layer}
    expert_group = Axis.DP.value if ep == 1 else EXPERT_DATA_GROUP
    dense = 4 * 1024 * 1024 * 2 / MIB + 2 * 1024 * 2 / MIB + 8 * 1024 * 2 / MIB  # + norms, router
    assert sum(by_group.values()) == pytest.approx(dense + 132.0 / ep)
    assert by_group[expert_group] - (dense if ep == 1 else 0.0) == pytest.approx(132.0 / ep)
    memory = memory_per_stage(job.model, job.training, job.strategy)[0]
    whole = memory_per_stage(job.model, job.training, replace(job.strategy, zero=0))[0]
    experts_held = 4 * 132.0 / ep * MIB       # four layers, before ZeRO
    assert whole.memory.weights - memory.memory.weights == pytest.approx(
        experts_held * (1 - ep / 8) + (whole.memory.weights - experts_held) * (1 - 1 / 8))


GRID = [(tp, etp, ep, zero, pp)
        for tp, etp, ep, zero, pp in itertools.product((1, 2), (0, 1), (1, 2, 4, 8), (0, 1, 2, 3),
                                                       (1, 2))
        if not (zero == 3 and pp > 1) and not (etp and tp == 1) and ep * (etp or tp) <= 4 * tp]


@pytest.mark.parametrize("tp, etp, ep, zero, pp", GRID)
def test_what_the_trace_moves_plus_what_a_device_keeps_is_the_whole_state(tp, etp, ep, zero, pp):
    """For every stage: the gradient reductions of a step (ZeRO-3: of one micro-batch) carry
    what ZeRO-2 leaves unsharded, and ZeRO-3's gathers of one forward and ZeRO-1/2's gather of
    the updated parameters bring what the memory model shards (etp = 1: experts folded over the
    stage apart from attention's TP, Megatron-Core's parallel folding)."""
    job = _job(RICH_MOE, Strategy(tp=tp, etp=etp, dp=4, ep=ep, zero=zero, pp=pp,
                                  sequence_parallel=tp > 1 and etp > 0))
    trace = build_trace(job)

    def memory(z):
        return memory_per_stage(job.model, job.training, replace(job.strategy, zero=z))

    whole, sharded = memory(0), memory(zero)
    grads_sharded = memory(2)
    reductions = (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
    for stage in range(pp):
        unsharded = whole[stage].memory
        prefix = "bwd0." if zero == 3 else ""
        reduced = _moved(trace, stage, reductions, prefix)
        assert reduced + grads_sharded[stage].memory.gradients == pytest.approx(
            unsharded.gradients, rel=1e-12)
        if zero == 3:
            gathered = _moved(trace, stage, (CollectiveKind.ALL_GATHER,), "fwd0.")
            assert gathered + sharded[stage].memory.weights == pytest.approx(
                unsharded.weights, rel=1e-12)
        elif zero >= 1:
            # The updated 16-bit parameters come back from the ranks that updated them.
            gathered = _moved(trace, stage, (CollectiveKind.ALL_GATHER,))
            assert gathered * 6 + sharded[stage].memory.optimizer == pytest.approx(
                unsharded.optimizer, rel=1e-12)


@pytest.mark.parametrize("name", list(PRESETS) + list(preset_names()))
def test_layer_tensors_add_up_to_the_models_layer_parameters(name):
    model = PRESETS[name] if name in PRESETS else resolve(name)
    kinds = {model.is_moe_layer(i): i for i in range(model.layers)}
    for layer in kinds.values():
        tensors = layer_tensors(model, layer)
        dense = sum(t.params for t in tensors if t.kind is ParamKind.DENSE)
        expert = sum(t.params for t in tensors if t.kind is ParamKind.EXPERT)
        assert (dense, expert) == model.layer_parts(layer)


def test_tensor_parallel_keeps_norms_router_and_row_parallel_biases_whole():
    """Megatron: LayerNorms, the router and RowParallelLinear's bias are whole on every TP
    rank; the rest of a layer is split."""
    model = from_mapping(RICH_MOE)
    plan = stage_plans(model, Strategy(tp=4, dp=2))[0]
    dense = stage_shards(model, Strategy(tp=4, dp=2), plan).layers[1][0].params
    h, e = model.hidden, model.num_experts
    whole = 4 * h + h + h * e + e + h      # 2 LayerNorms (w, b), attn-out bias, router, fc2 bias
    assert dense == pytest.approx((model.layer_parts(1)[0] - whole) / 4 + whole)


def test_expert_data_groups_cross_every_expert_group_once():
    layout = ParallelLayout(tp=2, dp=8, ep=4)
    dp = [set(g) for g in layout.partition(Axis.DP.value)]
    ep = [set(g) for g in layout.partition(Axis.EP.value)]
    edp = [set(g) for g in layout.partition(EXPERT_DATA_GROUP)]
    assert all(len(g) == 4 for g in ep) and all(len(g) == 2 for g in edp)
    for a, b in itertools.product(ep, edp):
        same_replicas = any(a | b <= d for d in dp)
        assert len(a & b) == (1 if same_replicas else 0)


def test_one_axis_vocabulary_for_streams_groups_and_breakdown_keys():
    from clustersim.simulator.result import AXES
    assert AXES == ("tp", "cp", "ep", "pp", "dp", "spatial")
    for axis in Axis:
        assert Stream.of(axis).axis is axis
        assert ParallelLayout(tp=2, cp=2, dp=2, pp=2, ep=2).partition(axis.value)
    assert Stream.COMPUTE.axis is None and Stream.COPY.axis is None


def test_mtp_modules_are_held_by_the_last_stage():
    model = resolve("deepseek-v3")
    tensors = mtp_tensors(model)
    assert sum(t.params for t in tensors) == model.mtp_module_params
    strategy = Strategy(dp=64, ep=64, pp=2)
    plans = stage_plans(model, strategy)
    last = stage_shards(model, strategy, plans[-1])
    assert set(last.layers) - set(plans[-1].layer_ids) == {model.layers}
    assert model.layers not in stage_shards(model, strategy, plans[0]).layers

"""HSDP (``strategy.dp_shard``): ZeRO sharded inside a shard group, replicated across groups
that all-reduce each reduced gradient shard (torchtitan's replicate x shard mesh, FSDP2 HSDP)."""

from dataclasses import replace

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import run_step
from clustersim.hardware_specs import SpecError
from clustersim.workloads.axes import DP_REPLICATE_GROUP, DP_SHARD_GROUP, Axis
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.shards import stage_shards
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategy import Strategy, check_strategy
from clustersim.workloads.trace import CollectiveKind, CollectiveOp
from clustersim.workloads.training import TrainingSpec
from tests.conftest import tiny_job, tiny_model

FSDP = Strategy(dp=8, zero=3)


def layer0(job) -> dict[str, CollectiveOp]:
    """Rank 0's first micro-batch collectives of layer 0, by name."""
    return {op.name: op for op in build_trace(job).programs[0].ops
            if isinstance(op, CollectiveOp) and ".layer0." in op.name
            and op.name.startswith(("fwd0.", "bwd0."))}


def layer_shard(job):
    return stage_shards(job.model, job.strategy, stage_plans(job.model, job.strategy)[0]).layers[0][0]


@pytest.mark.parametrize("shard", [1, 2, 4])
def test_a_device_holds_a_shard_groups_share_and_gathers_the_rest(shard):
    hsdp, ddp = tiny_job(replace(FSDP, dp_shard=shard)), tiny_job(Strategy(dp=8))
    held, whole = layer_shard(hsdp), layer_shard(ddp)
    assert held.group == DP_SHARD_GROUP and (held.ranks, held.replicas) == (shard, 8 // shard)
    assert held.resident(True) == pytest.approx(whole.params / shard)
    ops = layer0(hsdp)
    gather = ops.get("fwd0.layer0.zero3_all_gather")
    gathered = gather.bytes if gather else 0.0          # a shard group of one gathers nothing
    element = 2.0
    kept = held.resident(True) * element
    # What a device keeps plus what the others send it adds up to the unsharded layer.
    assert kept + gathered * (shard - 1) / shard == pytest.approx(whole.params * element)
    memory = hsdp.memory()[0].memory
    assert memory.weights == pytest.approx(
        tiny_job(Strategy(dp=shard, zero=3)).memory()[0].memory.weights)


def test_the_replica_all_reduce_carries_the_reduced_gradient_shard():
    job = tiny_job(replace(FSDP, dp_shard=4))
    ops = layer0(job)
    scatter = ops["bwd0.layer0.zero3_reduce_scatter"]
    reduce = ops["bwd0.layer0.zero3_reduce_scatter.replicate_all_reduce"]
    assert scatter.group == DP_SHARD_GROUP and reduce.group == DP_REPLICATE_GROUP
    assert reduce.kind is CollectiveKind.ALL_REDUCE
    assert reduce.bytes == pytest.approx(scatter.bytes / 4)
    assert reduce.bytes == pytest.approx(layer_shard(job).resident(True) * 2.0)
    assert scatter.id in reduce.deps


def test_shard_groups_are_consecutive_ranks_and_replicas_span_them():
    layout = ParallelLayout(tp=2, dp=8, dp_shard=4)
    assert layout.partition(DP_SHARD_GROUP)[0] == (0, 2, 4, 6)
    assert layout.partition(DP_REPLICATE_GROUP)[0] == (0, 8)
    # Every rank in exactly one group of each, and both together make the dp group.
    for name, size in ((DP_SHARD_GROUP, 4), (DP_REPLICATE_GROUP, 2)):
        groups = layout.partition(name)
        assert sorted(r for g in groups for r in g) == list(range(16))
        assert {len(g) for g in groups} == {size}
    dp0 = set(layout.partition(Axis.DP.value)[0])
    assert dp0 == {r for g in layout.partition(DP_SHARD_GROUP) if g[0] in (0, 8) for r in g}


def simulate(strategy: dict) -> object:
    return run_step(config_from_mapping({
        "model": "llama3-8b", "training": {"seq_len": 8192, "global_batch": 16},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
        "strategy": {"recompute": "full", **strategy}}))


def test_hsdp_with_every_rank_in_one_shard_group_is_fsdp_exactly():
    fsdp = simulate({"dp": 16, "zero": 3})
    hsdp = simulate({"dp": 16, "zero": 3, "dp_shard": 16})
    assert hsdp.result.step_time_s == fsdp.result.step_time_s
    assert hsdp.memory == fsdp.memory


def test_hsdp_with_shard_groups_of_one_is_ddp():
    """One micro-batch per replica: nothing gathered or scattered, each layer's whole gradient
    all-reduced over every replica, the whole model state on every device (as ZeRO-0)."""
    ddp = simulate({"dp": 16, "zero": 0})
    hsdp = simulate({"dp": 16, "zero": 3, "dp_shard": 1})
    collectives = [op for op in hsdp.trace.programs[0].ops if isinstance(op, CollectiveOp)]
    assert {op.kind for op in collectives} == {CollectiveKind.ALL_REDUCE}
    ddp_bytes = sum(op.bytes for op in ddp.trace.programs[0].ops if isinstance(op, CollectiveOp))
    assert sum(op.bytes for op in collectives) == pytest.approx(ddp_bytes)
    a, b = hsdp.memory[0].memory, ddp.memory[0].memory
    assert (a.weights, a.gradients, a.optimizer) == pytest.approx((b.weights, b.gradients,
                                                                   b.optimizer))
    assert hsdp.result.step_time_s == pytest.approx(ddp.result.step_time_s, rel=0.02)


@pytest.mark.parametrize("strategy, message", [
    (Strategy(dp=8, zero=3, dp_shard=3), "3 does not divide dp = 8"),
    (Strategy(dp=8, zero=0, dp_shard=4), "needs zero 1, 2 or 3"),
])
def test_bad_shard_degrees_name_the_field(strategy, message):
    with pytest.raises(SpecError, match="strategy.dp_shard") as error:
        check_strategy(strategy, tiny_model(), TrainingSpec(seq_len=1024, global_batch=8), 8)
    assert message in str(error.value)

"""FSDP (ZeRO-3) with pipeline parallelism as torchtitan runs it, and FP8 gathers."""

from dataclasses import replace

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads.builder import build_trace
from clustersim.workloads.strategy import Strategy, Zero3Granularity, check_strategy
from clustersim.workloads.trace import CollectiveKind, CollectiveOp
from clustersim.workloads.training import TrainingSpec
from tests.conftest import tiny_job, tiny_model


def collectives(trace, name_part):
    return [op for program in trace.programs for op in program.ops
            if isinstance(op, CollectiveOp) and name_part in op.name]


def test_fsdp_with_pp_gathers_each_layer_once_and_reduces_after_the_last_micro_batch():
    job = tiny_job(Strategy(dp=2, pp=2, zero=3), global_batch=8)
    trace = build_trace(job)
    gathers = collectives(trace, "zero3_all_gather")
    reduces = collectives(trace, "zero3_reduce_scatter") + collectives(trace, "dp_reduce_scatter")
    layers = job.model.layers
    # One gather per layer per step (root tables once), not per micro-batch and pass.
    assert len([g for g in gathers if ".layer" in g.name]) == layers
    assert len([r for r in reduces if ".layer" in r.name]) == layers
    assert all(r.name.startswith(f"bwd{job.micro_batches - 1}.") for r in reduces)


def test_fsdp_with_pp_holds_gathered_weights_and_full_gradients():
    job = tiny_job(Strategy(dp=2, pp=2, zero=3), global_batch=8)
    zero1 = tiny_job(Strategy(dp=2, pp=2, zero=1), global_batch=8)
    for kept, ref in zip(job.memory(), zero1.memory()):
        assert kept.memory.weights == pytest.approx(ref.memory.weights)
        assert kept.memory.gradients == pytest.approx(ref.memory.gradients)
        assert kept.memory.optimizer == pytest.approx(ref.memory.optimizer)


def test_per_tensor_zero3_still_refuses_pipelines():
    s = Strategy(dp=2, pp=2, zero=3, zero3_granularity=Zero3Granularity.TENSOR)
    with pytest.raises(SpecError, match="strategy.zero3_granularity"):
        check_strategy(s, tiny_model(), TrainingSpec(seq_len=1024, global_batch=8), 4)


def test_fp8_blocks_gather_their_input_in_one_byte_under_sequence_parallelism():
    strategy = Strategy(tp=2, sequence_parallel=True)
    bf16 = tiny_job(strategy, global_batch=2)
    fp8 = replace(bf16, training=replace(bf16.training, precision=type(bf16.training.precision)("fp8")))
    sizes = {}
    for job in (bf16, fp8):
        sizes[job.training.precision.value] = {op.name: op.bytes for op in collectives(
            build_trace(job), "layer0.attn.tp_")}
    gather, reduce = "fwd0.layer0.attn.tp_all_gather", "fwd0.layer0.attn.tp_reduce_scatter"
    assert sizes["fp8"][gather] == pytest.approx(sizes["bf16"][gather] / 2)
    assert sizes["fp8"][reduce] == pytest.approx(sizes["bf16"][reduce])


def test_fp8_param_gather_halves_the_zero3_parameter_gathers():
    job = tiny_job(Strategy(dp=2, zero=3), global_batch=2)
    fp8 = replace(job, training=TrainingSpec(seq_len=1024, global_batch=2, precision=type(
        job.training.precision)("fp8"), fp8_param_gather=True))
    before = collectives(build_trace(job), "layer0.zero3_all_gather")[0].bytes
    after = collectives(build_trace(fp8), "layer0.zero3_all_gather")[0].bytes
    assert after == pytest.approx(before / 2)

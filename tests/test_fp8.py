"""FP8 as the frameworks run it: which GEMMs, the casts they add, and their recipes."""

from dataclasses import replace

import pytest

from clustersim.hardware_specs import Dtype, OpClass, SpecError
from clustersim.workloads.builder import build_trace
from clustersim.workloads.fp8 import (
    AMAX_BYTES, CAST_TRANSPOSE_BYTES, MXFP8_PARAM_BYTES, Fp8Casts,
)
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.memory import stage_memory
from clustersim.workloads.model import PRESETS
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.trace import CollectiveOp
from clustersim.workloads.training import Fp8Recipe, training_from_mapping
from tests.conftest import tiny_job

LLAMA3_70B = PRESETS["llama3-70b"]


def ops(recipe="delayed", zero=1, param_gather=False, global_batch=64, sequence_parallel=False):
    training = training_from_mapping({"seq_len": 8192, "global_batch": global_batch,
                                      "precision": "fp8", "fp8_recipe": recipe,
                                      "fp8_param_gather": param_gather})
    return LayerOps(LLAMA3_70B, training, Strategy(tp=4, pp=1, dp=2, zero=zero,
                                                   sequence_parallel=sequence_parallel))


def by_name(kernels):
    return {k.name: k for k in kernels}


def test_only_linear_layers_run_in_fp8():
    fwd = ops().forward()
    kernels = fwd.attention + fwd.mlp
    fp8 = {k.name for k in kernels if k.dtype is Dtype.FP8}
    assert fp8 == {"qkv", "attn_proj", "fc1", "fc2"}
    attention = by_name(kernels)["flash_attn"]
    assert attention.dtype is Dtype.BF16
    assert by_name(ops().head_forward())["lm_head"].dtype is Dtype.BF16


def test_tensorwise_casts_read_amax_then_cast_transpose_each_input_weights_once_per_step():
    layer = ops("tensorwise")
    micro = 64 // 2
    fc2 = by_name(layer.forward().mlp)["fc2"]
    cast = by_name(layer.forward().mlp)["fc2.fp8_quantize"]
    per_element = AMAX_BYTES + CAST_TRANSPOSE_BYTES
    assert per_element == 6.0
    expected = fc2.m * fc2.k * per_element + fc2.k * fc2.n * per_element / micro
    assert cast.bytes == pytest.approx(expected)


def test_delayed_scaling_fuses_the_cast_into_the_norm_before_qkv_and_fc1():
    fwd = by_name(ops("delayed").forward().attention)
    qkv, proj = fwd["qkv"], fwd["attn_proj"]
    micro = 32
    assert fwd["qkv.fp8_quantize"].bytes == pytest.approx(
        qkv.m * qkv.k * 1.0 + qkv.k * qkv.n * 4.0 / micro)
    assert fwd["attn_proj.fp8_quantize"].bytes == pytest.approx(
        proj.m * proj.k * 4.0 + proj.k * proj.n * 4.0 / micro)


def test_fp8_weights_need_only_their_transpose_and_zero3_casts_after_each_gather():
    assert Fp8Casts.weight_bytes_per_element(ops(param_gather=True).fp8) == pytest.approx(2 / 32)
    zero3 = ops(zero=3).fp8
    assert zero3.weight_bytes_per_element() == 4.0
    assert ops(zero=3, param_gather=True).fp8.weight_bytes_per_element() == pytest.approx(
        2 * 4.0 / 2)


def test_backward_quantizes_each_output_gradient_once_before_its_dgrad():
    layer = ops("tensorwise")
    bwd = layer.backward().mlp
    names = [k.name for k in bwd]
    assert names.index("fc2.fp8_quantize_grad") + 1 == names.index("fc2.dgrad")
    fc2 = by_name(layer.forward().mlp)["fc2"]
    grad = by_name(bwd)["fc2.fp8_quantize_grad"]
    assert grad.op_class is OpClass.ELEMENTWISE
    assert grad.bytes == pytest.approx(fc2.m * fc2.n * 6.0)


def cast_bytes_per_element(layer, name):
    """A cast kernel's traffic per element of the activation or gradient it quantizes (the
    weights' share, cast once per step, taken out)."""
    kernels = by_name(layer.forward().attention + layer.forward().mlp
                      + layer.backward().attention + layer.backward().mlp)
    gemm = kernels[name.split(".")[0]]
    cast = kernels[name]
    if name.endswith("_grad"):
        return cast.bytes / (gemm.m * gemm.n)
    return (cast.bytes - gemm.k * gemm.n * layer.fp8.weight_bytes_per_element()) / (gemm.m * gemm.k)


@pytest.mark.parametrize("recipe, inputs, grads, local", [
    # amax 2 + cast 2 + row-wise copy 1 on the 1/4 shard, then a 1 + 1 byte transpose of the
    # gathered FP8 tensor; operands TP does not gather keep their 6-byte cast-transpose.
    ("tensorwise", (6 - 1) / 4 + 2, (6 - 1) / 4 + 2, 6.0),
    # the norm writes FP8 on its shard (1 byte less than BF16); gradients cast-transpose
    # (2 + 1 + 1) on the shard without their column copy; the gathered tensors are transposed
    ("delayed", -1 / 4 + 2, (4 - 1) / 4 + 2, 4.0),
    # MXFP8 quantizes both scaled copies on the shard (the norm writes them itself) and
    # gathers each: no transpose after the gather
    ("mxfp8", (1 + 2 / 32) / 4, (4 + 2 / 32) / 4, 4 + 2 / 32),
])
def test_sequence_parallel_quantizes_the_local_shard_before_the_fp8_all_gather(
        recipe, inputs, grads, local):
    layer = ops(recipe, sequence_parallel=True)
    expected = {"qkv.fp8_quantize": inputs, "fc1.fp8_quantize": inputs,
                "attn_proj.fp8_quantize_grad": grads, "fc2.fp8_quantize_grad": grads,
                "attn_proj.fp8_quantize": local, "fc2.fp8_quantize": local,
                "qkv.fp8_quantize_grad": local, "fc1.fp8_quantize_grad": local}
    for name, bytes_per_element in expected.items():
        assert cast_bytes_per_element(layer, name) == pytest.approx(bytes_per_element), name
    plain = ops(recipe, sequence_parallel=False)
    assert cast_bytes_per_element(plain, "fc2.fp8_quantize_grad") == pytest.approx(local)


def test_torchao_float8_keeps_its_casts_on_the_gathered_tensor():
    """The shard-then-gather placement is Transformer Engine's; torchao's float8
    (``fp8_saved_inputs: false``) is left casting the gathered tensor."""
    training = training_from_mapping({"seq_len": 8192, "global_batch": 64, "precision": "fp8",
                                      "fp8_recipe": "tensorwise", "fp8_saved_inputs": False})
    layer = LayerOps(LLAMA3_70B, training, Strategy(tp=4, pp=1, dp=2, sequence_parallel=True))
    assert cast_bytes_per_element(layer, "qkv.fp8_quantize") == pytest.approx(6.0)


def test_current_scaling_overhead_matches_transformer_engines_h200_benchmark():
    """TE's GEMM profiling guide (docs/examples/gemm_profiling), H200 NVL, 5B config
    (hidden 4096, ffn 16384, M = 31 x 512 tokens): FP8 CurrentScaling per layer 20.285 ms in
    autocast against 16.785 ms pre-quantized. The benchmark quantizes both operands of each of
    the 12 GEMMs: at 6 bytes per element over H200's streaming bandwidth (4.8 TB/s x 0.91) that
    is within 10% of the 3.50 ms difference."""
    m, h, f = 31 * 512, 4096, 16384
    fprop = [(m, h, 3 * h), (m, h, h), (m, h, f), (m, f, h)]           # (M, K, N)
    elements = 0
    for mm, k, n in fprop:
        elements += mm * k + k * n          # fprop: X and W
        elements += mm * n + k * n          # dgrad: dY and W
        elements += mm * k + mm * n         # wgrad: X and dY
    traffic = elements * (AMAX_BYTES + CAST_TRANSPOSE_BYTES)
    assert traffic / (4.8e12 * 0.91) == pytest.approx(20.285e-3 - 16.785e-3, rel=0.10)


def test_fp8_options_need_fp8_precision():
    with pytest.raises(SpecError, match=r"training.fp8_recipe: needs precision: fp8"):
        training_from_mapping({"seq_len": 8, "global_batch": 1, "fp8_recipe": "tensorwise"})
    with pytest.raises(SpecError, match="training.fp8_recipe"):
        training_from_mapping({"seq_len": 8, "global_batch": 1, "precision": "fp8",
                               "fp8_recipe": "blockwise"})
    spec = training_from_mapping({"seq_len": 8, "global_batch": 1, "precision": "fp8",
                                  "fp8_recipe": "mxfp8", "fp8_param_gather": True})
    assert spec.fp8_recipe is Fp8Recipe.MXFP8 and spec.to_dict()["fp8_param_gather"] is True


def mxfp8_job(param_gather):
    job = tiny_job(Strategy(dp=2, zero=1, overlap_param_gather=True), global_batch=4)
    return replace(job, training=training_from_mapping({
        "seq_len": 1024, "global_batch": 4, "precision": "fp8", "fp8_recipe": "mxfp8",
        "fp8_param_gather": param_gather}))


def test_mxfp8_weights_under_the_distributed_optimizer_gather_in_bf16_and_keep_two_copies():
    """Megatron-Core's reuse_grad_buf_for_mxfp8_param_ag path (workloads/fp8.py docstring):
    the gather moves BF16, each step quantises the weights in full, and the weight is held as
    row-wise and column-wise MXFP8 (2 + 2/32 bytes) instead of 2 bytes of BF16."""
    def gathered(job):
        return sum(op.bytes for p in build_trace(job).programs for op in p.ops
                   if isinstance(op, CollectiveOp) and "dp_param_all_gather" in op.name)

    def weights(job):
        plan = stage_plans(job.model, job.strategy)[0]
        return stage_memory(job.model, job.training, job.strategy, plan).memory.weights

    bf16, mx = mxfp8_job(False), mxfp8_job(True)
    assert gathered(bf16) > 0
    assert gathered(mx) == pytest.approx(gathered(bf16))
    assert MXFP8_PARAM_BYTES == pytest.approx(2.0625)
    assert weights(mx) == pytest.approx(weights(bf16) * MXFP8_PARAM_BYTES / 2, rel=0.01)
    casts = [Fp8Casts(job.training, job.strategy) for job in (bf16, mx)]
    assert casts[1].weight_bytes_per_element() == casts[0].weight_bytes_per_element()
    assert casts[1].weight_bytes_per_element() > Fp8Casts.weight_bytes_per_element(
        ops("tensorwise", param_gather=True).fp8)

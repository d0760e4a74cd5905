"""FP8 casts of grouped expert GEMMs as Transformer Engine's ``GroupedLinear`` issues them: one
expert slice at a time (``split_quantize``), each with its recipe's kernels, except under delayed
scaling (one fused multi-tensor cast-transpose) and NVFP4 (TE 2.14's grouped cast), which handle
every expert in one kernel (``workloads/fp8.py`` cites the TE sources)."""

import pytest

from clustersim.simulator.cost.compute import LAUNCH_GAP_S, ComputeModel
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.training import training_from_mapping

LOCAL_EXPERTS = 128 // 8   # Qwen3-30B-A3B's 128 experts over ep 8


def _kernels(precision="fp8", recipe=None):
    model = resolve("qwen3-30b-a3b", path="model")
    training = training_from_mapping({"seq_len": 4096, "global_batch": 64,
                                      "precision": precision,
                                      **({"fp8_recipe": recipe} if recipe else {})})
    strategy = strategy_from_mapping({"dp": 8, "ep": 8})
    Job(model, training, strategy).checked(8)
    ops = LayerOps(model, training, strategy)
    return {k.name: k for part in (ops.forward(), ops.backward())
            for k in part.attention + part.mlp}


CASTS = ("expert_fc1.fp8_quantize", "expert_fc2.fp8_quantize")
GRAD_CASTS = ("expert_fc1.fp8_quantize_grad", "expert_fc2.fp8_quantize_grad")


@pytest.mark.parametrize("recipe,per_expert,swizzles", [
    # nvte_compute_amax (zero the amax, then reduce it), nvte_compute_scale_from_amax,
    # nvte_quantize_v2 (TE common/recipe/current_scaling.cu, pytorch/csrc/quantizer.cpp)
    ("tensorwise", 4, 0),
    ("mxfp8", 1, 2),        # nvte_quantize_v2; a scale swizzle per operand of each grouped GEMM
])
def test_each_expert_slice_is_cast_with_its_recipes_kernels(recipe, per_expert, swizzles):
    kernels = _kernels(recipe=recipe)
    for name in CASTS:      # the input of fprop
        assert kernels[name].launches == LOCAL_EXPERTS * per_expert + swizzles
    for name in GRAD_CASTS:  # the output gradient, used by dgrad and wgrad
        assert kernels[name].launches == LOCAL_EXPERTS * per_expert + 2 * swizzles


def test_delayed_scaling_and_nvfp4_cast_every_expert_in_one_kernel_and_dense_casts_stay_single():
    for fused in (_kernels(recipe="delayed"), _kernels(precision="nvfp4")):
        assert {fused[n].launches for n in CASTS + GRAD_CASTS} == {1}
    for recipe in ("delayed", "tensorwise", "mxfp8"):
        kernels = _kernels(recipe=recipe)
        assert {k.launches for name, k in kernels.items()
                if "quantize" in name and not name.startswith("expert")} == {1}


def test_the_split_adds_launch_gaps_not_traffic(catalog):
    mx = _kernels(recipe="mxfp8")["expert_fc1.fp8_quantize"]
    device = ComputeModel(catalog.device("b200"))
    single = device.kernel_time(type(mx)(mx.name, mx.op_class, mx.flops, mx.bytes))
    assert device.kernel_time(mx) - single == pytest.approx((mx.launches - 1) * LAUNCH_GAP_S)

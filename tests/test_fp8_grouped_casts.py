"""FP8 casts of grouped expert GEMMs as Transformer Engine's ``GroupedLinear`` issues them: one
expert slice at a time (``split_quantize``), each with its recipe's kernels, except under delayed
scaling (one fused multi-tensor cast-transpose) and NVFP4 (TE 2.14's grouped cast), which handle
every expert in one kernel; and the copies Megatron-Core's ``TEGroupedMLP`` makes to pad each
expert's rows to the recipe's alignment (``workloads/fp8.py`` cites the TE and Megatron-Core
sources)."""

import pytest

from clustersim.simulator.cost.compute import LAUNCH_GAP_S, ComputeModel
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.training import training_from_mapping

LOCAL_EXPERTS = 128 // 8   # Qwen3-30B-A3B's 128 experts over ep 8


def _ops(precision="fp8", recipe=None, dispatcher="alltoall", moe=None):
    model = resolve("qwen3-30b-a3b", path="model")
    training = training_from_mapping({"seq_len": 4096, "global_batch": 64,
                                      "precision": precision, **({"moe": moe} if moe else {}),
                                      **({"fp8_recipe": recipe} if recipe else {})})
    strategy = strategy_from_mapping({"dp": 8, "ep": 8, "ep_dispatcher": dispatcher})
    Job(model, training, strategy).checked(8)
    return LayerOps(model, training, strategy)


def _kernels(precision="fp8", recipe=None, dispatcher="alltoall", moe=None):
    ops = _ops(precision, recipe, dispatcher, moe)
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


def test_dropless_fp8_experts_copy_their_rows_into_aligned_buffers_and_back():
    """Megatron-Core's TEGroupedMLP pads each expert's rows with Fp8Padding (the tokens and
    their probabilities, one kernel each) and unpads fc2's output: a read and a write of every
    routed row each way, in forward and (as the inverse copies) in backward."""
    ops = _ops(recipe="tensorwise")
    kernels = _kernels(recipe="tensorwise")
    rows = kernels["expert_fc1"].m * LOCAL_EXPERTS
    hidden = 2048
    assert kernels["expert_fp8_pad"].bytes == 2 * rows * hidden * 2
    assert kernels["expert_fp8_pad"].launches == 2
    assert kernels["expert_fp8_unpad"].bytes == 2 * rows * hidden * 2
    assert {"expert_fp8_pad.bwd", "expert_fp8_unpad.bwd"} <= kernels.keys()
    names = [k.name for k in ops.forward().mlp]
    assert names.index("expert_fp8_pad") < names.index("expert_fc1.fp8_quantize")
    assert names.index("expert_fc2") < names.index("expert_fp8_unpad") < names.index("unpermute")


@pytest.mark.parametrize("dispatcher,precision,moe", [
    ("deepep", "fp8", None),     # HybridEP pads in its permute (the deepep rows stand for it)
    ("alltoall", "bf16", None),  # no quantised GEMM, nothing to align
    # 4096 tokens x top 8 / 128 experts = 256 per source, x ep 8 = 2048 rows: a multiple of 16
    ("alltoall", "fp8", {"capacity_factor": 1.0, "pad_to_capacity": True}),
])
def test_no_copies_where_the_dispatcher_pads_or_the_rows_are_aligned(dispatcher, precision, moe):
    kernels = _kernels(precision, "tensorwise" if precision == "fp8" else None, dispatcher, moe)
    assert not {"expert_fp8_pad", "expert_fp8_unpad"} & kernels.keys()


def test_the_alignment_is_the_recipes():
    """Megatron-Core get_fp8_align_size / get_fp4_align_size: 16, 32 for MXFP8, 128 for NVFP4."""
    assert _ops(recipe="tensorwise").fp8.row_alignment() == 16
    assert _ops(recipe="delayed").fp8.row_alignment() == 16
    assert _ops(recipe="mxfp8").fp8.row_alignment() == 32
    assert _ops(precision="nvfp4").fp8.row_alignment() == 128


def test_a_padded_capacity_off_the_alignment_is_copied():
    # capacity ceil(1.01 x 32768 / 128) = 259 per source, x ep 8 = 2072 rows: 2072 % 16 = 8
    kernels = _kernels(recipe="tensorwise", moe={"capacity_factor": 1.01, "pad_to_capacity": True})
    assert kernels["expert_fc1"].m == 2072
    assert "expert_fp8_pad" in kernels

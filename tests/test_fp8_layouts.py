"""Per-tensor FP8 tensors keep a transposed copy only where FP8 GEMMs are TN only (Hopper):
Transformer Engine's ``is_non_tn_fp8_gemm_supported()`` (sm_100/sm_103 and later) drops it
(``csrc/quantizer.cpp``, v2.8: ``with_transpose = columnwise_usage &&
!nvte_is_non_tn_fp8_gemm_supported()``)."""

from dataclasses import replace

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.workloads.fp8 import AMAX_BYTES, Fp8Casts, weight_copy_bytes
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.memory import stage_memory
from clustersim.workloads.model import PRESETS
from clustersim.workloads.shards import ParamKind, stage_shards
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.training import training_from_mapping


def config(gpu, recipe="tensorwise", precision="fp8", **training):
    return config_from_mapping({
        "model": "llama3-8b",
        "training": {"seq_len": 8192, "global_batch": 64, "precision": precision,
                     **({"fp8_recipe": recipe} if precision == "fp8" else {}), **training},
        "strategy": {"tp": 1, "pp": 1, "dp": 8},
        "cluster": {"gpu": gpu, "num_gpus": 8}})


@pytest.mark.parametrize("gpu, transposed", [("h100-sxm", True), ("h200", True),
                                             ("b200", False), ("gb200", False),
                                             ("b300", False), ("gb300", False)])
def test_the_cluster_says_whether_fp8_tensors_are_kept_transposed(gpu, transposed):
    assert config(gpu).job.training.fp8_transposed_copies is transposed


def test_the_field_is_not_a_config_field():
    with pytest.raises(Exception, match="fp8_transposed_copies"):
        config("b200", fp8_transposed_copies=False)


def fc2_cast(transposed, param_gather=False):
    training = training_from_mapping({"seq_len": 8192, "global_batch": 64, "precision": "fp8",
                                      "fp8_recipe": "tensorwise",
                                      "fp8_param_gather": param_gather})
    training = replace(training, fp8_transposed_copies=transposed)
    layer = LayerOps(PRESETS["llama3-70b"], training, Strategy(tp=4, pp=1, dp=2))
    kernels = {k.name: k for k in layer.forward().mlp}
    return kernels["fc2"], kernels["fc2.fp8_quantize"], layer.fp8


def test_a_cast_writes_one_fp8_copy_where_gemms_take_any_layout():
    """Current scaling: the amax read (2 bytes), then read 2 and write 1 (Blackwell) or 2
    (Hopper, with the transpose) per element; weights once per step over 32 micro-batches."""
    for transposed, per_element in ((True, AMAX_BYTES + 4.0), (False, AMAX_BYTES + 3.0)):
        fc2, cast, _ = fc2_cast(transposed)
        expected = (fc2.m * fc2.k + fc2.k * fc2.n / 32) * per_element
        assert cast.bytes == pytest.approx(expected)


def test_fp8_weights_need_their_transpose_on_hopper_only():
    assert fc2_cast(True, param_gather=True)[2].weight_bytes_per_element() == pytest.approx(2 / 32)
    assert fc2_cast(False, param_gather=True)[2].weight_bytes_per_element() == 0.0


def weights_per_gemm_param(transposed, recipe="tensorwise", param_gather=True):
    training = training_from_mapping({"seq_len": 4096, "global_batch": 16, "precision": "fp8",
                                      "fp8_recipe": recipe, "fp8_param_gather": param_gather})
    training = replace(training, fp8_transposed_copies=transposed)
    model, strategy = PRESETS["llama3-8b"], Strategy(tp=1, pp=2, dp=8)
    plan = stage_plans(model, strategy)[1]          # no embedding: GEMM weights and norms
    shards = stage_shards(model, strategy, plan)
    assert all(s.kind is not ParamKind.VOCAB for s in shards.by_group().values())
    params = sum(s.params for s in shards.by_group().values())
    return stage_memory(model, training, strategy, plan).memory.weights / params


def test_a_per_tensor_fp8_weight_is_held_with_its_transpose_on_hopper():
    """FP8 weights (``fp8_param_gather``): 1 byte, and 1 more for the transpose on Hopper
    (``Float8TensorBase.update_usage``); MXFP8 weights hold both scaled copies everywhere;
    16-bit weights stay 2 bytes (TE's first-micro-batch weight cache is not counted)."""
    assert weights_per_gemm_param(True) == pytest.approx(2.0, rel=1e-3)
    assert weights_per_gemm_param(False) == pytest.approx(1.0, rel=1e-3)
    assert weights_per_gemm_param(False, "mxfp8") == pytest.approx(2.0625, rel=1e-3)
    assert weights_per_gemm_param(True, param_gather=False) == pytest.approx(2.0, rel=1e-3)
    bf16 = training_from_mapping({"seq_len": 1, "global_batch": 1})
    assert weight_copy_bytes(bf16) == 0.0

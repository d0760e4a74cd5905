"""Transformer Engine's cuDNN fused attention of early 2024 (``attention: cudnn_2024``): the rate
Transformer Engine's own attention guide measured against flash-attn on Hopper, FlashAttention-2
everywhere else, FlashAttention's memory."""

from dataclasses import replace

import pytest

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.simulator.cost.compute import CUDNN_2024_OVER_FLASH2, ComputeModel
from clustersim.workloads import AttentionKernel
from clustersim.workloads.layer_ops import Kernel, LayerOps
from clustersim.workloads.memory import memory_per_stage
from clustersim.workloads.model import PRESETS
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.training import training_from_mapping


def _kernel(op):   # 16 sequences x 32 heads of 8K tokens, head dim 128: compute-bound
    return Kernel("flash_attn", op, 1e14, 1e9, 8192, 8192, 128, 512, Dtype.BF16)


def test_speedup_is_transformer_engines_benchmark_of_cudnn_against_flash_attn():
    """docs/examples/attention/attention.ipynb (NVIDIA/TransformerEngine#889), H100 PCIe, test_3
    (batch 2, 32 query and 4 KV heads of 128, 8,192 causal tokens), forward + backward: cuDNN
    12.0122 ms, flash-attn 19.0716 ms, 'cuDNN vs flash speedup 1.5877'."""
    assert CUDNN_2024_OVER_FLASH2 == pytest.approx(1.5877, abs=5e-5)


def test_hopper_runs_it_at_flashattention2s_in_training_rate_times_the_speedup(catalog):
    h100 = ComputeModel(catalog.device("h100-sxm"))
    fa2 = h100.efficiency(_kernel(OpClass.ATTENTION))
    assert fa2 == pytest.approx(0.35 * 0.51, rel=0.02)
    cudnn = h100.efficiency(_kernel(OpClass.ATTENTION_CUDNN_2024))
    assert cudnn == pytest.approx(fa2 * 19.0716 / 12.0122, rel=1e-12)
    assert h100.kernel_time(_kernel(OpClass.ATTENTION)) / h100.kernel_time(
        _kernel(OpClass.ATTENTION_CUDNN_2024)) == pytest.approx(1.5877, rel=1e-3)
    # Slower than a FlashAttention-3-class kernel (0.45 of peak in a training step).
    assert cudnn < h100.efficiency(_kernel(OpClass.ATTENTION_FA3))


@pytest.mark.parametrize("device", ["a100-80gb", "b200"])
def test_off_hopper_transformer_engine_ran_flashattention2(catalog, device):
    """TE 1.x: 'Select FusedAttention on sm90 and FlashAttention on others for performance'."""
    model = ComputeModel(catalog.device(device))
    assert model.kernel_time(_kernel(OpClass.ATTENTION_CUDNN_2024)) == model.kernel_time(
        _kernel(OpClass.ATTENTION))


def test_the_layer_emits_its_class_with_flashattentions_work_and_memory():
    model, strategy = PRESETS["llama2-7b"], Strategy(tp=2, cp=2, dp=2, sequence_parallel=True)
    flash = training_from_mapping({"seq_len": 32768, "global_batch": 8, "attention": "flash"})
    cudnn = replace(flash, attention=AttentionKernel.CUDNN_2024)
    core = {t.attention: next(k for k in LayerOps(model, t, strategy).forward().attention
                              if k.name == "flash_attn") for t in (flash, cudnn)}
    assert core[AttentionKernel.CUDNN_2024].op_class is OpClass.ATTENTION_CUDNN_2024
    assert core[AttentionKernel.CUDNN_2024].flops == core[AttentionKernel.FLASH].flops
    assert memory_per_stage(model, cudnn, strategy) == memory_per_stage(model, flash, strategy)


def test_a_device_cannot_give_it_factors_of_its_own(tmp_path):
    """It takes FlashAttention-2's curve and in-training factor: a profile naming it is an
    unknown field, not a setting that would be silently ignored."""
    from clustersim.hardware_specs import SpecError, load_catalog
    path = tmp_path / "x.yaml"
    path.write_text("""devices:
  x:
    vendor: nvidia
    peak_flops: {bf16: 100 TFLOPS}
    memory: 80 GiB
    memory_bandwidth: 1000 GB/s
    compute_units: 100
    efficiency:
      matmul: 0.8
      attention: 0.4
      memory: 0.9
      in_training: {attention_cudnn_2024: 0.9}
""")
    with pytest.raises(SpecError, match="attention_cudnn_2024"):
        load_catalog([path]).device("x")

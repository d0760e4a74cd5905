"""torchtitan's per-op selective activation checkpointing (``recompute: op``)."""

import pytest

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads import Job, Recompute, Strategy, TrainingSpec
from clustersim.workloads.layer_ops import LayerOps, recompute_flops_per_token
from clustersim.workloads.memory import layer_activation_bytes, memory_per_stage
from clustersim.workloads.model import PRESETS
from clustersim.workloads.training import AttentionKernel

LLAMA3_8B = PRESETS["llama3-8b"]
TRAINING = TrainingSpec(seq_len=8192, global_batch=8, micro_batch=1)
OP = Strategy(dp=8, zero=3, recompute=Recompute.OP)


def test_saved_activations_are_the_input_every_other_matmul_and_the_attention_output():
    """torchtitan saves the outputs of mm 1, 3, 5, 7 of a Llama layer (wq, wv, w1, w2) and of
    the flash-attention kernel (with its FP32 log-sum-exp); the checkpoint keeps the input."""
    m = LLAMA3_8B
    h, q, kv, ffn, heads = m.hidden, m.q_dim, m.kv_dim, m.ffn_hidden, m.heads
    assert (h, q, kv, ffn, heads) == (4096, 4096, 1024, 14336, 32)
    tokens = 8192
    expected = 2 * tokens * (h + q + kv + ffn + h + q) + 4 * tokens * heads
    assert layer_activation_bytes(m, TRAINING, OP) == expected
    full = layer_activation_bytes(m, TRAINING, Strategy(dp=8, zero=3))
    assert 2 * tokens * h < expected < full


def test_recompute_redoes_k_o_and_w3_and_every_elementwise_kernel():
    ops = LayerOps(LLAMA3_8B, TRAINING, OP)
    redo = ops.recompute()
    gemms = [k for k in redo.attention + redo.mlp if k.op_class is OpClass.MATMUL]
    assert sorted((k.name, k.n, k.k) for k in gemms) == [
        ("recompute_k_proj", 1024, 4096), ("recompute_o_proj", 4096, 4096),
        ("recompute_w3", 14336, 4096)]
    forward = ops.forward()
    elementwise = {k.name for k in forward.attention + forward.mlp
                   if k.op_class is not OpClass.MATMUL and k.name != "flash_attn"}
    assert elementwise == {k.name for k in redo.attention + redo.mlp
                           if k.op_class is not OpClass.MATMUL}
    # Per token and layer: 2 x (1024 + 4096 + 14336) x 4096 FLOPs.
    flops = recompute_flops_per_token(LLAMA3_8B, 8192, Recompute.OP, AttentionKernel.FLASH)
    assert flops == 32 * 2 * (1024 + 4096 + 14336) * 4096


def test_op_sits_between_none_and_full_in_time_and_memory(catalog):
    from clustersim.analysis.config import RunConfig
    from clustersim.analysis.step import run_step
    cluster = catalog.cluster(device="a100-80gb", num_devices=8)
    times, peaks = {}, {}
    for mode in (Recompute.NONE, Recompute.OP, Recompute.FULL):
        job = Job(LLAMA3_8B, TRAINING, Strategy(dp=8, zero=3, recompute=mode)).checked(8)
        report = run_step(RunConfig(job=job, cluster=cluster, catalog=catalog, name=mode.value))
        times[mode], peaks[mode] = report.result.step_time_s, report.result.peak_memory_gb
        assert job.hardware_flops_per_step >= job.model_flops_per_step
    assert times[Recompute.NONE] < times[Recompute.OP] < times[Recompute.FULL]
    assert peaks[Recompute.FULL] < peaks[Recompute.OP] < peaks[Recompute.NONE]
    stage = memory_per_stage(LLAMA3_8B, TRAINING, OP)[0]
    saved = layer_activation_bytes(LLAMA3_8B, TRAINING, OP)
    whole = layer_activation_bytes(LLAMA3_8B, TRAINING, Strategy(dp=8, zero=3))
    # Every layer's saved tensors, and one layer's full set while it recomputes.
    assert stage.memory.activations >= 32 * saved + whole


@pytest.mark.parametrize("model, strategy, words", [
    ("llama3-8b", Strategy(tp=2, dp=4, recompute=Recompute.OP), "tp = 2"),
    ("mixtral-8x7b", Strategy(dp=8, recompute=Recompute.OP), "experts"),
])
def test_op_recompute_outside_what_is_modelled_names_the_field(model, strategy, words):
    with pytest.raises(SpecError, match=f"strategy.recompute: op is modelled.*{words}"):
        Job(PRESETS[model], TRAINING, strategy).checked(8)

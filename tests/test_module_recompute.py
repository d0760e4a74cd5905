"""Module recompute (``recompute: modules``; Megatron-Core ``--recompute-modules``, the DeepSeek-V3
report's recompute of every RMSNorm and the MLA up-projections, arXiv 2412.19437 sec. 3.2.3):
the backward reruns exactly those kernels, their outputs leave the stored activations, and the
FLOP count adds the up-projections' GEMMs."""

import pytest

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layer_ops import (LayerOps, mla_up_proj_flops_per_token,
                                            moe_block_gemm_params)
from clustersim.workloads.memory import layer_activation_bytes
from clustersim.workloads.model import from_mapping
from clustersim.workloads.strategy import Recompute, RecomputeModule, strategy_from_mapping

SMALL_DEEPSEEK = {"name": "small-deepseek", "layers": 4, "hidden": 512, "heads": 8, "vocab": 1024,
                  "mlp": "swiglu", "ffn_hidden": 1536, "num_experts": 16, "top_k": 4,
                  "moe_ffn_hidden": 256, "shared_experts": 1, "first_dense_layers": 1,
                  "kv_lora_rank": 128, "q_lora_rank": 192, "head_dim": 96,
                  "qk_rope_head_dim": 32, "v_head_dim": 64}
NORM, UP, ACT = RecomputeModule.LAYERNORM, RecomputeModule.MLA_UP_PROJ, RecomputeModule.MOE_ACT
TRAINING = TrainingSpec(seq_len=1024, global_batch=8)


def _strategy(*modules: RecomputeModule) -> Strategy:
    if not modules:
        return Strategy(dp=8, ep=8)
    return Strategy(dp=8, ep=8, recompute=Recompute.MODULES, recompute_modules=modules)


def _job(*modules: RecomputeModule) -> Job:
    return Job(from_mapping(SMALL_DEEPSEEK), TRAINING, _strategy(*modules)).checked(8)


def test_the_backward_reruns_the_named_modules_kernels_only():
    job = _job(NORM, UP, ACT)
    work = LayerOps(job.model, job.training, job.strategy).recompute(3)
    assert [k.name for k in work.attention] == ["norm1", "q_norm", "q_up", "kv_norm", "kv_up",
                                                "qkv_layout", "rotary"]
    assert [k.name for k in work.mlp] == ["norm2", "expert_act"]
    # The two up-projection GEMMs are the recompute's FLOPs, as the model's count says.
    gemm_flops = sum(k.flops for k in work.attention if k.op_class is OpClass.MATMUL)
    tokens = TRAINING.micro_batch * TRAINING.seq_len
    assert gemm_flops == pytest.approx(mla_up_proj_flops_per_token(job.model) * tokens)
    plain = _job()
    assert job.hardware_flops_per_step - plain.hardware_flops_per_step == pytest.approx(
        mla_up_proj_flops_per_token(job.model) * job.model.layers * TRAINING.tokens_per_step)


def test_recomputed_outputs_leave_the_stored_activations():
    m, e = from_mapping(SMALL_DEEPSEEK), TRAINING.precision.activation_bytes
    tokens = TRAINING.micro_batch * TRAINING.seq_len

    def saved(*modules):
        return (layer_activation_bytes(m, TRAINING, _strategy(), 3)
                - layer_activation_bytes(m, TRAINING, _strategy(*modules), 3))
    # RMSNorm outputs: the QKV-down and router inputs, and the two latents' normed copies.
    assert saved(NORM) == pytest.approx(e * tokens * (2 * m.hidden + m.q_lora_rank
                                                      + m.kv_lora_rank))
    # Q, K and V that attention reads, rebuilt from the latents.
    assert saved(UP) == pytest.approx(e * tokens * (m.q_dim + m.kv_dim + m.v_dim))
    # Each routed copy's fc2 input.
    assert saved(ACT) == pytest.approx(e * tokens * m.top_k * m.expert_ffn)
    assert saved(NORM, UP, ACT) == pytest.approx(saved(NORM) + saved(UP) + saved(ACT))


@pytest.mark.parametrize("data, message", [
    ({"recompute_modules": ["layernorm"]}, "needs recompute: modules"),
    ({"recompute": "modules"}, "needs a list of modules"),
    ({"recompute": "modules", "recompute_modules": ["attention"]}, "recompute_modules\\[0\\]"),
])
def test_bad_module_lists_are_named(data, message):
    with pytest.raises(SpecError, match=message):
        Job(from_mapping(SMALL_DEEPSEEK), TRAINING,
            strategy_from_mapping({"dp": 8, "ep": 8, **data})).checked(8)


def test_mla_up_proj_needs_latent_attention():
    dense = {k: v for k, v in SMALL_DEEPSEEK.items()
             if k not in ("kv_lora_rank", "q_lora_rank", "head_dim", "qk_rope_head_dim",
                          "v_head_dim")}
    with pytest.raises(SpecError, match="strategy.recompute_modules: mla_up_proj needs"):
        Job(from_mapping(dense), TRAINING, _strategy(UP)).checked(8)


MOE = RecomputeModule.MOE


def test_moe_recompute_keeps_only_the_blocks_input():
    """Megatron-Core's ``--recompute-modules moe`` checkpoints the whole MoE layer: the routed
    copies of each token and every expert intermediate (shared experts' too) leave the stored
    activations; the router's input stays (it is the block's input)."""
    m, e = from_mapping(SMALL_DEEPSEEK), TRAINING.precision.activation_bytes
    tokens = TRAINING.micro_batch * TRAINING.seq_len
    saved = (layer_activation_bytes(m, TRAINING, _strategy(), 3)
             - layer_activation_bytes(m, TRAINING, _strategy(MOE), 3))
    width = m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn
    assert saved == pytest.approx(e * tokens * (m.top_k * m.hidden + 3 * width))
    # moe_act is part of the block: naming both saves what moe alone saves.
    both = (layer_activation_bytes(m, TRAINING, _strategy(), 3)
            - layer_activation_bytes(m, TRAINING, _strategy(MOE, ACT), 3))
    assert both == pytest.approx(saved)
    # A dense first layer has no block to recompute.
    assert (layer_activation_bytes(m, TRAINING, _strategy(MOE), 0)
            == layer_activation_bytes(m, TRAINING, _strategy(), 0))


def test_moe_recompute_reruns_the_block_with_its_all_to_alls_before_its_backward():
    job = _job(MOE)
    ops = LayerOps(job.model, job.training, job.strategy)
    block = ops.moe_recompute(3)
    forward = ops.forward(3).mlp
    assert [k.name for k in block] == [k.name for k in forward][1:-1]   # not norm2, residual2
    assert ops.recompute(3).mlp == () and ops.moe_recompute(0) == ()
    trace = build_trace(job)
    names = [op.name for p in trace.programs for op in p.ops]
    assert "bwd0.layer3.moe_recompute.ep_dispatch" in names
    assert "bwd0.layer3.moe_recompute.ep_combine" in names
    assert not any("layer0.moe_recompute" in n for n in names)
    plain = _job()
    per_token = 2.0 * moe_block_gemm_params(job.model)
    assert job.hardware_flops_per_step - plain.hardware_flops_per_step == pytest.approx(
        per_token * job.model.moe_layers * TRAINING.tokens_per_step)


def test_moe_recompute_needs_a_mixture_of_experts():
    dense = {k: v for k, v in SMALL_DEEPSEEK.items()
             if k not in ("num_experts", "top_k", "moe_ffn_hidden", "shared_experts",
                          "first_dense_layers")}
    with pytest.raises(SpecError, match="strategy.recompute_modules: moe needs a mixture"):
        Job(from_mapping(dense), TRAINING, Strategy(dp=8, recompute=Recompute.MODULES,
                                                   recompute_modules=(MOE,))).checked(8)


MLP = RecomputeModule.MLP


def test_mlp_recompute_reruns_only_the_dense_layers_mlp():
    """Megatron-Core's ``mlp`` ("recompute the dense MLP submodule") checkpoints the MLP of a
    layer without experts: its fc1, activation and fc2 rerun before their backward, their
    outputs leave the stored activations (the input stays), a MoE layer is untouched, and the
    FLOP count adds the dense layers' MLP GEMMs once more."""
    job = _job(MLP)
    ops = LayerOps(job.model, job.training, job.strategy)
    assert [k.name for k in ops.recompute(0).mlp] == ["fc1", "activation", "fc2"]
    assert ops.recompute(3).mlp == () and ops.recompute(0).attention == ()
    m, e = job.model, TRAINING.precision.activation_bytes
    tokens = TRAINING.micro_batch * TRAINING.seq_len
    saved = (layer_activation_bytes(m, TRAINING, _strategy(), 0)
             - layer_activation_bytes(m, TRAINING, _strategy(MLP), 0))
    assert saved == pytest.approx(e * tokens * 3 * m.ffn_hidden)   # fc1's two outputs, fc2's input
    assert (layer_activation_bytes(m, TRAINING, _strategy(MLP), 3)
            == layer_activation_bytes(m, TRAINING, _strategy(), 3))
    dense_layers = m.layers - m.moe_layers
    assert job.hardware_flops_per_step - _job().hardware_flops_per_step == pytest.approx(
        2.0 * 3 * m.hidden * m.ffn_hidden * dense_layers * TRAINING.tokens_per_step)

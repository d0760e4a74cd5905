"""Mixture-of-experts and MLA models read from their published config.json files: parameter
counts against the published figures (sources in workloads/hf_configs/README.md), and a key the
simulator does not understand is an error that names it."""

import json
import subprocess
import sys

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware_specs import SpecError
from clustersim.workloads.layer_ops import model_flops_per_token
from clustersim.workloads.model import PRESETS, LocalAttention, from_mapping
from clustersim.workloads.model_sources import bundled_config, from_hf_config, resolve
from tests.conftest import REPO


@pytest.mark.parametrize("name, total, active, active_kind", [
    # DeepSeek-V3 README_WEIGHTS.md: 671 B main model, 36.6 B activated including the 0.9 B
    # output head (the input embedding is a lookup); MTP counted apart (below).
    ("deepseek-v3", 671e9, 36.6e9, "compute"),
    # mistral.ai/news/mixtral-of-experts: 46.7 B total, 12.9 B per token.
    ("mixtral-8x7b", 46.7e9, 12.9e9, "all"),
    # mistral.ai/news/mixtral-8x22b: 141 B total, 39 B active.
    ("mixtral-8x22b", 141e9, 39e9, "all"),
    # gpt-oss model card (arXiv 2508.10925) Table 1: 116.83 B / 5.13 B and 20.91 B / 3.61 B.
    ("gpt-oss-120b", 116.83e9, 5.13e9, "compute"),
    ("gpt-oss-20b", 20.91e9, 3.61e9, "compute"),
])
def test_total_and_active_parameters_within_half_a_percent(name, total, active, active_kind):
    m = resolve(name)
    assert m.parameters == pytest.approx(total, rel=0.005)
    counted = m.active_compute_parameters if active_kind == "compute" else m.active_parameters
    assert counted == pytest.approx(active, rel=0.005)


@pytest.mark.parametrize("name, total, non_embedding", [
    # Qwen3 model cards: 30.5 B in total, 29.9 B non-embedding; 235 B, 234 B non-embedding.
    ("qwen3-30b-a3b", 30.5e9, 29.9e9),
    ("qwen3-235b-a22b", 235e9, 234e9),
])
def test_qwen3_totals_within_half_a_percent(name, total, non_embedding):
    m = resolve(name)
    assert m.parameters == pytest.approx(total, rel=0.005)
    without = m.parameters - m.embedding_params - m.vocab * m.hidden
    assert without == pytest.approx(non_embedding, rel=0.005)


@pytest.mark.parametrize("name, total", [
    # Meta's Llama 4 model cards: Scout 109 B, Maverick 400 B total (vision encoder included).
    ("llama4-scout", 109e9),
    ("llama4-maverick", 400e9),
])
def test_llama4_totals_within_half_a_percent(name, total):
    assert resolve(name).parameters == pytest.approx(total, rel=0.005)


@pytest.mark.parametrize("name, active, stated_to", [
    # Published to two significant figures only: Qwen3 3.3 B and 22 B activated, Llama 4 17 B.
    ("qwen3-30b-a3b", 3.3e9, 0.1e9),
    ("qwen3-235b-a22b", 22e9, 1e9),
    ("llama4-scout", 17e9, 1e9),
    ("llama4-maverick", 17e9, 1e9),
])
def test_active_parameters_to_the_published_precision(name, active, stated_to):
    assert abs(resolve(name).active_parameters - active) <= stated_to


def test_deepseek_v3_with_its_mtp_module_is_the_hub_total():
    # DeepSeek-V3 README: 685 B on the hub = 671 B main model + 14 B MTP module, which stores
    # its own copies of the embedding and the output head.
    m = resolve("deepseek-v3")
    stored = m.parameters + m.mtp_params + 2 * m.vocab * m.hidden
    assert stored == pytest.approx(685e9, rel=0.005)
    assert m.mtp_layers == 1 and m.moe_layers == 58 and m.first_dense_layers == 3


def test_deepseek_v3_mla_tensors_as_the_checkpoint_stores_them():
    m = resolve("deepseek-v3")
    assert m.is_mla and m.head_dim == 192 and m.value_head_dim == 128
    # q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
    assert m.attention_tensors() == (7168 * 1536, 1536, 1536 * 128 * 192, 7168 * (512 + 64),
                                     512, 512 * 128 * (128 + 128), 128 * 128 * 7168)


def test_layer_kinds_follow_the_configs():
    ds, mav, oss = resolve("deepseek-v3"), resolve("llama4-maverick"), resolve("gpt-oss-20b")
    assert [ds.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert [mav.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert mav.ffn_hidden == 16384 and mav.expert_ffn == 8192 and mav.shared_experts == 1
    assert oss.local_attention is LocalAttention.SLIDING and oss.local_window == 128
    assert [oss.is_global_attention(i) for i in range(4)] == [False, True, False, True]
    assert [mav.is_global_attention(i) for i in range(4)] == [False, False, False, True]


def test_mixtral_config_json_is_the_code_preset():
    m = from_hf_config(bundled_config("mixtral-8x22b").with_name("mixtral-8x7b.json"))
    assert m.parameters == PRESETS["mixtral-8x7b"].parameters
    assert m.active_parameters == PRESETS["mixtral-8x7b"].active_parameters


def _config(tmp_path, name, **change):
    cfg = json.loads(bundled_config(name).read_text())
    cfg.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name, change, message", [
    ("deepseek-v3", {"index_topk": 2048}, "config.json: index_topk): not understood"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [5]}, "mlp_only_layers): [5]"),
    ("deepseek-v3", {"moe_layer_freq": 2}, "moe_layer_freq): only 1"),
    ("gpt-oss-20b", {"layer_types": ["full_attention"] * 23 + ["sliding_attention"]},
     "layer_types): global layers are not every n-th layer"),
    # A misspelt activation would make a gated MLP ungated (a third fewer MLP weights).
    ("qwen3-30b-a3b", {"hidden_act": "silux"}, "hidden_act): expected one of Hugging Face's"),
    ("qwen3-30b-a3b", {"hidden_act": 1}, "hidden_act): expected one of"),
])
def test_a_key_that_changes_the_model_is_an_error_naming_it(tmp_path, name, change, message):
    path = _config(tmp_path, name, **change)
    with pytest.raises(SpecError) as err:
        from_hf_config(path)
    assert message in str(err.value)


@pytest.mark.slow
def test_irrelevant_keys_are_accepted_and_unknown_ones_exit_2(tmp_path):
    path = _config(tmp_path, "qwen3-30b-a3b", bos_token_id=7, rope_scaling={"factor": 4.0})
    assert from_hf_config(path).parameters == resolve("qwen3-30b-a3b").parameters
    path = _config(tmp_path, "qwen3-30b-a3b", shared_expert_intermediate_size=5632)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {path}\ntraining: {{seq_len: 4096, global_batch: 8}}\n"
                   "strategy: {dp: 8, ep: 8}\ncluster: {gpu: h100-sxm, num_gpus: 8}\n")
    run = subprocess.run([sys.executable, "-m", "clustersim", "simulate", str(cfg)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "config.json: shared_expert_intermediate_size): not understood" in run.stderr


@st.composite
def moe_models(draw):
    experts = draw(st.sampled_from([4, 8, 16, 64]))
    layers = draw(st.integers(2, 12))
    spec = {"layers": layers, "hidden": 256, "heads": 8, "vocab": 1000, "mlp": "swiglu",
            "ffn_hidden": 1024, "num_experts": experts,
            "top_k": draw(st.integers(1, min(8, experts - 1))),
            "moe_ffn_hidden": draw(st.sampled_from([128, 256, 512])),
            "shared_experts": draw(st.integers(0, 2)),
            "first_dense_layers": draw(st.integers(0, layers - 1)),
            "mtp_layers": draw(st.integers(0, 1))}
    if draw(st.booleans()):
        spec.update(kv_lora_rank=64, q_lora_rank=draw(st.sampled_from([0, 96])),
                    head_dim=48, qk_rope_head_dim=16, v_head_dim=32)
    return from_mapping(spec)


@settings(max_examples=40, deadline=None)
@given(moe_models())
def test_counts_add_up_and_active_is_below_total(m):
    layers = sum(m.layer_total(i) for i in range(m.layers))
    assert m.parameters == layers + m.embedding_params + m.head_params
    dense, expert = m.params_of_layers(range(m.layers))
    assert dense + expert == layers
    assert m.active_compute_parameters <= m.active_parameters < m.parameters
    assert m.dense_layer_params * m.layers == pytest.approx(dense)


@settings(max_examples=40, deadline=None)
@given(moe_models())
def test_one_more_expert_per_token_costs_its_gemms(m):
    more = replace(m, top_k=m.top_k + 1)
    extra = model_flops_per_token(more, 512) - model_flops_per_token(m, 512)
    moe_layers = m.moe_layers + m.mtp_layers * int(m.is_moe_layer(m.layers - 1))
    assert extra == pytest.approx(6 * moe_layers * 3 * m.hidden * m.expert_ffn, rel=1e-9)


@pytest.mark.parametrize("cfg, preset", [
    # openai-community/gpt2-xl config.json (the keys as published; 48 x 1600, V = 50,257).
    ({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
      "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
      "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
      "n_ctx": 1024, "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024,
      "output_past": True, "resid_pdrop": 0.1, "summary_activation": None,
      "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
      "summary_type": "cls_index", "summary_use_proj": True,
      "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
      "vocab_size": 50257}, 1_557_611_200),
    # bigscience/bloom-560m config.json: 559,214,592 parameters (its model card: 559M).
    ({"apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
      "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
      "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
      "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True,
      "model_type": "bloom", "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100,
      "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False,
      "slow_but_exact": False, "unk_token_id": 0, "use_cache": True, "vocab_size": 250880},
     559_214_592),
])
def test_dense_hub_configs_still_import(tmp_path, cfg, preset):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = from_hf_config(path)
    # GPT-2 XL: 1.5 B (Radford et al. 2019, Table 2), 1,557,611,200 counted with its tied head.
    assert m.parameters == preset and m.tied_embeddings

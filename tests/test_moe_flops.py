"""FLOPs of MLA and MoE layers against Megatron-LM's formula, the routing physics against balls
into bins, and the all-to-all volumes against tokens x hidden x bytes x top_k x (ep-1)/ep."""

import math

import numpy as np
import pytest

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads.layer_ops import (
    LayerOps, attended_keys, layer_forward_flops, model_flops_per_token,
)
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.routing import (
    MoeRouting, all_to_all_buffer_bytes, dispatch_bytes, expected_max_load, expert_load,
    raab_steger_max,
)
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.training import TrainingSpec, training_from_mapping


def megatron_flops_per_token(m, seq_len: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` (megatron/training/training.py, with MLA,
    MoE and MTP terms), per token, written out from its source with the full (non-causal)
    attention count our convention uses (average_ratio = 1)."""
    h, heads, L, mtp = m.hidden, m.heads, m.layers, m.mtp_layers
    nope, rope, v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.value_head_dim
    glu = 1.5
    moe_layers = m.moe_layers + mtp * int(m.is_moe_layer(L - 1))
    dense_layers = L + mtp - moe_layers
    layers = L + mtp
    q_term = m.q_lora_rank * (h + heads * (nope + rope) + 1)
    attn = 6 * layers * (q_term + m.kv_lora_rank * (h + heads * (nope + v) + 1) + h * rope
                         + heads * v * h + seq_len * heads * (nope + rope) + seq_len * heads * v)
    mlp = 12 * layers * h * (m.ffn_hidden * glu * dense_layers / layers
                             + m.expert_ffn * m.top_k * glu * moe_layers / layers
                             + m.shared_ffn * m.shared_experts * glu * moe_layers / layers)
    mtp_terms = 6 * mtp * (3 * h + 2 * h * h)
    logits = 6 * h * m.vocab * (mtp + 1)
    return mlp + attn + mtp_terms + logits


def test_deepseek_v3_flops_match_megatron_formula():
    m, s = resolve("deepseek-v3"), 4096
    layers = m.layers + m.mtp_layers
    # Megatron counts the two MLA latent norms and the MTP norms (element-wise work we keep off
    # the FLOP count); we count the router GEMM, which Megatron leaves out.
    norms = 6 * layers * (m.q_lora_rank + m.kv_lora_rank) + 6 * m.mtp_layers * 3 * m.hidden
    router = 6 * (m.moe_layers + m.mtp_layers) * m.hidden * m.num_experts
    assert model_flops_per_token(m, s) - router == pytest.approx(
        megatron_flops_per_token(m, s) - norms, rel=1e-12)


@pytest.mark.parametrize("name", ["mixtral-8x22b", "qwen3-235b-a22b", "gpt-oss-120b",
                                  "llama4-maverick"])
def test_gemm_flops_are_six_times_the_active_parameters(name):
    # Kaplan et al. 2020 (arXiv 2001.08361) sec. 2.1: C = 6 N per token, N the parameters a token
    # multiplies (the input embedding is a lookup); what is left is norms and biases.
    m = resolve(name)
    attention = sum(2.0 * 2.0 * attended_keys(m, i, 1) * m.heads
                    * (m.head_dim + m.value_head_dim) for i in range(m.layers))
    gemm = model_flops_per_token(m, 1) - 3 * attention
    assert gemm == pytest.approx(6 * m.active_compute_parameters, rel=5e-4)


def test_shared_experts_and_dense_first_layers_change_flops_as_their_widths():
    m = resolve("deepseek-v3")
    dense, moe = layer_forward_flops(m, 0, 4096), layer_forward_flops(m, 3, 4096)
    # A dense layer multiplies 3 h 18432; a MoE layer 3 h (8 + 1) 2048 plus the router h E.
    assert dense - moe == pytest.approx(2 * (3 * m.hidden * (18432 - 9 * 2048)
                                             - m.hidden * m.num_experts), rel=1e-12)


@pytest.mark.parametrize("kind, window, seq, expected", [
    ("gpt-oss-20b", 128, 4096, (128 * 129 / 2 + (4096 - 128) * 128) / 4096),
    ("llama4-scout", 8192, 16384, (8192 + 1) / 2),
])
def test_local_layers_attend_to_their_window(kind, window, seq, expected):
    m = resolve(kind)
    local = next(i for i in range(m.layers) if not m.is_global_attention(i))
    assert attended_keys(m, local, seq) == pytest.approx(expected, rel=1e-12)
    glob = next(i for i in range(m.layers) if m.is_global_attention(i))
    assert attended_keys(m, glob, seq) == seq / 2


def test_mla_kernels_sum_to_the_layer_flops():
    # The per-device kernels (tp=1, one sequence) carry the formula's GEMM FLOPs, with the
    # attention core counted causally (half the formula's).
    m = resolve("deepseek-v3")
    t = TrainingSpec(seq_len=4096, global_batch=1)
    ops = LayerOps(m, t, Strategy())
    fwd = ops.forward(0)   # a dense layer: no routing in the count
    flops = sum(k.flops for k in fwd.attention + fwd.mlp)
    core = sum(k.flops for k in fwd.attention if k.op_class is not OpClass.MATMUL)
    assert flops + core == pytest.approx(layer_forward_flops(m, 0, 4096) * 4096, rel=1e-9)


def test_busiest_expert_matches_sampling_and_raab_steger():
    rng = np.random.default_rng(7)
    n, bins = 4096 * 8 * 8, 64
    sampled = np.mean([np.bincount(rng.integers(0, bins, n), minlength=bins).max()
                       for _ in range(400)])
    ours = expected_max_load(n, np.full(bins, 1.0 / bins))
    assert ours == pytest.approx(sampled, rel=0.002)
    # Raab & Steger's N/n + sqrt(2 (N/n) ln n) is the leading term, which the lower-order
    # terms of their Theorem 1 reduce at n = 64: the excess over the mean is 0.7-1 of it.
    mean = n / bins
    assert 0.7 < (ours - mean) / (raab_steger_max(n, bins) - mean) < 1.0


def test_imbalance_grows_with_skew_and_fewer_tokens():
    balanced = expert_load(4096, 8, 256, 64)
    skewed = expert_load(4096, 8, 256, 64, MoeRouting(expert_skew=0.5))
    few = expert_load(256, 8, 256, 64)
    assert 1.0 < balanced.busiest_over_mean < skewed.busiest_over_mean
    assert few.busiest_over_mean > balanced.busiest_over_mean
    assert expert_load(4096, 2, 8, 1).busiest_over_mean == 1.0   # one device: the total


def test_capacity_drops_tokens_and_padding_computes_the_capacity():
    dropless = expert_load(4096, 8, 256, 64)
    capped = expert_load(4096, 8, 256, 64, MoeRouting(capacity_factor=1.0))
    loose = expert_load(4096, 8, 256, 64, MoeRouting(capacity_factor=2.0))
    padded = expert_load(4096, 8, 256, 64, MoeRouting(capacity_factor=1.25, pad_to_capacity=True))
    assert padded.sent_per_token == 256 * math.ceil(1.25 * 4096 * 8 / 256) / 4096
    assert dropless.dropped_fraction == 0.0 <= loose.dropped_fraction < capped.dropped_fraction
    assert loose.dropped_fraction < 1e-9
    # Each source device keeps at most ceil(1.0 x 4096 x 8 / 256) = 128 tokens per expert:
    # against sampled uniform routing of its 32,768 token-expert pairs.
    rng = np.random.default_rng(3)
    over = [np.maximum(np.bincount(rng.integers(0, 256, 4096 * 8), minlength=256) - 128, 0).sum()
            for _ in range(300)]
    assert capped.dropped_fraction == pytest.approx(np.mean(over) / (4096 * 8), rel=0.05)
    assert capped.tokens_per_expert <= 4096 * 8 * 64 / 256
    assert padded.tokens_per_expert == 64 * math.ceil(1.25 * 4096 * 8 / 256)
    assert capped.sent_per_token == pytest.approx(8 * (1 - capped.dropped_fraction))


def test_grouped_gemm_rows_are_the_busiest_devices_tokens_per_expert():
    m = resolve("qwen3-30b-a3b")
    t = TrainingSpec(seq_len=4096, global_batch=8)
    few = LayerOps(m, t, Strategy(dp=8, ep=8)).forward()
    fc1 = next(k for k in few.mlp if k.name == "expert_fc1")
    load = expert_load(4096, 8, 128, 8)
    assert fc1.batch == 16 and fc1.m == math.ceil(load.tokens_per_expert)
    assert 4096 * 8 * 8 / 128 < fc1.m < 1.05 * 4096 * 8 * 8 / 128


@pytest.mark.parametrize("tokens, hidden, elem, top_k, ep", [
    (4096, 7168, 2, 8, 64), (4096, 7168, 1, 8, 8), (8192, 4096, 2, 2, 8), (2048, 2048, 2, 8, 2),
])
def test_all_to_all_volume_per_device_is_the_analytic_formula(tokens, hidden, elem, top_k, ep):
    from clustersim.simulator.cost.network import bus_factor
    from clustersim.workloads.trace import CollectiveKind
    formula = tokens * hidden * elem * top_k * (ep - 1) / ep
    assert dispatch_bytes(tokens, hidden, elem, top_k, ep) == pytest.approx(formula, rel=1e-12)
    # The collective carries the whole buffer; the network model sends (ep-1)/ep of it.
    sent = all_to_all_buffer_bytes(tokens, hidden, elem, top_k) * bus_factor(
        CollectiveKind.ALL_TO_ALL, ep)
    assert sent == pytest.approx(formula, rel=1e-12)


def test_moe_routing_options_are_read_and_checked():
    t = training_from_mapping({"seq_len": 4096, "global_batch": 8,
                               "moe": {"capacity_factor": 1.25, "pad_to_capacity": True}})
    assert t.moe == MoeRouting(capacity_factor=1.25, pad_to_capacity=True)
    with pytest.raises(SpecError, match="training.moe.pad_to_capacity: needs a capacity_factor"):
        training_from_mapping({"seq_len": 4096, "global_batch": 8,
                               "moe": {"pad_to_capacity": True}})
    with pytest.raises(SpecError, match="training.moe.capacity: unknown field"):
        training_from_mapping({"seq_len": 4096, "global_batch": 8, "moe": {"capacity": 1}})


def test_moe_and_mla_activations_per_layer_kind():
    from clustersim.workloads.memory import layer_activation_bytes
    m = resolve("deepseek-v3")
    t = TrainingSpec(seq_len=4096, global_batch=1)
    s = Strategy()
    dense, moe = (layer_activation_bytes(m, t, s, 0), layer_activation_bytes(m, t, s, 3))
    # A MoE layer keeps each token's 8 routed copies (h each) and the gate/up/down tensors of
    # 8 routed experts and the shared one (3 x 9 x 2048) where a dense layer keeps 3 x 18432.
    per_token = 2.0 * (8 * m.hidden + 3 * (9 * 2048 - 18432))
    assert moe - dense == pytest.approx(4096 * per_token, rel=1e-12)
    # MLA: values and attention output are 128 wide per head, queries and keys 192.
    assert m.v_dim == m.attn_out_dim == 128 * 128 and m.q_dim == m.kv_dim == 128 * 192


def test_grouped_gemm_efficiency_falls_with_tokens_per_expert(catalog):
    # The grouped expert GEMM tiles each expert's rows (NVIDIA's Matrix Multiplication
    # Background guide: tile and wave quantization), so fewer tokens per expert waste more of
    # each tile: Qwen3-30B-A3B at EP8 with 4,096 tokens per device (about 2,090 rows per
    # expert) against 128 tokens (about 75 rows).
    from clustersim.simulator.cost.compute import ComputeModel
    compute = ComputeModel(catalog.device("h100-sxm"))
    m = resolve("qwen3-30b-a3b")

    def fc1(seq):
        ops = LayerOps(m, TrainingSpec(seq_len=seq, global_batch=8), Strategy(dp=8, ep=8))
        return next(k for k in ops.forward().mlp if k.name == "expert_fc1")
    long, short = fc1(4096), fc1(128)
    assert short.m < 100 < 2000 < long.m
    assert compute.efficiency(short) < 0.8 * compute.efficiency(long)

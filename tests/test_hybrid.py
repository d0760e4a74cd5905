"""Hybrid Mamba-2 / attention / MoE stacks (Nemotron 3): the layer pattern, parameter counts
against the published ones, the SSD scan's FLOPs against the Mamba-2 paper's algorithm, the
kernels a Mamba layer runs, and a simulated step from the command line."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads.hybrid import (
    LayerType, parse_pattern, ssd_backward_flops_per_token, ssd_flops_per_token,
)
from clustersim.workloads.layer_ops import LayerOps, model_flops_per_token
from clustersim.workloads.model import PRESETS, check, from_mapping
from clustersim.workloads.shards import layer_tensors
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.training import Precision, TrainingSpec
from clustersim.hardware_specs import OpClass
from tests.conftest import REPO

NANO = PRESETS["nemotron3-nano-30b-a3b"]


def test_nemotron3_nano_parameters_match_the_published_counts():
    """Nemotron 3 Nano technical report (NVIDIA, arXiv 2512.20848) and the model card: 31.6 B
    parameters, 3.2 B active per token (3.6 B with the embeddings). Megatron-Bridge's model
    page (docs/models/nemotron/nemotron3-nano.md @ 067f987d) rounds them to 30 B and 3.5 B."""
    assert NANO.parameters == pytest.approx(31.6e9, rel=0.005)
    # The active counts are published to one decimal: within half of its last digit.
    assert abs(NANO.active_parameters - 3.6e9) <= 0.05e9
    assert abs(NANO.active_compute_parameters - 3.2e9) <= 0.05e9


def test_nemotron3_nano_layers_are_its_pattern():
    kinds = parse_pattern(NANO.hybrid_pattern)
    assert len(kinds) == NANO.layers == 52
    assert kinds.count(LayerType.MAMBA) == 23 and kinds.count(LayerType.MOE) == 23
    assert kinds.count(LayerType.ATTENTION) == 6 and NANO.moe_layers == 23


def test_a_mamba_layer_counts_megatrons_mixer_tensors():
    """MambaMixer.__init__ (Megatron-LM megatron/core/ssm/mamba_mixer.py): in_proj h x (2 d_inner
    + 2 G N + H), conv1d (d_inner + 2 G N) x (K + 1), dt_bias, A_log and D of H each, the gated
    norm's d_inner and out_proj d_inner x h; the layer adds its pre-norm of h."""
    h, d_inner, g, n, heads = 2688, 64 * 64, 8, 128, 64
    mixer = (h * (2 * d_inner + 2 * g * n + heads) + (d_inner + 2 * g * n) * 5 + 3 * heads
             + d_inner + d_inner * h)
    assert NANO.mamba_params == mixer
    assert NANO.layer_parts(0) == (h + mixer, 0)
    for layer in (0, 1, 5):   # M, E, *: the tensors the trace shards add up to the layer
        assert sum(t.params for t in layer_tensors(NANO, layer)) == sum(NANO.layer_parts(layer))


@pytest.mark.parametrize("pattern, message", [
    ("MEX", "unknown layer symbol 'X' at position 2"),
    ("ME|M", "unknown layer symbol '|' at position 2"),
])
def test_an_unknown_pattern_symbol_is_an_error_naming_it(pattern, message):
    data = {"base": "nemotron3-nano-30b-a3b", "layers": len(pattern), "hybrid_pattern": pattern}
    with pytest.raises(SpecError, match="model.hybrid_pattern") as err:
        from_mapping(data)
    assert message in str(err.value)


def test_a_pattern_of_the_wrong_length_or_a_mixer_without_sizes_is_an_error():
    with pytest.raises(SpecError, match="has 3 symbols for model.layers=52"):
        check(replace(NANO, hybrid_pattern="MEM"))
    with pytest.raises(SpecError, match="model.mamba_state"):
        check(replace(NANO, mamba_state=0))
    with pytest.raises(SpecError, match="model.mamba_heads"):
        check(replace(PRESETS["llama3-8b"], mamba_heads=8))


def _explicit_ssd_flops(tokens, heads, p, n, groups, q):
    """The four steps of the Mamba-2 paper's SSD algorithm (arXiv 2405.21060, sec. 6) as
    products of their matrix shapes, chunk by chunk."""
    chunks = tokens // q
    diagonal = chunks * (groups * 2 * q * q * n + heads * 2 * q * q * p)   # C B^T; (L o CB) X
    states = chunks * heads * 2 * n * q * p                                # B^T X
    passing = chunks * heads * 2 * n * p                                   # h_c = a h_c-1 + s_c
    outputs = chunks * heads * 2 * q * n * p                               # C h
    return diagonal + states + passing + outputs


@pytest.mark.parametrize("heads, p, n, groups, q", [(64, 64, 128, 8, 128), (128, 64, 128, 1, 256),
                                                    (24, 64, 64, 1, 64)])
def test_ssd_flops_are_the_papers_four_steps(heads, p, n, groups, q):
    tokens = 16 * q
    per_token = ssd_flops_per_token(heads, p, n, groups, q)
    assert per_token * tokens == pytest.approx(_explicit_ssd_flops(tokens, heads, p, n, groups, q),
                                               rel=1e-12)


def test_ssd_flops_grow_as_t_n_squared_when_n_p_q_are_equal():
    """Sec. 6: with N = P = Q the algorithm costs O(T N^2) FLOPs: doubling N quadruples it."""
    small, large = (ssd_flops_per_token(8, d, d, 1, d) for d in (64, 128))
    assert large / small == pytest.approx(4.0, rel=0.01)


def _kernels(tp=1):
    training = TrainingSpec(seq_len=8192, global_batch=512, micro_batch=1,
                            precision=Precision.BF16)
    strategy = Strategy(tp=tp, dp=8 // tp, ep=8 // tp)
    return LayerOps(NANO, training, strategy), training


@pytest.mark.parametrize("tp", [1, 2])
def test_a_mamba_layer_runs_megatrons_kernels_with_the_scans_flops(tp):
    ops, t = _kernels(tp)
    forward = ops.forward(0)
    names = [k.name for k in forward.attention]
    assert names == ["norm1", "in_proj", "conv1d", "ssd_chunk_cumsum", "ssd_chunk_state",
                     "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan", "mamba_norm",
                     "out_proj", "residual1"]
    assert forward.mlp == ()
    tokens = t.micro_batch * t.seq_len
    m = NANO
    scan = [k for k in forward.attention if k.op_class is OpClass.SSD]
    ssd = ssd_flops_per_token(m.mamba_heads // tp, m.mamba_head_dim, m.mamba_state,
                              m.mamba_groups // tp, m.mamba_chunk)
    # chunk_cumsum's two FLOPs per token and head are outside the paper's count
    assert sum(k.flops for k in scan) == pytest.approx(tokens * (ssd + 2 * m.mamba_heads // tp))
    backward = [k for k in ops.backward(0).attention if k.op_class is OpClass.SSD]
    bwd = ssd_backward_flops_per_token(m.mamba_heads // tp, m.mamba_head_dim, m.mamba_state,
                                       m.mamba_groups // tp, m.mamba_chunk)
    assert sum(k.flops for k in backward) == pytest.approx(tokens * (bwd + 4 * m.mamba_heads // tp))
    assert "conv1d.recompute" in [k.name for k in ops.backward(0).attention]


def test_moe_and_attention_layers_hold_one_block_each():
    ops, _ = _kernels()
    assert ops.forward(1).attention == () and "expert_fc1" in [k.name for k in ops.forward(1).mlp]
    assert ops.forward(5).mlp == () and "flash_attn" in [k.name for k in ops.forward(5).attention]


def test_model_flops_count_the_projections_the_scan_and_the_experts():
    """Per token and layer: a Mamba layer its two projections and the scan, an attention layer
    its projections and (non-causal) core, a MoE layer router, shared and six routed experts."""
    m, s = NANO, 8192
    width = 2 * 4096 + 2 * 8 * 128 + 64
    mamba = 2 * 2688 * (width + 4096) + ssd_flops_per_token(64, 64, 128, 8, 128)
    attention = 2 * 2688 * (4096 + 256 + 256 + 4096) + 2 * s * 32 * (128 + 128)
    moe = 2 * 2688 * 128 + 2 * 2 * 2688 * (6 * 1856 + 3712)
    forward = 23 * mamba + 6 * attention + 23 * moe + 2 * 2688 * 131072
    assert model_flops_per_token(m, s) == pytest.approx(3 * forward)


def test_simulate_a_nemotron3_nano_step_from_the_command_line(tmp_path):
    config = tmp_path / "nano.yaml"
    config.write_text(
        "name: nano\nmodel: nemotron3-nano-30b-a3b\n"
        "training: {seq_len: 8192, global_batch: 64, micro_batch: 4, precision: fp8,"
        " fp8_recipe: mxfp8, attention: flash3}\n"
        "strategy: {tp: 1, pp: 1, dp: 8, ep: 8, zero: 1, ep_dispatcher: deepep}\n"
        "cluster: {gpu: gb300, num_gpus: 8, gpus_per_node: 4}\n")
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "clustersim", "simulate", str(config), "--json",
                          str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "nemotron3-nano-30b-a3b (31.58B parameters)" in run.stdout
    data = json.loads(out.read_text())
    assert data["step_time_s"] > 0 and data["fits_in_memory"]
    assert data["breakdown"]["compute_s"] > 0


@pytest.mark.parametrize("strategy, field", [
    ("{tp: 1, pp: 1, dp: 4, cp: 2, ep: 4}", "strategy.cp"),
    ("{tp: 1, pp: 1, dp: 8, ep: 8, recompute: modules, recompute_modules: [moe]}",
     "strategy.recompute"),
])
def test_what_hybrid_stacks_do_not_model_is_an_error(tmp_path, strategy, field):
    config = tmp_path / "nano.yaml"
    config.write_text(
        "name: nano\nmodel: nemotron3-nano-30b-a3b\n"
        "training: {seq_len: 8192, global_batch: 64, micro_batch: 1}\n"
        f"strategy: {strategy}\n"
        "cluster: {gpu: gb300, num_gpus: 8, gpus_per_node: 4}\n")
    run = subprocess.run([sys.executable, "-m", "clustersim", "simulate", str(config)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and field in run.stderr, run.stderr

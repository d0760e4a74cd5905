"""Long sequences: the attention formulas the long-context runs rest on, tested against their
sources, and published runs of analysis/data/published_runs_long_context.csv within 15% (issue
16's bar) or strict xfails that say what is off. The whole table runs with ``clustersim validate
--runs analysis/data/published_runs_long_context.csv``; analysis/data/README.md discusses it."""

import csv

import pytest

from clustersim.analysis.step import run_step
from clustersim.analysis.validation.published import row_config
from clustersim.workloads.layer_ops import LayerOps, model_flops_per_token
from clustersim.workloads.model import PRESETS
from clustersim.workloads.strategy import CpAlgorithm, Strategy
from clustersim.workloads.training import training_from_mapping

from tests.conftest import REPO

TOLERANCE = 0.15
LONG = REPO / "analysis/data/published_runs_long_context.csv"


def _flash(model, seq, tp, cp, algorithm=CpAlgorithm.RING):
    training = training_from_mapping({"seq_len": seq, "global_batch": 8, "attention": "flash3"})
    ops = LayerOps(model, training, Strategy(tp=tp, cp=cp, dp=8 // (tp * cp) or 1,
                                             cp_algorithm=algorithm,
                                             sequence_parallel=tp > 1))
    fwd = next(k for k in ops.forward().attention if k.name == "flash_attn")
    bwd = next(k for k in ops.backward().attention if k.name == "flash_attn.bwd")
    return fwd, bwd


@pytest.mark.parametrize("tp, cp", [(1, 1), (2, 2), (1, 8), (4, 2)])
def test_causal_attention_per_rank_is_flashattention3s_count_split_over_tp_and_cp(tp, cp):
    """FlashAttention-3 (arXiv 2407.08608) sec. 4.1: forward FLOPs 4 s^2 d heads per sequence,
    halved under a causal mask; backward 2.5x forward. The load-balanced CP split (2 cp chunks,
    rank i holding chunks i and 2cp-1-i) gives every rank 1/cp of it, and TP 1/tp of the heads."""
    m, seq = PRESETS["llama2-7b"], 131072
    fwd, bwd = _flash(m, seq, tp, cp)
    whole = 4.0 * seq**2 * m.head_dim * m.heads / 2
    assert fwd.flops == pytest.approx(whole / (tp * cp), rel=1e-12)
    assert bwd.flops == pytest.approx(2.5 * fwd.flops, rel=1e-12)


def test_ulysses_moves_heads_not_work():
    """DeepSpeed-Ulysses (arXiv 2309.14509 sec. 3): cp times the tokens with 1/cp of the heads,
    the same FLOPs per rank as the ring."""
    m = PRESETS["llama3-8b"]
    ring, _ = _flash(m, 65536, 1, 4)
    ulysses, _ = _flash(m, 65536, 1, 4, CpAlgorithm.ULYSSES)
    assert ulysses.flops == pytest.approx(ring.flops, rel=1e-12)


def test_mfu_count_is_the_full_attention_convention_of_meta_and_megatron_2024():
    """The published 128K rows quote TFLOPS under the full (not causal-halved) count:
    torchtitan's get_num_flop_per_token, 6 N + 12 l h q t with N without the embedding ('we
    follow the convention and do not account for sparsity in causal attention'); the kernels
    themselves do half the attention work (test above)."""
    m, seq = PRESETS["llama3-8b"], 131072
    non_embedding = m.parameters - m.embedding_params
    expected = 6 * non_embedding + 12 * m.layers * m.heads * m.head_dim * seq
    assert model_flops_per_token(m, seq) == pytest.approx(expected, rel=2e-4)


WITHIN = (
    "torchtitan_llama3_8b_8gpu_fsdp2_cp4",        # 128K, all-gather CP (PyTorch's default)
    "torchtitan_llama3_8b_8gpu_fsdp1_cp8",        # 256K
    "torchtitan_llama3_405b_512gpu_fsdp2_cp4",    # 128K
    "torchtitan_llama3_405b_512gpu_fsdp1_cp8",    # 256K
    "nemo_llama2_7b_h100_4k_cp1",                 # the NeMo table's short end, no CP
    "nemo_llama2_7b_h100_16k_cp1",
    "nemo_llama2_7b_h100_32k_cp2",                # ring CP 2
    # 128K to 1M: attention at the key length each ring step's kernel loops over (32K), faster
    # per FLOP than at the 2K-dominated dev rows its in-training factor was fitted on.
    "nemo_llama2_7b_h100_128k_cp4",
    "nemo_llama2_7b_h100_256k_cp8",
    "nemo_llama2_7b_h100_512k_cp16",
    "nemo_llama2_7b_h100_1024k_cp32",
)
OFF = {
    "mz_qwen3_235b_h100_16k_cp1": "+17% without context parallelism, as the same model is "
    "+17% to +19% at 32K-128K with CP 2-8: what is off is the mixture of experts (DeepEP "
    "dispatch, grouped GEMMs), not the long sequence",
    "llama3_herd_405b_128k_16384gpu": "fits (77.7 GiB must fit of 80; the allocator's "
    "fragmentation on top is given back under pressure) with the paper's interleaved "
    "PP16 x 8 pipeline and no recompute (Meta states neither recompute nor its memory); the "
    "step is -22% with a FlashAttention-3-class kernel, and the paper does not name its "
    "attention kernel",
}


def _cases():
    rows = {r["id"]: r for r in csv.DictReader(LONG.open())}
    for row_id in WITHIN + tuple(OFF):
        marks = [pytest.mark.xfail(strict=True, reason=OFF[row_id])] if row_id in OFF else []
        yield pytest.param(rows[row_id], id=row_id, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("row", list(_cases()))
def test_published_long_context_step_within_15_percent(catalog, row):
    result = run_step(row_config(row, catalog)).result
    assert result.fits_in_memory
    assert result.step_time_s == pytest.approx(float(row["measured_step_time_s"]), rel=TOLERANCE)

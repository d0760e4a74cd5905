"""Published Blackwell training runs (analysis/data/published_runs_blackwell.csv): the file's
provenance, the dense rows the model gets right within a stated tolerance, and the rows it gets
wrong for a stated reason (strict xfails: they fail loudly once the reason is fixed)."""

import csv
import json

import pytest

from clustersim.analysis.step import run_step
from clustersim.analysis.validation.published import row_config
from clustersim.hardware_specs import SpecError

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # published runs of hundreds of GPUs, simulated in full

RUNS = REPO / "analysis/data/published_runs_blackwell.csv"
ROWS = {r["id"]: r for r in csv.DictReader(RUNS.open())}

TOLERANCE = 0.12
"""Issue 15's bar for published B200/GB200/GB300 runs (MAPE within 12%), held row by row."""

ACCURATE = [   # errors as measured at 1bd5dfa, before FP8 was modelled as the frameworks run it
    # DGX-B200, Megatron-Bridge 25.11 and NeMo 25.02 (8 GPUs per node, 8 x 400G ConnectX-7)
    "mbridge_25.11_b200_llama3_8b_fp8_8gpu",
    "mbridge_25.11_b200_llama3.1_405b_fp8_128gpu",
    "nemo_25.02_b200_llama3_70b_fp8_64gpu",
    "nemo_25.02_b200_gpt3_175b_fp8_512gpu",
    "nemo_25.02_b200_nemotron4_340b_fp8_128gpu",
    # DGX-GB200 (NVL72 racks, used 64 at a time past one rack)
    "mbridge_25.11_gb200_llama3_8b_fp8_8gpu",
    "nemo_25.04_gb200_nemotron4_15b_fp8_64gpu",
    # NeMo 25.04 on GB200, current scaling run as fp8_recipe tensorwise (as their source says)
    "nemo_25.04_gb200_llama3.1_405b_fp8_128gpu",
]

MXFP8_ACCURATE = [   # fp8_recipe mxfp8: Blackwell block scaling at the FP8 rate (workloads/fp8.py)
    "mbridge_25.11_b200_llama3_8b_mxfp8_8gpu",
    "mbridge_25.11_gb200_llama3_8b_mxfp8_8gpu",
    "mbridge_26.04.01_gb200_llama3_70b_mxfp8_64gpu",
    "mbridge_25.11_b200_llama3.1_405b_mxfp8_128gpu",
    # GB300 with Blackwell Ultra's exponential rate in attention (+14.0% before it)
    "mbridge_25.11_gb300_llama3_8b_mxfp8_8gpu",
]

NVFP4_ACCURATE = [   # precision nvfp4: TE's NVFP4 recipe, GEMMs at 1.90x FP8 (workloads/fp8.py)
    "mbridge_26.06_gb200_llama3.1_405b_nvfp4_256gpu",
    "mbridge_26.04.01_gb200_llama3_70b_nvfp4_64gpu",
]

GB300_UNKNOWN = (
    "GB300 runs 16-36% faster per GPU than GB200 on the same Llama layouts (8B on 8 GPUs, no "
    "network: 37,556 against 31,508 tokens/s/GPU in 25.11) although NVIDIA prints the same dense "
    "BF16 and FP8 rates for both (2.5 and 5 PFLOPS), and the recipes match at each release. "
    "Blackwell Ultra's doubled exponential rate is modelled (attention_exp_rate: 1-3 points of a "
    "Llama row); the rest, FP8 GEMMs about 1.2x GB200's, is not quantified by any measurement we "
    "have: 1,400 W against 1,200 W per GPU (clocks under the power cap are unpublished), and "
    "newer GB300 software (the same 70B FSDP recipe: 7.25 s in 25.11, 6.24 s in 26.04.01).")
EARLY_SOFTWARE = (
    "NeMo 25.02 (February 2025) on B200 runs slower than the model (Nemotron-4 15B -14%; Llama 3 8B -10.5%), whose Blackwell kernel "
    "figures were measured later (MAMF with torch 2.7-2.10 and CUDA 12.8-13.0, FlashAttention-4 "
    "4.0.0b22 in 2026): the same Llama 3 8B layout gives 26,006 tokens/s/GPU in 25.02 and 30,624 "
    "in Megatron-Bridge 25.11. Early-software efficiency is not modelled.")

FP8_AS_RUN = (
    "Predicted 12.2% too fast since FP8 is modelled as the frameworks run it (only linear GEMMs "
    "in FP8, weights cast once per step: commits ba5f27a and 6bf5e0b); it was -10.5% before. "
    "NeMo 25.02 ran delayed scaling, its only recipe then; which FP8 cost that early software "
    "still paid is not analysed.")

MXFP8_25_09_GB200 = (
    "Megatron-Bridge 25.09's MXFP8 405B step on 128 GB200 (7.09 s) is slower than its own B200 "
    "step of the same release (6.59 s) and than the model (5.41 s); what 25.09 paid on GB200 is "
    "not known (no MXFP8 kernel measurement of that release)")
NVFP4_GB300 = ("NVFP4 GEMMs run 1.90x the FP8 rate (TE's B300 benchmark), so GB300's NVFP4 rows "
               "inherit its FP8 rows' gap: " + GB300_UNKNOWN)
NVFP4_26_02 = (
    "Megatron-Bridge 26.02's NVFP4 70B step on 64 GB200 (7.35 s) is 9% slower than 26.04.01's "
    "with the same layout (6.74 s); the model's one NVFP4 GEMM rate (TE's 2026 B300 benchmark) "
    "is faster than both, and which NVFP4 kernels 26.02 shipped is not known")

TWO_RACKS_25_04 = (
    "NeMo 25.04's Nemotron-4 340B step on 128 GB200 (two racks of 64) comes out 13% fast since "
    "Blackwell's per-tensor FP8 casts write no transpose (Transformer Engine keeps none where FP8 "
    "GEMMs take any layout: commit 61479a2); it was -11.9% before, and -12.2% before attention ran "
    "at its 4K key length. The release's other two-rack row (Llama 3.1 405B) is 11% fast too. "
    "Across two GB200 racks the model meets CoreWeave's all-reduce from 4 GiB but is 17-41% fast "
    "at 512 MiB-2 GiB, a per-call cost on the rack's NVLink fabric that it lacks "
    "(tests/test_multinode_sweeps.py); whether that is what these releases lose is not known.")


def _off(row_id: str, reason: str):
    return pytest.param(row_id, marks=pytest.mark.xfail(strict=True, reason=reason))


OFF = [
    _off("nemo_25.02_b200_llama3_8b_fp8_8gpu", FP8_AS_RUN),
    _off("mbridge_25.11_gb300_llama3_8b_fp8_8gpu", GB300_UNKNOWN),
    _off("nemo_25.02_b200_nemotron4_15b_fp8_64gpu", EARLY_SOFTWARE),
    _off("mbridge_25.09_gb200_llama3.1_405b_mxfp8_128gpu", MXFP8_25_09_GB200),
    _off("mbridge_26.04.01_gb300_llama3.1_405b_nvfp4_256gpu", NVFP4_GB300),
    _off("mbridge_26.02_gb200_llama3_70b_nvfp4_64gpu", NVFP4_26_02),
    _off("nemo_25.04_gb200_nemotron4_340b_fp8_128gpu", TWO_RACKS_25_04),
]


def _run(catalog, row_id):
    row = ROWS[row_id]
    result = run_step(row_config(row, catalog)).result
    return result, result.step_time_s / float(row["measured_step_time_s"]) - 1


def test_every_row_has_a_source_a_layout_that_multiplies_out_and_a_unique_id():
    rows = list(csv.DictReader(RUNS.open()))
    assert len(ROWS) == len(rows) and len(rows) >= 60
    for r in rows:
        assert r["source"] and r["notes"] and float(r["measured_step_time_s"]) > 0, r["id"]
        assert int(r["tp"]) * int(r["pp"]) * int(r["dp"]) * int(r["cp"]) == int(r["num_gpus"])
        assert r["gpu"] in {"b200", "b300", "gb200", "gb300"}, r["id"]
        moe = r["moe"] == "true"
        assert bool(r["model"]) == moe and bool(r["layers"]) != moe, r["id"]


@pytest.mark.parametrize("row_id", ACCURATE)
def test_dense_blackwell_runs_within_tolerance(catalog, row_id):
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory


@pytest.mark.parametrize("row_id", MXFP8_ACCURATE)
def test_mxfp8_blackwell_runs_within_tolerance(catalog, row_id):
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory


def test_every_row_maps(catalog):
    """Every row runs: MXFP8 as fp8 with the mxfp8 recipe, NVFP4 as nvfp4, PP16 x VP8 over 126
    layers with Megatron-Core's split that counts the embedding and the loss as layers, as the
    recipes set it."""
    for row in ROWS.values():
        row_config(row, catalog)


@pytest.mark.parametrize("row_id", NVFP4_ACCURATE)
def test_nvfp4_blackwell_runs_within_tolerance(catalog, row_id):
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory


@pytest.mark.parametrize("row_id", OFF)
def test_dense_blackwell_runs_off_for_a_stated_reason(catalog, row_id):
    _, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"


FSDP_OFFLOAD = [   # Megatron-FSDP rows whose recipes offload activations (cpu_offloading_num_layers)
    "mbridge_25.09_gb200_llama3_70b_fp8_64gpu",       # 40 of 80 layers
    "mbridge_25.11_gb300_llama3_70b_fp8_64gpu",       # 20 of 80
    "mbridge_25.09_gb200_llama3.1_405b_fp8_128gpu",   # 95 of 126
]


@pytest.mark.parametrize("row_id", FSDP_OFFLOAD)
def test_fsdp_rows_fit_with_their_recipes_activation_offload(catalog, row_id):
    """These runs ran: with the activation offload of their recipe they fit the GPU's HBM; the
    same jobs keeping every layer's activations would not (70B at MBS 2 keeps about 300 GiB)."""
    row = ROWS[row_id]
    assert int(row["offload_activation_layers"]) > 0
    assert run_step(row_config(row, catalog)).result.fits_in_memory
    kept = dict(row, offload_activation_layers="0")
    assert not run_step(row_config(kept, catalog)).result.fits_in_memory


def test_every_published_blackwell_row_fits_in_memory():
    """Each row is a run that ran: none may be predicted out of memory (validate's golden)."""
    golden = json.loads((REPO / "tests/golden/validate_blackwell.json").read_text())
    assert golden["summary"]["not_fitting"] == 0
    assert all(r["fits_in_memory"] for r in golden["rows"].values())


DEEPSEEK_V3 = [   # 26.04.01, with the dispatcher, overlap, recompute and layout of its recipe
    "mbridge_26.04.01_b200_deepseekv3_mxfp8_256gpu",    # EP32 over four nodes, DeepEP
    "mbridge_26.04.01_b300_deepseekv3_mxfp8_256gpu",
    "mbridge_26.04.01_gb200_deepseekv3_mxfp8_256gpu",
    _off("mbridge_26.04.01_gb300_deepseekv3_mxfp8_256gpu",  # +13.1% before the exp rate
         "+12.3% since attention runs at its key length (FlashAttention-4's in-step figure "
         "holds at 8K; this 4K step runs it at 0.94 of that, +11.1% before): " + GB300_UNKNOWN),
]


@pytest.mark.parametrize("row_id", DEEPSEEK_V3)
def test_deepseek_v3_runs_as_its_recipe_within_tolerance(catalog, row_id):
    """Megatron-Bridge's 26.04.01 recipes (tag v0.4.2) run DeepSeek-V3 on B200 with DeepEP and
    the 1F1B all-to-all overlap across four 8-GPU nodes; with NCCL's all-to-all and no
    overlap, as the row was read before, the step came out +161%."""
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory


def test_a_row_states_its_layers_per_pipeline_chunk(catalog):
    """``layers_per_stage`` (whole numbers, one per chunk) carries a recipe's pipeline layout:
    DeepSeek-V3's ``Et*4|(t*4|)*14tmL`` on PP8 x VP2 is fifteen chunks of four layers and a
    last one of one layer with the MTP module and the loss."""
    row = ROWS["mbridge_26.04.01_b200_deepseekv3_mxfp8_256gpu"]
    strategy = row_config(row, catalog).job.strategy
    assert strategy.layers_per_stage == (4,) * 15 + (1,)
    with pytest.raises(SpecError, match="layers_per_stage: expected whole numbers"):
        row_config(dict(row, layers_per_stage="4 4 x"), catalog)
    with pytest.raises(SpecError, match="layers_per_stage: has 2 entries"):
        row_config(dict(row, layers_per_stage="60 1"), catalog)


GPT_OSS_FAST = (
    "Every GPT-OSS 120B row of these tables is predicted too fast: the BF16 rows of 26.02.01 to "
    "26.04.01 by 18-35% on all four systems, these MXFP8 rows of 26.06 by 14% (GB200) and 22% "
    "(B300); GB300's comes out +1.8% only with GB300's own unexplained gap on top. Its "
    "attention is not the missing time: cuDNN's sliding-window kernel skips the blocks outside "
    "the band (cudnn-frontend's GB200 benchmark, cuDNN 9.22-9.27, grows linearly with the "
    "sequence), and at its measured 150-190 TFLOP/s rather than the model's 240-260 the banded "
    "layers would add under 1% of a step; what else GPT-OSS pays (128 small experts of width "
    "2,880, per-module host time) is not measured.")
GPT_OSS_CUDNN = (
    "The 26.06.01 table's footnote: 'Performance regression in GPT-OSS 120B pre-training is a "
    "known issue (NVIDIA/cudnn-frontend#256). It will be resolved with the next container "
    "release.' The issue: the CuTe-DSL fused grouped MLP's dGLU backward kernel "
    "(grouped_gemm_dglu_wrapper_sm100, which these presets' cutedsl_fused_grouped_mlp runs) 10x "
    "slower from cudnn-frontend 1.24.0 on GB200-class GPUs. The same presets measured 39% (GB300) "
    "and 37% (GB200) more tokens/s/GPU in 26.06 and again in 26.08; the model describes the "
    "intended kernels, not the regressed one (GB200 also carries the gap of every GPT-OSS row: "
    "-14% on its 26.06 and 26.08 twins).")
GB300_FULL_ITERATION = (
    "+15% to +30% on GB300 with the 26.06 full-iteration recipes, where the same presets on "
    "GB200 come out +4% to +9%: " + GB300_UNKNOWN)

RECIPES_26_06 = [   # 26.06 (tag v0.5.0) and 26.06.01 (v0.5.1) MoE rows, as their recipes ran
    "mbridge_26.06_gb200_deepseekv3_mxfp8_256gpu",
    "mbridge_26.06.01_gb200_deepseekv3_mxfp8_256gpu",
    "mbridge_26.06_b300_deepseekv3_mxfp8_256gpu",
    "mbridge_26.06_gb300_gpt_oss_120b_mxfp8_64gpu",
    "mbridge_26.06_gb200_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_26.06.01_gb200_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_26.06_b300_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_26.06_gb200_qwen3_235b_a22b_mxfp8_256gpu",
    "mbridge_26.06.01_gb200_qwen3_235b_a22b_mxfp8_256gpu",
    _off("mbridge_26.06_gb300_deepseekv3_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06_gb300_deepseekv3_mxfp8_256gpu_gbs15360", GB300_FULL_ITERATION),
    _off("mbridge_26.06.01_gb300_deepseekv3_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06_gb300_qwen3_30b_a3b_mxfp8_8gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06.01_gb300_qwen3_30b_a3b_mxfp8_8gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06_gb300_qwen3_235b_a22b_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06.01_gb300_qwen3_235b_a22b_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.06_gb200_gpt_oss_120b_mxfp8_64gpu", GPT_OSS_FAST),
    _off("mbridge_26.06_b300_gpt_oss_120b_mxfp8_64gpu", GPT_OSS_FAST),
    _off("mbridge_26.06.01_gb300_gpt_oss_120b_mxfp8_64gpu", GPT_OSS_CUDNN),
    _off("mbridge_26.06.01_gb200_gpt_oss_120b_mxfp8_64gpu", GPT_OSS_CUDNN),
]
RECIPES_26_08 = [   # 26.08 (tag v0.6.0, src/megatron/bridge/perf_recipes): the same settings
    "mbridge_26.08_gb200_deepseekv3_mxfp8_256gpu",
    "mbridge_26.08_gb300_gpt_oss_120b_mxfp8_64gpu",
    "mbridge_26.08_gb200_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_26.08_gb200_qwen3_235b_a22b_mxfp8_256gpu",
    _off("mbridge_26.08_gb300_deepseekv3_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.08_gb300_qwen3_30b_a3b_mxfp8_8gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.08_gb300_qwen3_235b_a22b_mxfp8_256gpu", GB300_FULL_ITERATION),
    _off("mbridge_26.08_gb200_gpt_oss_120b_mxfp8_64gpu", GPT_OSS_FAST),
]


@pytest.mark.parametrize("row_id", RECIPES_26_06 + RECIPES_26_08)
def test_26_06_moe_runs_as_their_recipes_within_tolerance(catalog, row_id):
    """Megatron-Bridge 26.06's MXFP8 MoE presets (v0.5.0) moved to HybridEP with the 1F1B
    all-to-all overlap and full-iteration CUDA graphs (DeepSeek-V3 on GB300 also to micro-batch
    1 without recompute); the rows run those settings, not their 26.04.01 twins'. 26.08's
    presets (v0.6.0) keep them."""
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory


def test_full_iteration_graph_rows_carry_what_their_builders_set():
    """Megatron-Bridge's ``set_full_iter_cg_configs`` (v0.5.0, v0.5.1; v0.6.0's full-iteration
    MXFP8 helpers in ``perf_recipes``) turns on the MoE paged stash at 1.2x wherever a preset
    graphs the full iteration, and every such preset also sets HybridEP (32 SMs) and the 1F1B
    all-to-all overlap; a row that graphs the full iteration without them is not the recipe it
    cites."""
    rows = [r for r in ROWS.values()
            if r["id"].startswith(("mbridge_26.06_", "mbridge_26.06.01_", "mbridge_26.08_"))
            and r["moe"] == "true"]
    full = [r for r in rows if r["cuda_graphs"] == "full"]
    assert len(rows) == 34 and len(full) == 26   # Nemotron 3 Nano's six rows: TE-scoped graphs
    for r in full:
        assert (r["moe_paged_stash_buffer"], r["ep_dispatcher"], r["ep_dispatcher_sms"],
                r["moe_a2a_overlap"]) == ("1.2", "deepep", "32", "true"), r["id"]
        assert "cutedsl_fused_grouped_mlp True" in r["notes"], r["id"]


NANO_SSD = (
    "Nemotron 3 Nano's Mamba-2 scan runs at the fraction of the BF16 peak vLLM PR #27299 measured "
    "for mamba_ssm's Triton forward on an H100 (0.101), its backward kernels at the same rate and "
    "Blackwell at the same fraction of its own peak: no training (forward and backward) or "
    "Blackwell measurement of these kernels is published. The row runs 14-22% faster than "
    "measured (GB200 and B200 at micro-batch 2, B300), the GB300 rows 7-14% (the 26.04 and "
    "26.04.01 rows, whose presets are the 26.06 ones, measure 2-6% below 26.06), while the "
    "Qwen3-30B-A3B rows of the 26.06 to 26.08 sections (MoE layers of the same kind, no Mamba; "
    "full-iteration graphs and the all-to-all overlap, which Nano's presets do not set) run "
    "5-17% slow: the likely "
    "gap is the scan's unmeasured training rate on Blackwell, not quantified."
)
NEMOTRON3_NANO = [   # hybrid Mamba-2/attention/MoE, TE-scoped CUDA graphs, HybridEP, no overlap
    "mbridge_26.08_gb300_nemotron3_nano_mxfp8_8gpu",
    "mbridge_26.06.01_gb300_nemotron3_nano_mxfp8_8gpu",
    _off("mbridge_26.06.01_gb200_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    "mbridge_26.06_gb300_nemotron3_nano_mxfp8_8gpu",
    _off("mbridge_26.06_gb200_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.06_b300_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    # 26.04.01 (v0.4.2) and 26.04 (v0.4.0): the same presets and builder as 26.06
    _off("mbridge_26.04.01_gb300_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04.01_gb200_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04.01_b300_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04.01_b200_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04_gb300_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04_gb200_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
    _off("mbridge_26.04_b300_nemotron3_nano_mxfp8_8gpu", NANO_SSD),
]


@pytest.mark.parametrize("row_id", NEMOTRON3_NANO)
def test_nemotron3_nano_runs_as_its_recipe_within_tolerance(catalog, row_id):
    """Nemotron 3 Nano (hybrid_pattern, Mamba-2 layers) as Megatron-Bridge's presets ran it."""
    result, error = _run(catalog, row_id)
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%}"
    assert result.fits_in_memory

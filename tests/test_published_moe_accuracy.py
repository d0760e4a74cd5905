"""Published MoE and long-context runs that are cheap to simulate (8 to 16 GPUs), each within
15% of its measured step (issue 16's bar), or a strict xfail naming what is off. The whole
tables run with ``clustersim validate --runs analysis/data/published_runs_moe.csv`` (and
``published_runs_long_context.csv``); analysis/data/README.md lists their errors."""

import csv

import pytest

from clustersim.analysis.step import run_step
from clustersim.analysis.validation.published import row_config

from tests.conftest import REPO

TOLERANCE = 0.15
MOE = REPO / "analysis/data/published_runs_moe.csv"
LONG = REPO / "analysis/data/published_runs_long_context.csv"
CHEAP = {
    MOE: ("mb2511_qwen3_30b_a3b_h100_16gpu_fp8", "mb2602_qwen3_30b_a3b_h100_16gpu_fp8",
          "mb2606_qwen3_30b_a3b_h100_16gpu_fp8",
          "mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8", "mb2511_qwen3_30b_a3b_gb200_8gpu_mxfp8",
          "mb2511_qwen3_235b_a22b_b200_64gpu_mxfp8",
          "mb2509_qwen3_30b_a3b_b200_8gpu_fp8_tokendrop",
          "mb2509_qwen3_30b_a3b_gb200_8gpu_fp8_tokendrop",
          "mb2509_qwen3_30b_a3b_h100_16gpu_fp8_tokendrop",
          "nemo2504_mixtral_8x7b_gb200_64gpu_fp8", "mb2511_gpt_oss_120b_b200_64gpu_bf16",
          "mbcard_qwen3_30b_a3b_h100_16gpu_bf16_hybridep_no_a2a_overlap",
          "mbcard_qwen3_30b_a3b_h100_16gpu_bf16_hybridep_a2a_overlap",
          "mbcard_qwen3_30b_a3b_h100_16gpu_bf16_tuned",
          "mbcard_qwen3_30b_a3b_h100_16gpu_bf16_natural_routing",
          "mbcard_qwen3_30b_a3b_gb200_8gpu_mxfp8_tuned",
          "mbcard_qwen3_30b_a3b_gb200_8gpu_mxfp8_natural_routing",
          "mbcard_qwen3_30b_a3b_gb300_8gpu_mxfp8_tuned"),
    LONG: ("torchtitan_llama3_8b_8gpu_fsdp8_cp1", "torchtitan_llama3_8b_8gpu_fsdp4_cp2",
           "torchtitan_llama3_8b_8gpu_fsdp2_cp4", "torchtitan_llama3_8b_8gpu_fsdp1_cp8"),
}
HOST_BOUND = ("host (CPU) time of the dropless path beyond what is modelled: the host issues "
              "the recipe's ungraphed kernels at 13.48 us each (TE #2053's torch.nn.Linear on a "
              "DGX H100) and waits at every MoE forward's token-count sync (token_dispatcher.py "
              "before_ep_alltoall, TEGroupedMLP's tolist); TE's GroupedLinear spends more host "
              "time per expert (splits, allocations, casts: TE #1499), which no source gives for "
              "this stack; analysis/data/README.md")
GPU_GAP = ("with no host-device sync in the layer (capacity factor 1.0 padded to capacity); "
           "16 experts of 768 per GPU; not identified: the same config's measured throughput "
           "moves 1.8x across releases (GB200, micro-batch 4: 22,775 tokens/s/GPU in 25.09, "
           "40,960 in 26.06.01, predicted 29,950), so it is the software of the release, which "
           "the model does not describe")
NATURAL = ("natural routing (the recipe's auxiliary loss, steps 91-100 from random init) runs with "
           "the expert skew of Wang et al.'s MaxVio_global 0.52 (arXiv 2408.15664 Table 2, the "
           "same loss coefficient, after 200B tokens: a floor); the run's own tokens-per-expert "
           "distribution is not published (its forced-routing twin: "
           "tests/test_published_moe_pairs.py)")
REGRESSION_1998 = ("a software regression of the 25.11 release, Megatron-Bridge issue #1998 "
                   "(NVIDIA, 2026-01-20): 'We have 2X slower performance in QWEN3 30B on H100 "
                   "and B200 with the dropless schedule compared to the token-drop schedule. "
                   "Basically, the perf in 25.11 is 2X slower than 25.09.'; ")
OFF = {
    "mb2511_qwen3_235b_a22b_b200_64gpu_mxfp8": "-34.4%: a recipe regression of the 25.11 release, "
    "Megatron-Bridge issue #1705 and its fix PR #1760 (2025-12-17): 'Disable moe_a2a_overlap due "
    "to CPU overhead for BF16 and MXFP8. Disable VP for mxfp8', MXFP8 step 20.1 s -> 16.9 s (this "
    "row, 20.05 s, is the regressed recipe: the 1F1B all-to-all overlap and VP 2); the host time "
    "the overlap costs is not modelled, and against the fixed recipe's 16.9 s the model's 13.2 s "
    "is still 22% fast",
    "mbcard_qwen3_30b_a3b_gb300_8gpu_mxfp8_tuned": "+18.1%: the catalog credits GB300 with "
    "GB200's compute peaks and efficiencies, not Blackwell Ultra's doubled attention "
    "exponentials or 1.4 kW (GB300 over GB200 on this card: 0.901 measured, 1.009 predicted); "
    "+13.4% before the compute under the EP overlap ran on the 116 SMs HybridEP's 32 leave, "
    "which brings its GB200 twin from +0.9% to +5.5%",
    "mbcard_qwen3_30b_a3b_h100_16gpu_bf16_natural_routing": "-21.1% (-23.7% before the host's "
    "eager issue after each sync was modelled): "
    + NATURAL,
    "mbcard_qwen3_30b_a3b_gb200_8gpu_mxfp8_natural_routing": "-42.9% (-43.3% before the host's "
    "eager issue was modelled): " + NATURAL + "; TE-scoped CUDA graphs instead of the tuned row's "
    "full-iteration graphs, their host issue charged at a DGX H100's cost, not Grace's 2.5x",
    "mb2511_qwen3_30b_a3b_h100_16gpu_fp8": REGRESSION_1998 + "predicted 2.0x as fast (-50%; -55% "
    "before current "
    "scaling's amax zeroing and TEGroupedMLP's FP8 padding copies were modelled, -62% before the "
    "host's eager issue): 16 experts of 768 per "
    "GPU, 2 sequences per micro-batch, 24 one-layer chunks per stage, the recipe's 1F1B all-to-all "
    "overlap; its 25.09 token-drop twin "
    "(no sync) runs 1.99x as fast and is predicted -15%; " + HOST_BOUND,
    "mb2602_qwen3_30b_a3b_h100_16gpu_fp8": REGRESSION_1998 + "which the issue meant to fix "
    "in 26.02: this 26.02 row (v0.3.0's PP2 x VP12 EP8 preset with DeepEP and the 1F1B "
    "all-to-all overlap) measures 5,113 tokens/s/GPU, within 3% of the 25.11 row's 5,275, and "
    "26.02.01's EP16 HybridEP preset 9,058; predicted 2.3x as fast (-56%): " + HOST_BOUND,
    "mb2606_qwen3_30b_a3b_h100_16gpu_fp8": "-17% (-20% before current scaling's amax zeroing, "
    "-30% before the host's eager issue was modelled): 8 experts per GPU at one sequence per "
    "micro-"
    "batch, EP16 over two nodes with the recipe's HybridEP run as DeepEP, FP8 current scaling "
    "and no CUDA graphs; measured 1.20x the step of the card's BF16 run of the same layout with "
    "moe_router/moe_preprocess graphs (24.71 s), predicted 1.06x; " + HOST_BOUND,
    "mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8": REGRESSION_1998 + "predicted 2.0x as fast (-51%; "
    "-54% before "
    "TEGroupedMLP's FP8 padding copies, -63% before the host's eager issue was modelled): 9.2 ms "
    "per layer and micro-batch of 4,096 tokens against 3.4 ms of GPU work modelled (and 0.2 ms of "
    "padding copies since); its 25.09 "
    "token-drop twin "
    "(no sync, whole layers CUDA-graphed) runs 1.94x as fast and is itself predicted -18%; "
    + HOST_BOUND,
    "mb2509_qwen3_30b_a3b_b200_8gpu_fp8_tokendrop": "-18% " + GPU_GAP,
    "mb2509_qwen3_30b_a3b_gb200_8gpu_fp8_tokendrop": "-22% " + GPU_GAP,
    "mb2509_qwen3_30b_a3b_h100_16gpu_fp8_tokendrop": "-15.1% (kernels issued eagerly, no graphs) "
    + GPU_GAP,
    "torchtitan_llama3_8b_8gpu_fsdp8_cp1": "+19%: torch.compile and Float8 linears at 32K on "
    "power-limited HBM2e H100s (500 W), whose sustained clocks no source gives",
    "torchtitan_llama3_8b_8gpu_fsdp4_cp2": "+35%: the 64K row is predicted slower while the "
    "128K and 256K rows are within 6%; not identified",
}


def _cases():
    for path, ids in CHEAP.items():
        rows = {r["id"]: r for r in csv.DictReader(path.open())}
        for row_id in ids:
            marks = ([pytest.mark.xfail(strict=True, reason=OFF[row_id])]
                     if row_id in OFF else [])
            yield pytest.param(rows[row_id], id=row_id, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("row", list(_cases()))
def test_published_step_within_15_percent(catalog, row):
    result = run_step(row_config(row, catalog)).result
    measured = float(row["measured_step_time_s"])
    assert result.fits_in_memory
    assert result.step_time_s == pytest.approx(measured, rel=TOLERANCE)

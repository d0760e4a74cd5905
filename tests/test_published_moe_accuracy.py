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
    MOE: ("mb2511_qwen3_30b_a3b_h100_16gpu_fp8", "mb2606_qwen3_30b_a3b_h100_16gpu_fp8",
          "mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8", "mb2511_qwen3_30b_a3b_gb200_8gpu_mxfp8",
          "nemo2504_mixtral_8x7b_gb200_64gpu_fp8"),
    LONG: ("torchtitan_llama3_8b_8gpu_fsdp8_cp1", "torchtitan_llama3_8b_8gpu_fsdp4_cp2",
           "torchtitan_llama3_8b_8gpu_fsdp2_cp4", "torchtitan_llama3_8b_8gpu_fsdp1_cp8"),
}
OFF = {
    "mb2511_qwen3_30b_a3b_h100_16gpu_fp8": "predicted twice as fast (-49%): 128 experts of 768 "
    "on 2 pipeline stages of 24 chunks each; what the measured step spends is not identified",
    "mb2606_qwen3_30b_a3b_h100_16gpu_fp8": "-15%: with the recipe's HybridEP (run as DeepEP) the "
    "EP16 all-to-alls across two nodes expose 4.8 s (NCCL all-to-all would expose 18.4 s and "
    "give +31%); the rest of the gap is not identified",
    "mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8": "predicted 2.4x as fast (-58%) on one B200 node with "
    "MXFP8 grouped GEMMs of 768-wide experts; the B200 and GB200 runs of the same model differ "
    "2.6x in tokens/s, which the model does not reproduce",
    "torchtitan_llama3_8b_8gpu_fsdp8_cp1": "+17%: torch.compile and Float8 linears at 32K on "
    "power-limited HBM2e H100s (500 W), none of which the catalog describes",
    "torchtitan_llama3_8b_8gpu_fsdp4_cp2": "+34%: the 64K row is predicted slower while the "
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

"""Published 3D CNN training runs (analysis/data/published_runs_cnn.csv): MLPerf HPC v1.0
CosmoFlow on 128 and 1,024 A100-80GB (NVIDIA, closed division), against the simulator.

The scaling from 128 to 1,024 GPUs is within the 20% bar; the absolute throughput is not: the
simulator's CosmoFlow step is about 8x faster than measured (a strict xfail, with the reason)."""

import csv

import pytest

from clustersim.analysis.config import RunConfig
from clustersim.analysis.step import run_cnn_step
from clustersim.hardware_specs import load_catalog
from clustersim.workloads.cnn.job import cnn_job_from_mapping

from tests.conftest import REPO

RUNS = REPO / "analysis/data/published_runs_cnn.csv"
ROWS = {r["id"]: r for r in csv.DictReader(RUNS.open())}
SMALL, LARGE = "mlperf_hpc_v1.0_nvidia_cosmoflow_128gpu", "mlperf_hpc_v1.0_nvidia_cosmoflow_1024gpu"

TOLERANCE = 0.20
"""Issue 20's bar for a published 3D CNN scaling result."""

COSMOFLOW_COMPUTE_UNKNOWN = (
    "CosmoFlow trains at 67 samples/s per A100 in NVIDIA's MLPerf HPC v1.0 runs (4.1 TFLOP/s of "
    "model FLOPs, 1.3% of the FP16 peak); the simulator times its 3D convolutions as implicit "
    "GEMMs on the GPU's GEMM efficiency and the HBM roofline and gets about 550 samples/s per "
    "GPU. The gap is in cuDNN's 3D convolution kernels at these shapes (4 to 32 channels, "
    "kernel 2, batch 1 per GPU), in the MXNet/DALI input pipeline, or both; no published "
    "per-layer measurement of those kernels was found to model it from, and no factor is "
    "fitted to this row.")


def simulate(row: dict):
    nz, ny, nx = (int(n) for n in row["spatial"].split("x"))
    job = cnn_job_from_mapping({
        "model": row["model"],
        "training": {"global_batch": int(row["global_batch"]),
                     "micro_batch": int(row["micro_batch"]), "precision": row["precision"],
                     "optimizer": "sgd"},
        "strategy": {"dp": int(row["dp"]), "spatial": [nz, ny, nx]}}).checked(
            int(row["num_gpus"]))
    catalog = load_catalog()
    cluster = catalog.cluster(device=row["gpu"], num_devices=int(row["num_gpus"]),
                              node="dgx-a100")
    return run_cnn_step(RunConfig(job=job, cluster=cluster, catalog=catalog)).result


def test_the_rows_carry_their_provenance():
    for row in ROWS.values():
        assert "mlcommons/hpc_results_v1.0 @ d77db2c" in row["source"]
        assert "MLLOG 'throughput'" in row["notes"]
        assert float(row["measured_samples_per_s"]) > 0


def test_cosmoflow_data_parallel_scaling_from_128_to_1024_gpus():
    """Measured: 64,746 / 8,649 samples/s = 7.49x for 8x the GPUs (94% efficiency). Note the
    agreement holds with a compute time 8x too short (below), which weighs the all-reduce
    more than the real run does."""
    measured = (float(ROWS[LARGE]["measured_samples_per_s"])
                / float(ROWS[SMALL]["measured_samples_per_s"]))
    simulated = simulate(ROWS[LARGE]).tokens_per_s / simulate(ROWS[SMALL]).tokens_per_s
    assert simulated == pytest.approx(measured, rel=TOLERANCE)


@pytest.mark.xfail(strict=True, reason=COSMOFLOW_COMPUTE_UNKNOWN)
@pytest.mark.parametrize("run", [SMALL, LARGE])
def test_cosmoflow_throughput_within_20_percent(run):
    measured = float(ROWS[run]["measured_samples_per_s"])
    assert simulate(ROWS[run]).tokens_per_s == pytest.approx(measured, rel=TOLERANCE)

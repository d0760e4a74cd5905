"""Element-wise ops as eager PyTorch runs torchtitan's Llama blocks (``eager_elementwise``):
one kernel per op of the model code, against fused kernels; checked on torchtitan's own
eager-against-compiled pairs (benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3)."""

import csv

import pytest

from clustersim.analysis.step import run_step
from clustersim.analysis.validation.published import row_config
from clustersim.workloads import eager_ops
from clustersim.workloads.layer_ops import LayerOps
from tests.conftest import REPO

TABLE = REPO / "analysis/data/published_runs_torchtitan.csv"


def test_each_ops_bytes_are_the_sum_of_its_eager_kernels():
    """RMSNorm: float 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2; rotary:
    float 2+4, complex multiply 4+4, type_as 4+2; SwiGLU: silu 2+2, multiply 2+2+2."""
    assert (eager_ops.RMSNORM.bytes_per_element, eager_ops.RMSNORM.launches) == (36, 6)
    assert (eager_ops.ROTARY.bytes_per_element, eager_ops.ROTARY.launches) == (20, 3)
    assert (eager_ops.SWIGLU.bytes_per_element, eager_ops.SWIGLU.launches) == (10, 2)


def _row(row_id):
    return next(r for r in csv.DictReader(TABLE.open()) if r["id"] == row_id)


def test_eager_kernels_move_what_the_ops_move_and_fused_ones_stay(catalog):
    eager = row_config(_row("torchtitan_h100_llama3.1_8b_8gpu_fsdp"), catalog).job
    fused = row_config(_row("torchtitan_h100_llama3.1_8b_8gpu_fsdp_compile"), catalog).job
    tokens, m = 2 * 8192, eager.model

    def kernels(job):
        work = LayerOps(job.model, job.training, job.strategy).forward()
        return {k.name: k for k in work.attention + work.mlp}
    e, f = kernels(eager), kernels(fused)
    assert e["norm1"].bytes == tokens * m.hidden * 36 and e["norm1"].launches == 6
    assert f["norm1"].bytes == tokens * m.hidden * 2 * 2
    assert e["rotary"].bytes == tokens * (m.q_dim + m.kv_dim) * 20
    assert e["activation"].bytes == tokens * m.ffn_hidden * 10
    assert f["activation"].bytes == tokens * m.ffn_hidden * 3 * 2
    assert e["qkv"] == f["qkv"] and e["residual1"] == f["residual1"]


@pytest.mark.parametrize("gpus, measured", [(8, 6667 / 5762), (128, 6514 / 5605)])
def test_compile_speeds_torchtitans_8b_up_as_measured(catalog, gpus, measured):
    """torch.compile over eager, Llama 3.1 8B FSDP with per-op recompute on Grand Teton H100:
    6,667 against 5,762 TPS/GPU on 8 GPUs, 6,514 against 5,605 on 128 (1.157x, 1.162x); the
    eager ops' extra traffic (forward, backward and the recomputed forward) gives 1.14x."""
    eager = run_step(row_config(_row(f"torchtitan_h100_llama3.1_8b_{gpus}gpu_fsdp"), catalog))
    compiled = run_step(row_config(_row(f"torchtitan_h100_llama3.1_8b_{gpus}gpu_fsdp_compile"),
                                   catalog))
    ratio = eager.result.step_time_s / compiled.result.step_time_s
    assert ratio == pytest.approx(measured, rel=0.03)
    assert ratio > 1.10

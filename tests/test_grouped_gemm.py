"""Grouped expert GEMMs as Transformer Engine runs them: one cuBLAS GEMM per local expert, each
with a fixed cost (``GROUPED_GEMM_LAUNCH_S``), checked against TE's published benchmark."""

import dataclasses

import pytest

from clustersim.hardware_specs import Dtype
from clustersim.simulator.cost.compute import (GROUPED_GEMM_LAUNCH_S, GROUPED_GEMM_STREAMS,
                                               LAUNCH_GAP_S, ComputeModel, concurrent_gemms)
from clustersim.workloads.job import Job
from clustersim.workloads.kernels import backward_of, gemm
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.trace_io import _kernel, _kernel_dict
from clustersim.workloads.training import training_from_mapping

TE_PR_2045 = (   # (experts, m, n, k, TFLOP/s): TE 2.7, CUDA 12.9, H100, general_grouped_gemm
    (16, 2048, 768, 2048, 553.945),
    (8, 4096, 768, 2048, 627.903),
)


def _isolated(catalog, name: str) -> ComputeModel:
    """The device without its in-training factors: a kernel benchmark's conditions."""
    device = catalog.device(name)
    return ComputeModel(dataclasses.replace(
        device, efficiency=dataclasses.replace(device.efficiency, in_training={})))


@pytest.mark.parametrize("experts,m,n,k,tflops", TE_PR_2045)
def test_grouped_gemm_matches_transformer_engines_benchmark_on_h100(catalog, experts, m, n, k,
                                                                    tflops):
    """Each shape within 10% of TE PR #2045's figure (the per-GEMM cost comes from the pair;
    the dense shape model, not fitted to either, sets the rest)."""
    kernel = gemm("expert_fc", m, n, k, 2.0, Dtype.BF16, experts, experts)
    t = _isolated(catalog, "h100-sxm").kernel_time(kernel)
    assert kernel.flops / t / 1e12 == pytest.approx(tflops, rel=0.10)


def test_the_per_gemm_cost_is_the_difference_of_the_two_published_shapes():
    (g16, m16, n, k, r16), (g8, m8, _, _, r8) = TE_PR_2045
    flops = 2.0 * g16 * m16 * n * k
    assert flops == 2.0 * g8 * m8 * n * k
    assert GROUPED_GEMM_LAUNCH_S * (g16 - g8) == pytest.approx(flops / (r16 * 1e12)
                                                               - flops / (r8 * 1e12))
    assert 2e-6 < GROUPED_GEMM_LAUNCH_S < 3e-6


def test_splitting_the_same_work_over_more_experts_costs_one_fixed_cost_per_expert(catalog):
    model = _isolated(catalog, "b200")
    one = model.kernel_time(gemm("x", 4096, 768, 2048, 2.0, Dtype.BF16, 8, 8))
    two = model.kernel_time(gemm("x", 2048, 768, 2048, 2.0, Dtype.BF16, 16, 16))
    four_at_once = model.kernel_time(gemm("x", 2048, 768, 2048, 2.0, Dtype.BF16, 4, 1))
    # Sixteen GEMMs on four streams run as four sets of four; one launch gap, then one fixed
    # cost per further GEMM.
    assert two - 4 * four_at_once == pytest.approx(15 * GROUPED_GEMM_LAUNCH_S
                                                   - 3 * LAUNCH_GAP_S)
    assert two > one


@pytest.mark.parametrize("experts", [1, 2, 4, 8, 16, 32])
def test_expert_gemms_fill_waves_four_streams_at_a_time(catalog, experts):
    """TE's multi_stream_cublas_gemm puts GEMM i on stream i % 4: the tiles of at most four
    expert GEMMs share the SMs, while one batched kernel's whole batch does."""
    model = _isolated(catalog, "h100-sxm")
    looped = gemm("x", 512, 1536, 4096, 2.0, Dtype.BF16, experts, experts)
    batched = gemm("x", 512, 1536, 4096, 2.0, Dtype.BF16, min(experts, GROUPED_GEMM_STREAMS))
    assert model.efficiency(looped) == pytest.approx(model.efficiency(batched))
    assert concurrent_gemms(looped) == min(experts, 4)
    whole = gemm("x", 512, 1536, 4096, 2.0, Dtype.BF16, experts)
    assert model.efficiency(whole) >= model.efficiency(looped)


def test_expert_gemms_launch_once_per_local_expert_forward_and_backward():
    model = resolve("qwen3-30b-a3b", path="model")
    training = training_from_mapping({"seq_len": 4096, "global_batch": 64})
    strategy = strategy_from_mapping({"dp": 8, "ep": 8})
    Job(model, training, strategy).checked(8)
    ops = LayerOps(model, training, strategy)
    experts = {k.name: k.launches for part in (ops.forward().mlp, ops.backward().mlp)
               for k in part if k.name.startswith("expert_fc")}
    assert experts == {name: 128 // 8 for name in (
        "expert_fc1", "expert_fc2", "expert_fc1.dgrad", "expert_fc1.wgrad",
        "expert_fc2.dgrad", "expert_fc2.wgrad")}
    assert all(k.launches == 1 for k in ops.forward().attention)


def test_launches_survive_the_trace_json_and_backward():
    k = gemm("expert_fc1", 2048, 1536, 2048, 2.0, Dtype.FP8, 16, 16)
    assert _kernel(_kernel_dict(k)) == k
    assert _kernel(_kernel_dict(gemm("qkv", 8, 8, 8, 2.0, Dtype.BF16))).launches == 1
    assert {g.launches for g in backward_of((k,), 2.0)} == {16}

"""Fused attention's key-loop term (simulator/cost/compute.py) against the published curves it
comes from: a fixed cost per query tile's key loop and, under the causal mask, half a masked
diagonal block; each attention ceiling holds at the key length where it was measured."""

import dataclasses

import pytest

from clustersim.hardware_specs import OpClass
from clustersim.hardware_specs.loader import load_catalog
from clustersim.simulator.cost.compute import (ATTENTION_KEY_OVERHEAD, ATTENTION_REFERENCE_KEYS,
                                               ComputeModel, attention_key_factor, key_loop)
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.model import PRESETS
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.trace import ComputeOp
from clustersim.workloads.training import training_from_mapping

CATALOG = load_catalog()


def test_the_overhead_solves_the_flashattention2_non_causal_a100_curve():
    # FlashAttention-2 (arXiv 2307.08691) Fig. 4(b): A100, fwd + bwd, head dim 128, no causal
    # mask: 187 TFLOP/s at 2K, 203 at 16K; one loop of k keys is useful for k / (k + K0).
    def useful(keys):
        return keys / (keys + ATTENTION_KEY_OVERHEAD)
    assert useful(16384) / useful(2048) == pytest.approx(203 / 187, rel=0.005)


@pytest.mark.parametrize("figure, short, long, measured_short, measured_long, tol", [
    # FlashAttention-2 paper Fig. 4(d): A100 SXM4, fwd + bwd, causal, head dim 128 (TFLOP/s).
    ("FA2 A100 causal", 2048, 16384, 155, 189, 0.01),
    ("FA2 A100 causal", 2048, 4096, 155, 173, 0.01),
    ("FA2 A100 causal", 512, 2048, 99, 155, 0.05),
    # The same paper's H100 SXM5 figure (flash-attention assets/flash2_h100_fwd_bwd_benchmark).
    ("FA2 H100 causal", 2048, 16384, 265, 328, 0.02),
    ("FA2 H100 causal", 512, 2048, 163, 265, 0.01),
    # FlashAttention-3 (arXiv 2407.08608) Fig. 5(d): H100 SXM5, BF16 forward, causal, hdim 128.
    ("FA3 H100 causal fwd", 2048, 16384, 521, 616, 0.04),
    ("FA3 H100 causal fwd", 8192, 16384, 602, 616, 0.01),
    # NVIDIA/cudnn-frontend benchmark/benchmark_results.csv: cuDNN 9.1 on H200, BF16, fwd + bwd,
    # causal, 16 heads of 128: 467.9 TFLOP/s at 4K, 520.4 at 64K.
    ("cuDNN H200 causal", 4096, 65536, 467.94, 520.38, 0.01),
])
def test_causal_rise_with_sequence_length_matches_published_kernels(figure, short, long,
                                                                    measured_short,
                                                                    measured_long, tol):
    assert key_loop(long) / key_loop(short) == pytest.approx(measured_long / measured_short,
                                                             rel=tol), figure


@pytest.mark.parametrize("op", sorted(ATTENTION_REFERENCE_KEYS, key=lambda o: o.value))
def test_the_term_is_one_at_the_reference_and_grows_past_it(op):
    ref = ATTENTION_REFERENCE_KEYS[op]
    assert attention_key_factor(ref, op) == 1.0
    assert attention_key_factor(ref // 4, op) < 1.0 < attention_key_factor(8 * ref, op)
    # FA2's A100 causal curve gains 189 / 155 from 2K to 16K, past GEMM's 2K reference.
    assert (attention_key_factor(16384, OpClass.ATTENTION)
            / attention_key_factor(2048, OpClass.ATTENTION)) == pytest.approx(189 / 155, rel=0.01)


@pytest.mark.parametrize("device, op, ceiling", [
    ("a100-80gb", OpClass.ATTENTION, "attention"),
    ("h100-sxm", OpClass.ATTENTION, "attention"),
    ("h200", OpClass.ATTENTION_FA3, "attention_fa3"),
    ("b200", OpClass.ATTENTION_FA4, "attention_fa4"),
])
def test_efficiency_at_the_reference_length_is_the_ceiling(device, op, ceiling):
    spec = CATALOG.device(device)
    spec = dataclasses.replace(spec, efficiency=dataclasses.replace(spec.efficiency,
                                                                    in_training={}))
    keys = ATTENTION_REFERENCE_KEYS[op]
    # One full wave of 256-query tiles: no wave or padding loss, only the key-loop term.
    queries = 256 * spec.compute_units
    kernel = Kernel("flash_attn", op, 1e12, 1e9, queries, keys, 128, 1)
    assert ComputeModel(spec).efficiency(kernel) == pytest.approx(getattr(spec.efficiency,
                                                                          ceiling))


@pytest.mark.parametrize("algorithm, keys", [("ring", 32768 // 4), ("allgather", 32768)])
def test_each_ring_step_of_context_parallelism_loops_over_its_own_block(algorithm, keys):
    # Ring attention runs cp kernels, each over one K/V block, each paying the loop's fixed
    # cost; all-gather CP runs the local queries against all keys in one kernel.
    training = training_from_mapping({"seq_len": 32768, "global_batch": 1, "micro_batch": 1,
                                      "precision": "bf16"})
    strategy = strategy_from_mapping({"cp": 4, "cp_algorithm": algorithm})
    job = Job(PRESETS["llama3-8b"], training, strategy).checked(strategy.world_size)
    spans = {k.n for op in build_trace(job).programs[0].ops if isinstance(op, ComputeOp)
             for k in op.kernels if k.op_class is OpClass.ATTENTION}
    assert spans == {keys}

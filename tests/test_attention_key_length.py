"""Fused attention's key-loop term (simulator/cost/compute.py) against the published curves it
comes from: a fixed cost per query tile's key loop and half a masked block for each diagonal
edge of the mask (one causal, two for a sliding window's band); each attention ceiling holds
at the key length where it was measured."""

import dataclasses

import pytest

from clustersim.hardware_specs import OpClass
from clustersim.hardware_specs.loader import load_catalog
from clustersim.simulator.cost.compute import (ATTENTION_KEY_BLOCK, ATTENTION_KEY_OVERHEAD,
                                               ATTENTION_REFERENCE_KEYS, ComputeModel,
                                               attention_key_factor, key_loop)
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace
from clustersim.workloads.kernels import Kernel, backward_of
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.model import PRESETS
from clustersim.workloads.model_sources import resolve
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


def test_a_sliding_window_band_masks_a_whole_block_per_row_where_causal_masks_half():
    # FlashAttention-2 flash_fwd_kernel.h (v2.7.4): the query tile at row q0 computes key blocks
    # from (q0 - window_left) // kBlockN to the causal end. gpt-oss's 128-key window
    # (window_left 127) with 128 x 128 tiles: two blocks, 256 keys for 128 useful per row.
    block, window, q0 = ATTENTION_KEY_BLOCK, 128, 8 * ATTENTION_KEY_BLOCK
    blocks = (q0 + block - 1) // block - (q0 - (window - 1)) // block + 1
    assert blocks * block - window == block
    assert key_loop(2 * window, diagonals=2) == pytest.approx(
        window / (window + ATTENTION_KEY_OVERHEAD + block))
    assert key_loop(2 * window) == pytest.approx(
        window / (window + ATTENTION_KEY_OVERHEAD + block / 2))


def _gpt_oss_attention(seq_len: int, layer: int, micro_batch: int = 1) -> Kernel:
    training = training_from_mapping({"seq_len": seq_len, "global_batch": micro_batch,
                                      "micro_batch": micro_batch, "attention": "flash3"})
    ops = LayerOps(resolve("gpt-oss-120b"), training, strategy_from_mapping({"dp": 1}))
    return ops.attention_core(layer)[0]


def test_gpt_oss_banded_layers_carry_both_diagonals_into_the_backward():
    banded, full = _gpt_oss_attention(4096, 0), _gpt_oss_attention(4096, 1)
    assert (banded.diagonals, full.diagonals) == (2, 1)
    assert backward_of((banded,), 2.0)[0].diagonals == 2
    assert _gpt_oss_attention(128, 0).diagonals == 1   # a window the sequence fits in never bites


def test_gpt_oss_banded_forward_runs_as_cudnn_measures_it_on_h200():
    # NVIDIA/cudnn-frontend benchmark/attention_inference/results/gpt_oss/h200/
    # gpt_oss_20260818_140856.csv: cuDNN 9.26 on H200, BF16, gpt-oss's sliding-window layer
    # (64 query and 8 KV heads of 64, window 128, sinks), one sequence of 32,768 tokens in the
    # forward: 0.549 ms. With one masked half-block per row (the causal count) it came out
    # 0.488 ms, 11% fast.
    kernel = _gpt_oss_attention(32768, 0)
    assert ComputeModel(CATALOG.device("h200")).kernel_time(kernel) == pytest.approx(
        0.549e-3, rel=0.05)

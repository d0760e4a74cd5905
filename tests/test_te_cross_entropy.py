"""Transformer Engine's fused cross-entropy (``cross_entropy: te``), as the Megatron-Bridge
performance recipes run it (``cross_entropy_fusion_impl: te``)."""

import math

import pytest

from clustersim.workloads import Strategy, TrainingSpec
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.memory import loss_peak_bytes, memory_per_stage
from clustersim.workloads.model import PRESETS
from clustersim.workloads.training import CrossEntropy

LLAMA3_70B = PRESETS["llama3-70b"]
TOKENS = 8192


def _loss_traffic(cross_entropy, strategy):
    ops = LayerOps(LLAMA3_70B, TrainingSpec(seq_len=TOKENS, global_batch=64,
                                            cross_entropy=cross_entropy), strategy)
    kernels = {k.name: k for k in ops.head_forward() + ops.head_backward()}
    return kernels["cross_entropy"].bytes + kernels["cross_entropy.bwd"].bytes


def test_te_loss_moves_ten_bytes_a_logit_against_twenty_for_the_fp32_loss():
    """TE's Triton kernels (v2.8): online softmax reads the 16-bit logits (2), the loss pass
    reads them (2) and writes the gradient in place (2), the backward scales it in place
    (2 + 2); Megatron-Core's vocabulary-parallel loss makes three FP32 passes forward and two
    backward (4 bytes each)."""
    strategy = Strategy(tp=4, dp=2, sequence_parallel=True)
    logits = TOKENS * math.ceil(LLAMA3_70B.vocab / 4)
    assert _loss_traffic(CrossEntropy.TE, strategy) == pytest.approx(10 * logits, rel=1e-3)
    assert _loss_traffic(CrossEntropy.FUSED, strategy) == pytest.approx(20 * logits, rel=1e-3)


def test_te_loss_keeps_its_gradient_in_the_16_bit_logits():
    """The gradient the backward reads lives in the logits buffer: 2 bytes a logit kept from
    forward to backward where Megatron-Core's loss keeps an FP32 softmax (4 bytes); neither
    adds a peak of its own."""
    strategy = Strategy(tp=8, pp=2, dp=1, sequence_parallel=True)
    fused, te = (memory_per_stage(LLAMA3_70B, TrainingSpec(seq_len=TOKENS, global_batch=8,
                                                           cross_entropy=ce), strategy)[-1]
                 for ce in (CrossEntropy.FUSED, CrossEntropy.TE))
    logits = TOKENS * math.ceil(LLAMA3_70B.vocab / 8)
    # The last of two 1F1B stages holds one micro-batch in flight.
    assert fused.memory.activations - te.memory.activations == pytest.approx(2 * logits)
    assert loss_peak_bytes(LLAMA3_70B, TrainingSpec(seq_len=TOKENS, global_batch=8,
                                                    cross_entropy=CrossEntropy.TE),
                           strategy) == 0.0

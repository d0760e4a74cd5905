"""Megatron-Core's MoE paged stash (``moe_paged_stash_buffer``): the routed experts' saved
activations live in one preallocated buffer of the factor times their balanced size
(Megatron-LM ``moe/paged_stash.py``, ``allocate_stash_buffers``), and nothing else moves."""

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.memory import layer_activation_bytes
from clustersim.workloads.model import from_mapping
from clustersim.workloads.strategy import strategy_from_mapping

SMALL_MOE = {"name": "small-moe", "layers": 4, "hidden": 1024, "heads": 16, "vocab": 1024,
             "mlp": "swiglu", "ffn_hidden": 2816, "num_experts": 16, "top_k": 4,
             "moe_ffn_hidden": 704}
TRAINING = TrainingSpec(seq_len=2048, global_batch=64, micro_batch=2)


def _bytes(buffer: float) -> float:
    strategy = Strategy(dp=8, ep=8, moe_paged_stash_buffer=buffer)
    return layer_activation_bytes(from_mapping(SMALL_MOE), TRAINING, strategy)


def test_the_stash_buffer_scales_the_routed_experts_saved_tensors():
    tokens, e = 2 * 2048, 2.0
    # Per token and routed copy (top-k of them): the fc1 input (h), the SwiGLU input (2 x ffn)
    # and the fc2 input (ffn), all 16-bit in BF16 training.
    routed = tokens * 4 * e * (1024 + 3 * 704)
    assert _bytes(1.2) - _bytes(0.0) == pytest.approx(0.2 * routed, rel=1e-12)
    assert _bytes(1.0) == pytest.approx(_bytes(0.0), rel=1e-12)


def test_a_dense_model_refuses_the_stash():
    dense = {k: v for k, v in SMALL_MOE.items() if k not in ("num_experts", "top_k",
                                                              "moe_ffn_hidden")}
    with pytest.raises(SpecError, match="needs a mixture-of-experts model") as err:
        Job(from_mapping(dense), TRAINING,
            strategy_from_mapping({"dp": 8, "moe_paged_stash_buffer": 1.2})).checked(8)
    assert "strategy.moe_paged_stash_buffer" in str(err.value)


def test_a_negative_buffer_is_refused():
    with pytest.raises(SpecError, match="moe_paged_stash_buffer"):
        strategy_from_mapping({"dp": 8, "ep": 8, "moe_paged_stash_buffer": -1})

"""Natural routing under an auxiliary balance loss: the expert skew that Wang et al.'s measured
MaxVio (arXiv 2408.15664, Eq. 4 and Table 2) implies, and the busiest expert-parallel device it
makes; forced balancing keeps uniform routing."""

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads.routing import (
    BALANCE_MAXVIO, MoeRouting, RouterBalance, expert_load, expert_probabilities, skew_for_maxvio,
)
from clustersim.workloads.training import training_from_mapping

AUX_LOSS = MoeRouting(balance=RouterBalance.AUX_LOSS)


def maxvio(experts: int, skew: float) -> float:
    """Eq. 4 of arXiv 2408.15664: (max_i Load_i - mean Load) / mean Load."""
    loads = expert_probabilities(experts, skew)
    return float(loads.max() / loads.mean() - 1.0)


@pytest.mark.parametrize("measured", [0.52, 0.72], ids=["3B", "1B"])
def test_the_skew_reproduces_table_2s_maxvio_over_64_experts(measured):
    """Table 2, auxiliary loss at alpha = 0.001: MaxVio_global 0.52 (3B), 0.72 (1B)."""
    assert maxvio(64, skew_for_maxvio(measured, 64)) == pytest.approx(measured, abs=1e-9)


def test_the_aux_loss_balance_is_table_2s_3b_model():
    assert BALANCE_MAXVIO[RouterBalance.AUX_LOSS] == (0.52, 64)
    assert AUX_LOSS.skew == skew_for_maxvio(0.52, 64)
    assert 0.0 < skew_for_maxvio(0.52, 64) < skew_for_maxvio(0.72, 64)
    assert skew_for_maxvio(0.0, 64) == 0.0 and MoeRouting().skew == 0.0


def test_the_same_popularity_over_more_experts_has_a_busier_top_expert():
    """The skew, not the MaxVio, carries over to a router with more experts."""
    skew = AUX_LOSS.skew
    assert maxvio(128, skew) > maxvio(64, skew) == pytest.approx(0.52)


def test_natural_routing_loads_the_busiest_device_more_the_more_devices_share_the_experts():
    """Qwen3-30B-A3B's 128 experts, top 8, 4,096 tokens per device."""
    uniform = [expert_load(4096, 8, 128, ep).busiest_over_mean for ep in (8, 16, 32)]
    natural = [expert_load(4096, 8, 128, ep, AUX_LOSS).busiest_over_mean for ep in (8, 16, 32)]
    assert all(n > u for n, u in zip(natural, uniform))
    assert natural[0] < natural[1] < natural[2]
    # every device's experts add up: the busiest of 16 carries 1.14x, one device the total
    assert natural[1] == pytest.approx(1.143, abs=0.005)
    assert expert_load(4096, 8, 128, 1, AUX_LOSS).busiest_over_mean == 1.0


def test_a_balance_is_read_from_the_training_config_and_rejects_a_skew_beside_it():
    spec = training_from_mapping({"seq_len": 4096, "global_batch": 8,
                                  "moe": {"balance": "aux_loss"}})
    assert spec.moe.balance is RouterBalance.AUX_LOSS
    assert spec.to_dict()["moe"]["balance"] == "aux_loss"
    with pytest.raises(SpecError, match=r"training\.moe\.expert_skew: set with balance"):
        training_from_mapping({"seq_len": 4096, "global_batch": 8,
                               "moe": {"balance": "aux_loss", "expert_skew": 0.3}})
    with pytest.raises(SpecError, match=r"training\.moe\.balance: expected one of"):
        training_from_mapping({"seq_len": 4096, "global_batch": 8, "moe": {"balance": "free"}})


def test_a_maxvio_no_skew_reaches_is_an_error():
    with pytest.raises(SpecError, match="maxvio"):
        skew_for_maxvio(1000.0, 64)

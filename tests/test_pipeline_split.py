"""Megatron-Core's pipeline split that counts the embedding and the loss as layers."""

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads.model import PRESETS
from clustersim.workloads.stages import chunk_layers, stage_plans
from clustersim.workloads.strategy import Schedule, Strategy, check_strategy
from clustersim.workloads.training import TrainingSpec

LLAMA3_405B = PRESETS["llama3-405b"]
TRAINING = TrainingSpec(seq_len=8192, global_batch=2048, micro_batch=1)


def split(**over) -> Strategy:
    base = dict(tp=8, pp=16, dp=128, virtual_stages=8, schedule=Schedule.INTERLEAVED,
                sequence_parallel=True, zero=1, account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    return Strategy(**{**base, **over})


def test_llama3_405b_pp16_v8_has_128_chunks_of_one_layer_first_and_last_empty():
    """Llama 3 (arXiv 2407.21783 sec. 3.3.2): the first chunk holds only the embedding, the last
    only the output projection and loss; 126 + 2 = 128 chunks of one."""
    s = check_strategy(split(), LLAMA3_405B, TRAINING, 16384)
    sizes = chunk_layers(LLAMA3_405B.layers, s)
    assert len(sizes) == 128 and sum(sizes) == 126
    assert sizes[0] == 0 and sizes[-1] == 0 and set(sizes[1:-1]) == {1}
    plans = stage_plans(LLAMA3_405B, s)
    assert plans[0].chunk_layers == (0, 1, 1, 1, 1, 1, 1, 1) and plans[0].has_embedding
    assert plans[-1].chunk_layers == (1, 1, 1, 1, 1, 1, 1, 0) and plans[-1].has_head


def test_embedding_only_takes_one_layer_from_the_first_chunk():
    s = split(pp=8, virtual_stages=1, schedule=Schedule.ONE_F_ONE_B,
              account_for_loss_in_pipeline_split=False)
    # 126 + 1 = 127 is not a multiple of 8: Megatron-Core refuses the split.
    with pytest.raises(SpecError, match=r"account_for_embedding_in_pipeline_split.*127.*8"):
        check_strategy(s, LLAMA3_405B, TRAINING)
    m = PRESETS["llama3-70b"]          # 80 + 1 = 81 units in 3 x 9 chunks of 3
    s = split(pp=3, virtual_stages=9, tp=8, dp=1, account_for_loss_in_pipeline_split=False)
    training = TrainingSpec(seq_len=8192, global_batch=9, micro_batch=1)
    check_strategy(s, m, training)
    assert chunk_layers(m.layers, s) == (2,) + (3,) * 26


@pytest.mark.parametrize("over, match", [
    (dict(layers_per_stage=(8,) * 16, virtual_stages=1, schedule=Schedule.ONE_F_ONE_B),
     "layers_per_stage"),
    (dict(pp=1, dp=2048, virtual_stages=1, schedule=Schedule.ONE_F_ONE_B), "pp > 1"),
])
def test_split_flags_refuse_what_they_cannot_mean(over, match):
    with pytest.raises(SpecError, match=match):
        check_strategy(split(**over), LLAMA3_405B, TRAINING)


def test_without_the_flags_more_chunks_than_layers_is_an_error_naming_the_numbers():
    s = split(account_for_embedding_in_pipeline_split=False,
              account_for_loss_in_pipeline_split=False)
    with pytest.raises(SpecError, match="128 exceeds model.layers=126"):
        check_strategy(s, LLAMA3_405B, TRAINING)

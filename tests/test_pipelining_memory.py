"""torch.distributed.pipelining's order and what a rank holds over it, against torch 2.6.0's
``schedules.py`` and ``stage.py`` (``workloads/pipelining_memory.py``)."""

import pytest

from clustersim.workloads import Recompute, Strategy, TrainingSpec
from clustersim.workloads.memory import memory_per_stage
from clustersim.workloads.model import PRESETS
from clustersim.workloads.pipelining_memory import (
    Action, ChunkBytes, peak_held, rank_actions,
)
from clustersim.workloads.strategy import Schedule


def _order(actions):
    return " ".join(f"{'F' if a.forward else 'B'}{a.chunk}.{a.micro}" for a in actions)


def test_1f1b_runs_pp_minus_stage_warmup_forwards_then_a_backward_before_each_forward():
    """``Schedule1F1B._step_microbatches``: min(M, pp - i) warm-up forwards on stage i."""
    assert _order(rank_actions(Schedule.ONE_F_ONE_B, 4, 1, 6, 1)) == (
        "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 F0.4 B0.2 F0.5 B0.3 B0.4 B0.5")
    # Stage 0 with M = pp runs every forward first (pp warm-ups, not pp - 1).
    assert _order(rank_actions(Schedule.ONE_F_ONE_B, 4, 1, 4, 0)) == (
        "F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3")


def test_interleaved_warms_up_2_per_hop_from_the_last_rank_and_backs_the_last_chunk_first():
    """``ScheduleInterleaved1F1B``: min((v - 1) M/r + 2 (pp - 1 - rank), v M) warm-ups, chunks
    in rounds of M/r micro-batches; the backwards start with the last local chunk."""
    assert _order(rank_actions(Schedule.INTERLEAVED, 4, 2, 4, 3)) == (
        "F0.0 F0.1 F0.2 F0.3 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 B0.0 B0.1 B0.2 B0.3")
    rank0 = rank_actions(Schedule.INTERLEAVED, 4, 2, 4, 0)   # 4 + 6 warm-ups, capped at 8
    assert _order(rank0) == ("F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 "
                             "B1.0 B1.1 B1.2 B1.3 B0.0 B0.1 B0.2 B0.3")
    # Two rounds of 4 with M = 8: chunk 0's first round, chunk 1's, then alternating.
    rank3 = rank_actions(Schedule.INTERLEAVED, 4, 2, 8, 3)
    assert _order(rank3[:6]) == "F0.0 F0.1 F0.2 F0.3 F1.0 B1.0"
    with pytest.raises(ValueError, match="gpipe"):
        rank_actions(Schedule.GPIPE, 4, 1, 4, 0)


def _chunk(**over):
    base = dict(activations=10.0, working=3.0, gradients=100.0, reduced=25.0, output=1.0,
                input_buffer=1.0, grad_buffer=1.0)
    return ChunkBytes(**(base | over))


def test_a_rank_holds_a_chunk_s_gradients_from_its_first_backward_to_its_reduce_scatter():
    """FSDP2 accumulates a chunk's unsharded gradients from its first backward and reduce-
    scatters them after its last (``backward_maybe_with_nosync``): an interleaved rank whose
    last chunk finished holds that chunk's shard only while its first chunk runs."""
    actions = [Action(True, 0, 0), Action(True, 1, 0), Action(False, 1, 0), Action(False, 0, 0)]
    chunks = [_chunk(input_buffer=0.0, reduced=0.0), _chunk(grad_buffer=0.0, reduced=0.0)]
    held = peak_held(actions, chunks, micro=1)
    # Persistent receive buffers: chunk 0's output gradient, chunk 1's input; two outputs.
    assert held.buffers == pytest.approx(1.0 + 1.0 + 2.0)
    # The first backward (chunk 1) is the peak: both chunks' activations, its working set and
    # its whole gradient; chunk 0's gradient has not begun.
    assert held.activations == pytest.approx(10.0 + 10.0 + 3.0)
    assert held.gradients == pytest.approx(100.0)
    # With a large shard kept, chunk 0's backward peaks: chunk 1's shard and chunk 0's whole
    # gradient, one micro-batch's activations, and chunk 1's input gradient left in its buffer.
    chunks = [_chunk(input_buffer=0.0), _chunk(grad_buffer=0.0)]
    held = peak_held(actions, chunks, micro=1)
    assert held.gradients == pytest.approx(25.0 + 100.0)
    assert held.activations == pytest.approx(10.0 + 3.0)
    assert held.buffers == pytest.approx(1.0 + 1.0 + 2.0 + 1.0)


def test_each_backward_leaves_its_input_gradient_in_the_receive_buffer_until_the_step_ends():
    """``stage_backward`` reads the inputs' ``.grad``; ``clear_runtime_states`` frees them at the
    next step: the last stage of 1F1B holds one per finished micro-batch."""
    chunk = _chunk(activations=0.0, working=0.0, gradients=0.0, reduced=0.0, output=0.0,
                   grad_buffer=0.0)
    actions = rank_actions(Schedule.ONE_F_ONE_B, 4, 1, 4, 3)
    assert peak_held(actions, [chunk], micro=4).buffers == pytest.approx(4 * 1.0 + 3 * 1.0)


def test_an_interleaved_torchtitan_rank_holds_one_chunk_s_gradients_at_its_peak():
    """405B on PP 8 x 2 chunks, 8 micro-batches: rank 1 runs all 16 forwards first and the
    later chunk's backwards next, so its peak holds one chunk's FP32 gradients (8 of its 16
    layers); 1F1B's stage holds all of its own."""
    model = PRESETS["llama3-405b"]
    training = TrainingSpec(seq_len=8192, global_batch=256, micro_batch=4,
                            fp32_grad_reduce=True)
    common = dict(tp=8, dp=8, pp=8, zero=3, sequence_parallel=True, recompute=Recompute.FULL)
    looped = memory_per_stage(model, training, Strategy(
        **common, schedule=Schedule.INTERLEAVED, virtual_stages=2))
    single = memory_per_stage(model, training, Strategy(**common))
    assert looped[1].memory.gradients == pytest.approx(single[1].memory.gradients / 2, rel=1e-9)


def test_torch_2024_buffers_hold_every_micro_batch_s_logits_on_the_last_stage():
    """With ``pp_microbatch_buffers`` (torch 2.6.0's stage.py) the last 1F1B stage peaks in its
    last backward holding 8 micro-batches' logits in ``output_chunks``, 8 input receive buffers
    and 7 input gradients, in place of one send and one receive buffer."""
    model = PRESETS["llama3-405b"]
    strategy = Strategy(tp=8, dp=8, pp=8, zero=3, sequence_parallel=True,
                        recompute=Recompute.FULL)
    plain = TrainingSpec(seq_len=8192, global_batch=256, micro_batch=4, fp32_grad_reduce=True)
    kept = TrainingSpec(seq_len=8192, global_batch=256, micro_batch=4, fp32_grad_reduce=True,
                        pp_microbatch_buffers=True)
    last = [memory_per_stage(model, t, strategy)[-1].memory for t in (plain, kept)]
    tokens, vocab_rows = 4 * 8192, 128256 // 8
    hidden = 2 * tokens * 16384 / 8                     # 16-bit, sequence-parallel
    expected = 8 * 2 * tokens * vocab_rows + (8 + 7) * hidden - 2 * 2 * tokens * 16384
    assert last[1].comm_buffers - last[0].comm_buffers == pytest.approx(expected, rel=1e-12)

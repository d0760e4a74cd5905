"""What ``torch.distributed.pipelining`` holds on one rank over a step (torchtitan's PP runtime).

torchtitan runs pipeline parallelism with PyTorch's own schedules and ``PipelineStage``, with
FSDP2 keeping each stage gathered (``Strategy.fsdp_keeps_gathered``). Its memory differs from
Megatron-LM's in when gradients live and in the per-micro-batch buffers the stage keeps, so the
peak is taken over the schedule's own order of actions instead of a closed formula.

Source: torch 2.6.0 (git 2236df1, released in January 2025 from a branch of main weeks before
torch 1963fc8 of 2024-12-23 that torchtitan's 405B benchmarks ran; the buffers below are the
same in mid-2024's code), ``torch/distributed/pipelining``:
- ``schedules.py``: ``Schedule1F1B._step_microbatches`` runs min(M, pp - i) warm-up forwards on
  stage i, then a backward before each remaining forward, then the remaining backwards.
  ``ScheduleInterleaved1F1B`` (``_calculate_single_rank_operations`` and ``_get_1f1b_rank_ops``)
  runs min((v - 1) M/r + 2 (pp - 1 - rank), v M) warm-up forwards, its local chunks in turn in
  rounds of M/r micro-batches (r = max(1, M // pp) rounds), then a forward and a backward per
  step; the backwards start with the last local chunk.
- ``stage.py``: at the first step a stage allocates a receive buffer for every micro-batch's
  input (all but the first stage, ``_prepare_forward_infra``) and for every micro-batch's output
  gradient (all but the last, ``_prepare_backward_infra``); the input buffers are autograd
  leaves, so each backward leaves its input gradient in their ``.grad`` until the next step's
  ``clear_runtime_states``; ``forward_one_chunk`` appends every output to ``output_chunks``,
  also kept until then (the last stage's are the logits; pytorch/pytorch#153383, May 2025,
  later kept the last stage's only). ``backward_maybe_with_nosync`` keeps FSDP2 from reducing
  until a stage's own last backward, then runs the post-backward of that stage's module: its
  accumulated FP32 gradients are reduce-scattered to shards and freed while the rank's other
  chunks still run, so an interleaved rank holds only the unsharded gradients of the chunks
  whose backward has begun. FSDP2 accumulates them from the chunk's first backward on
  (``FSDPParam.to_accumulated_grad_if_needed``).
A backward holds what the rank held before it, its chunk's whole gradient and the chunk's
working set (the recomputed layer, or the loss on the last stage), as the closed formula does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.workloads.strategy import Schedule


@dataclass(frozen=True, slots=True)
class Action:
    forward: bool
    chunk: int
    """Local chunk on this rank (virtual stage 0 first)."""
    micro: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkBytes:
    """What one of a rank's model chunks keeps, in bytes on this device."""

    activations: float
    """Kept from a micro-batch's forward to its backward."""
    working: float
    """Live during one micro-batch's backward only."""
    gradients: float
    """Its unsharded gradients, from its first backward to its last."""
    reduced: float
    """Its gradient shard after the reduce-scatter, kept to the optimizer step."""
    output: float
    """One micro-batch's output, kept in ``output_chunks``."""
    input_buffer: float
    """One receive buffer for its input (0 on the first stage)."""
    grad_buffer: float
    """One receive buffer for its output's gradient (0 on the last stage)."""


@dataclass(frozen=True, slots=True)
class Held:
    """What the rank holds at its peak."""

    activations: float
    gradients: float
    buffers: float

    @property
    def total(self) -> float:
        return self.activations + self.gradients + self.buffers


def rank_actions(schedule: Schedule, pp: int, virtual_stages: int, micro: int,
                 rank: int) -> tuple[Action, ...]:
    """The compute actions of ``rank`` in torch's order (the idle slots left out)."""
    if schedule is Schedule.ONE_F_ONE_B:
        warmup = min(micro, pp - rank)
        out = [Action(True, 0, m) for m in range(warmup)]
        done = 0
        for m in range(warmup, micro):
            out += [Action(False, 0, done), Action(True, 0, m)]
            done += 1
        return tuple(out + [Action(False, 0, m) for m in range(done, micro)])
    if schedule is not Schedule.INTERLEAVED:
        raise ValueError(f"torch pipelining order not modelled for {schedule.value}")
    v = virtual_stages
    per_round = micro // max(1, micro // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), micro * v)
    total = micro * v
    seen_f: dict[int, int] = {}
    seen_b: dict[int, int] = {}

    def step(forward: bool, op: int) -> Action:
        k = (op // per_round) % v if forward else v - 1 - ((op - warmup) // per_round) % v
        seen = seen_f if forward else seen_b
        seen[k] = seen.get(k, 0) + 1
        return Action(forward, k, seen[k] - 1)

    out: list[Action] = []
    for op in range(total + warmup):
        if op < total:
            out.append(step(True, op))
        if op >= warmup:
            out.append(step(False, op))
    return tuple(out)


def peak_held(actions: Sequence[Action], chunks: Sequence[ChunkBytes], micro: int) -> Held:
    """The largest activations + gradients + buffers the rank holds over ``actions``."""
    acts = grads = outputs = input_grads = 0.0
    buffers = sum(micro * (c.input_buffer + c.grad_buffer) for c in chunks)
    backwards = [0] * len(chunks)
    best = Held(0.0, 0.0, 0.0)
    for a in actions:
        c = chunks[a.chunk]
        if a.forward:
            acts += c.activations
            outputs += c.output
            now = Held(acts, grads, buffers + outputs + input_grads)
        else:
            if backwards[a.chunk] == 0:
                grads += c.gradients
            now = Held(acts + c.working, grads, buffers + outputs + input_grads)
            acts -= c.activations
            input_grads += c.input_buffer
            backwards[a.chunk] += 1
            if backwards[a.chunk] == micro:
                grads += c.reduced - c.gradients
        if now.total > best.total:
            best = now
    return best

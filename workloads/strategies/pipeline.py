"""Pipeline schedules: the order in which one stage runs forward and backward passes.

- GPipe (Huang et al. 2019): all m forwards, then all m backwards.
- 1F1B (PipeDream-Flush; Narayanan et al. SC'21 sec. 2.2.1): stage i runs pp - i - 1 warm-up
  forwards, then alternates one forward and one backward, then drains the backwards.
- Interleaved 1F1B (SC'21 sec. 2.2.2): v model chunks per stage; the order follows Megatron-LM's
  ``forward_backward_pipelining_with_interleaving`` (warm-up of (pp - i - 1) * 2 + (v - 1) * pp
  chunk-passes; micro-batches advance in groups of pp). Its bubble is (pp - 1) / (v m) of the ideal
  time, 1/v of 1F1B's (p - 1) / m.

With Megatron-Core's 1F1B all-to-all overlap (``--overlap-moe-expert-parallel-comm``, "EP A2A
overlap" in its MoE guide) each steady-state forward runs merged with the backward after it: the
builder interleaves the two passes so that the expert all-to-all of one hides under the compute of
the other (attention forward under the backward's combine, the backward's expert GEMMs under the
forward's dispatch, and so on; the overlapped chunk pair of the DeepSeek-V3 report, arXiv
2412.19437 sec. 3.2.1, Figure 4). A merged pair must hold different micro-batches, so the merged
schedule runs one warm-up forward more than the plain one.

DualPipe (DeepSeek-V3 report, arXiv 2412.19437 sec. 3.2.1, Figure 5; the order of
deepseek-ai/DualPipe's ``DualPipe._forward_backward_pipelining``): micro-batches enter from both
ends of the pipeline. Stage i holds model stage i of one direction (chunk 0, stage 0 -> pp-1) and
model stage pp-1-i of the other (chunk 1): two copies of the parameters. Eight phases per stage:
forwards of the own direction, forwards of both, backward-forward of the other, then the main
phase of overlapped forward-backward chunk pairs (each the overlapped pair above), then the
drains. Here a backward computes its weight gradients at once: the zero-bubble split that defers
them into the drain's bubbles is not modelled, which leaves the bubble somewhat larger than
DualPipe's (PP/2 - 1)(F&B + B - 3W).

Between stages each micro-batch's activation goes forward and its gradient back, split over the
TP ranks (Megatron's scatter/gather optimisation, Narayanan et al. SC'21 sec. 4.1): each TP rank
sends 1/tp of it, as non-blocking send/recv on the pp stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategy import Schedule

_TAG_OF_PASS = {Pass.FORWARD: 0, Pass.BACKWARD: 1}


@dataclass(frozen=True, slots=True)
class Slot:
    """One pass of one micro-batch through one of the stage's model chunks."""

    kind: Pass
    micro: int
    chunk: int
    """Virtual-stage index on this stage (0 .. v-1)."""
    merged: bool = False
    """A backward that runs merged with the forward just before it (all-to-all overlap)."""


def _interleaved_slot(k: int, pp: int, v: int, kind: Pass) -> Slot:
    """The k-th forward (or backward) chunk-pass of a stage under Megatron's interleaving."""
    group, within = divmod(k, pp * v)
    chunk = within // pp
    if kind is Pass.BACKWARD:
        chunk = v - 1 - chunk
    return Slot(kind, group * pp + within % pp, chunk)


def stage_order(schedule: Schedule, pp: int, v: int, micro: int, stage: int,
                merge: bool = False) -> list[Slot]:
    """The stage's passes in the order it runs them; with ``merge`` (1F1B and interleaved
    only), one warm-up forward more and every steady-state backward merged with the forward
    before it."""
    if schedule is Schedule.DUALPIPE:
        return dualpipe_order(pp, micro, stage)
    if schedule is Schedule.GPIPE:
        return ([Slot(Pass.FORWARD, j, 0) for j in range(micro)]
                + [Slot(Pass.BACKWARD, j, 0) for j in range(micro)])
    if schedule is Schedule.INTERLEAVED and v > 1:
        total = micro * v
        warmup = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
        fwd = [_interleaved_slot(k, pp, v, Pass.FORWARD) for k in range(total)]
        bwd = [_interleaved_slot(k, pp, v, Pass.BACKWARD) for k in range(total)]
    else:
        total = micro
        warmup = min(pp - stage - 1, micro)
        fwd = [Slot(Pass.FORWARD, j, 0) for j in range(micro)]
        bwd = [Slot(Pass.BACKWARD, j, 0) for j in range(micro)]
    if merge:
        warmup = min(warmup + 1, total)
    order = fwd[:warmup]
    f, b = warmup, 0
    while f < total:
        order.append(fwd[f])
        order.append(Slot(Pass.BACKWARD, bwd[b].micro, bwd[b].chunk, merged=merge))
        f, b = f + 1, b + 1
    order += bwd[b:]
    return order


def dualpipe_order(pp: int, micro: int, stage: int) -> list[Slot]:
    """Stage ``stage``'s DualPipe order. ``chunk`` is the direction (0: entering at stage 0,
    1: at stage pp-1); micro-batches 0 .. micro/2-1 go one way, the rest the other. The
    reference names passes by "phase", the stage's own direction first (chunk 1 is phase 0 on
    the second half of the stages)."""
    half, half_micro = pp // 2, micro // 2
    rank = min(stage, pp - 1 - stage)
    middle = half - 1 <= stage <= half
    swap = int(stage >= half)
    issued = {Pass.FORWARD: [0, 0], Pass.BACKWARD: [0, 0]}
    order: list[Slot] = []

    def run(kind: Pass, phase: int, merged: bool = False) -> None:
        direction = phase ^ swap
        j = issued[kind][direction]
        issued[kind][direction] += 1
        order.append(Slot(kind, direction * half_micro + j, direction, merged))

    def pair(forward: int, backward: int) -> None:
        run(Pass.FORWARD, forward)
        run(Pass.BACKWARD, backward, merged=True)

    F, B = Pass.FORWARD, Pass.BACKWARD
    for _ in range((half - rank - 1) * 2):                  # 1: nF0
        run(F, 0)
    for _ in range(rank + 1):                               # 2: nF0F1
        run(F, 0)
        run(F, 1)
    for _ in range(half - rank - 1):                        # 3: nB1W1F1
        run(B, 1)
        run(F, 1)
    for i in range(half_micro - pp + rank + 1):             # 4: nF0B1F1B0
        if i == 0 and middle:
            run(F, 0)
            run(B, 1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(half - rank - 1):                        # 5: nB1F1B0
        run(B, 1)
        pair(1, 0)
    for _ in range(rank + 1):                               # 6: nB1B0
        run(B, 1)
        run(B, 0)
    for _ in range(half - rank - 1):                        # 7: nWB0
        run(B, 0)
    return order


def steps(order: list[Slot]) -> list[tuple[Slot, ...]]:
    """The order as steps: one pass, or a forward and the backward merged with it."""
    out: list[tuple[Slot, ...]] = []
    for slot in order:
        if slot.merged and out:
            out[-1] = out[-1] + (slot,)
        else:
            out.append((slot,))
    return out


class PipelineParallel:
    """Emits a stage's sends and receives of activations (forward) and their gradients
    (backward) to its neighbour stages; ``chunk`` is the global model-chunk index."""

    def __init__(self, stage: StageProgram):
        self.stage = stage
        pp, index = stage.strategy.pp, stage.plan.stage
        self.previous, self.next = (index - 1) % pp, (index + 1) % pp
        self.message_bytes = stage.activation_bytes / stage.strategy.tp
        self.dualpipe = stage.strategy.schedule is Schedule.DUALPIPE

    def place(self, slot: Slot) -> tuple[int, bool, bool]:
        """The slot's global chunk index, and whether that chunk is the model's first (with
        the embedding) and its last (with the LM head). Under DualPipe chunks 0 .. pp-1 run
        from stage 0 up and chunks pp .. 2pp-1 from stage pp-1 down."""
        s, index = self.stage.strategy, self.stage.plan.stage
        if self.dualpipe:
            position = index if slot.chunk == 0 else s.pp - 1 - index
            return slot.chunk * s.pp + position, position == 0, position == s.pp - 1
        chunk = slot.chunk * s.pp + index
        return chunk, chunk == 0, chunk == s.chunks - 1

    def _neighbours(self, chunk: int) -> tuple[int, int]:
        """The stages before and after ``chunk`` in its direction."""
        if self.dualpipe and chunk >= self.stage.strategy.pp:
            return self.next, self.previous
        return self.previous, self.next

    def receive(self, kind: Pass, micro: int, chunk: int) -> int:
        """The activation (forward) or gradient (backward) that ``chunk`` needs."""
        before, after = self._neighbours(chunk)
        peer = before if kind is Pass.FORWARD else after
        return self.stage.ops.recv(f"recv_{kind.value}{micro}.chunk{chunk}", peer,
                                   self.message_bytes, _tag(kind, micro, chunk))

    def send(self, kind: Pass, micro: int, chunk: int, deps: tuple[int, ...]) -> int:
        """``chunk``'s output (forward) or input gradient (backward) to the next chunk."""
        before, after = self._neighbours(chunk)
        peer, to = (after, chunk + 1) if kind is Pass.FORWARD else (before, chunk - 1)
        return self.stage.ops.send(f"send_{kind.value}{micro}.chunk{chunk}", peer,
                                   self.message_bytes, _tag(kind, micro, to), deps)

    def last_micro(self, slot: Slot) -> bool:
        """Whether the slot's micro-batch is the last its chunk's parameters see this step
        (their gradients are reduced then); under DualPipe each direction has its own."""
        micro = self.stage.job.micro_batches
        if self.dualpipe:
            return slot.micro == (slot.chunk + 1) * (micro // 2) - 1
        return slot.micro == micro - 1


def _tag(kind: Pass, micro: int, chunk: int) -> int:
    """Matches a send with its receive: the pass, the micro-batch and the receiving chunk."""
    return (micro * 1_000_003 + chunk) * 2 + _TAG_OF_PASS[kind]

"""Trace generation for dense (and MoE) transformers under hybrid parallelism.

One program per pipeline stage: every rank of a stage (all its TP, CP and DP peers) runs the same
ops. The stage walks its pipeline schedule and, for each layer, asks each parallel strategy
(``workloads/strategies/``) to emit its part:

- ``tensor``: tensor and sequence parallelism around every block, the vocabulary-parallel
  embedding, LM head and loss;
- ``context``: ring attention over the context-parallel ranks;
- ``expert``: the all-to-all dispatch and combine of routed experts;
- ``pipeline``: the schedule, and activations sent between stages;
- ``data``: gradient reductions, ZeRO gathers, the optimizer step.
"""

from __future__ import annotations

from collections.abc import Generator

from clustersim.hardware_specs import SpecError
from clustersim.workloads.axes import (
    CP_A2A_GROUP, CP_RING_GROUP, DP_REPLICATE_GROUP, DP_SHARD_GROUP, EXPERT_DATA_GROUP,
    EXPERT_TENSOR_GROUP, SUBNETWORK_DATA_GROUP, TIED_EMBEDDING_GROUP, Axis,
)
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import LayerOps, LayerWork, Pass
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.memory import stage_memory
from clustersim.workloads.shards import block_ranks
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.strategies.context import ContextParallel
from clustersim.workloads.strategies.data import DataParallel
from clustersim.workloads.strategies.expert import ExpertParallel
from clustersim.workloads.strategies.pipeline import PipelineParallel, Slot, stage_order, steps
from clustersim.workloads.strategies.program import (
    OpList, StageProgram, Steps, drain, interleave,
)
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.strategy import CudaGraphs, Recompute
from clustersim.workloads.trace import GroupSet, Op, Phase, Program, Trace, validate


class StageBuilder:
    """Emits one pipeline stage's program by composing the parallel strategies."""

    def __init__(self, job: Job, plan: StagePlan):
        kernels = LayerOps(job.model, job.training, job.strategy)
        self.stage = StageProgram(job=job, plan=plan, kernels=kernels,
                                  ops=OpList(eager=job.strategy.cuda_graphs is not CudaGraphs.FULL))
        self.tensor = TensorParallel(self.stage)
        self.context = ContextParallel(self.stage, self.tensor)
        self.expert = ExpertParallel(self.stage, self.tensor)
        self.pipeline = PipelineParallel(self.stage)
        self.data = DataParallel(self.stage)
        self._work: dict[tuple, tuple[LayerWork, LayerWork, LayerWork, tuple]] = {}
        """(forward, backward, recompute) kernels of each kind of layer the stage holds."""

    def work(self, layer: int) -> tuple[LayerWork, LayerWork, LayerWork]:
        """Kernels of layer ``layer``: layers of one kind (dense or MoE MLP, global or local
        attention) share theirs, so the engine times each kind once."""
        kind = self.stage.model.layer_kind(layer)
        if kind not in self._work:
            k = self.stage.kernels
            self._work[kind] = (k.forward(layer), k.backward(layer), k.recompute(layer),
                                k.moe_recompute(layer))
        return self._work[kind]

    # --- a layer -------------------------------------------------------------------------
    def layer_forward(self, micro: int, layer: int, layers: list[int], phase: Phase,
                      deps: tuple[int, ...]) -> Steps:
        deps = deps + self.data.before_forward(phase, micro, layer, layers)
        tag = f"{'fwd' if phase is Phase.FORWARD else 'recompute'}{micro}.layer{layer}"
        work = self.work(layer)[0]
        if work.attention:   # a hybrid stack's layer holds one of the two blocks
            deps = (self.context.attention(f"{tag}.attn", phase, work.attention, deps,
                                           backward=False),)
        if not work.mlp:
            return deps[0]
        return (yield from self.expert.mlp(f"{tag}.mlp", phase, work.mlp, deps))

    def layer_backward(self, micro: int, layer: int, layers: list[int], deps: tuple[int, ...],
                       last_micro: bool) -> Steps:
        strategy = self.stage.strategy
        deps = deps + self.data.before_backward(micro, layer, layers)
        if strategy.recomputes(layers.index(layer)):
            deps = ((yield from self.layer_forward(micro, layer, layers, Phase.RECOMPUTE,
                                                   deps)),)
        tag = f"bwd{micro}.layer{layer}"
        _, backward, recompute, moe_block = self.work(layer)
        attention, mlp_work = backward.attention, backward.mlp
        if moe_block:   # the MoE block's forward, dispatch and combine included, reruns first
            deps = ((yield from self.expert.mlp(f"{tag}.moe_recompute", Phase.RECOMPUTE,
                                                moe_block, deps)),)
        if strategy.recompute is Recompute.SELECTIVE:
            attention = recompute.attention + attention
        elif strategy.recompute is Recompute.MODULES:
            # Each module reruns just before its own backward.
            attention = recompute.attention + attention
            mlp_work = recompute.mlp + mlp_work
        elif strategy.recompute is Recompute.OP:
            # The checkpoint recomputes the whole layer's unsaved work at its first unpack,
            # before the MLP's backward.
            mlp_work = recompute.attention + recompute.mlp + mlp_work
        if mlp_work:
            deps = ((yield from self.expert.mlp(f"{tag}.mlp", Phase.BACKWARD, mlp_work, deps)),)
        if attention:
            deps = (self.context.attention(f"{tag}.attn", Phase.BACKWARD, attention, deps,
                                           backward=True),)
        self.data.reduce_gradients(tag, layer, last_micro)
        return deps[0]

    # --- embedding and LM head -----------------------------------------------------------
    def embedding_forward(self, micro: int, deps: tuple[int, ...]) -> int:
        """Vocab-parallel embedding (Megatron): each TP rank looks up its slice of the
        vocabulary, and the partial embeddings are summed over TP."""
        name = f"fwd{micro}.embedding"
        op = self.stage.ops.compute(name, Phase.FORWARD, self.stage.kernels.embedding_forward(),
                                    deps)
        return self.tensor.reduce_if_split(name, op)

    def head_forward(self, micro: int, deps: tuple[int, ...], part: str = "") -> int:
        """Final norm and vocab-parallel LM head, then the vocab-parallel cross-entropy
        (``part`` names a multi-token-prediction module's head)."""
        ops, prefix = self.stage.ops, f"fwd{micro}.{part}"
        name = f"{prefix}head"
        kernels = self.stage.kernels.head_forward()
        if self.tensor.degree == 1:
            return ops.compute(name, Phase.FORWARD, kernels, deps)
        loss = tuple(k for k in kernels if k.name == "cross_entropy")
        logits = tuple(k for k in kernels if k.name != "cross_entropy")
        last = ops.compute(name, Phase.FORWARD, logits, self.tensor.gather_sequence(name, deps))
        last = self.tensor.cross_entropy(f"{prefix}cross_entropy", last)
        return ops.compute(f"{prefix}loss", Phase.FORWARD, loss, (last,))

    def head_backward(self, micro: int, deps: tuple[int, ...], part: str = "") -> int:
        """LM head gradient; its input gradient is a partial sum over the vocabulary slices."""
        name = f"bwd{micro}.{part}head"
        op = self.stage.ops.compute(name, Phase.BACKWARD, self.stage.kernels.head_backward(),
                                    deps)
        return self.tensor.reduce_if_split(name, op)

    # --- multi-token prediction ------------------------------------------------------------
    def mtp_forward(self, micro: int, deps: tuple[int, ...]) -> Generator[None, None, None]:
        """DeepSeek-V3's MTP modules after the last layer (sec. 2.2): each projects the
        previous depth's hidden state with the next token's embedding, runs a layer like the
        last one, and its own pass through the shared LM head and loss. Their parameters are
        layers ``model.layers + depth`` of the stage's shards (gathered, reduced as a layer's)."""
        m, ops = self.stage.model, self.stage.ops
        forward = self.work(m.layers - 1)[0]
        for depth in range(m.mtp_layers):
            tag, module = f"fwd{micro}.mtp{depth}", m.layers + depth
            op = ops.compute(f"{tag}.input", Phase.FORWARD, self.stage.kernels.mtp_input(), deps)
            gathers = self.data.before_forward(Phase.FORWARD, micro, module, [module])
            attn = self.context.attention(f"{tag}.attn", Phase.FORWARD, forward.attention,
                                          (op,) + gathers, backward=False)
            deps = ((yield from self.expert.mlp(f"{tag}.mlp", Phase.FORWARD, forward.mlp,
                                                (attn,))),)
            self.head_forward(micro, deps, part=f"mtp{depth}.")

    def mtp_backward(self, micro: int, last_micro: bool) -> Generator[None, None,
                                                                      tuple[int, ...]]:
        """The MTP modules' gradients, deepest first; they join the last layer's."""
        m, ops = self.stage.model, self.stage.ops
        backward = self.work(m.layers - 1)[1]
        deps: tuple[int, ...] = ()
        for depth in reversed(range(m.mtp_layers)):
            tag, module = f"bwd{micro}.mtp{depth}", m.layers + depth
            head = self.head_backward(micro, deps, part=f"mtp{depth}.")
            gathers = self.data.before_backward(micro, module, [module])
            mlp = yield from self.expert.mlp(f"{tag}.mlp", Phase.BACKWARD, backward.mlp,
                                             (head,) + gathers)
            attn = self.context.attention(f"{tag}.attn", Phase.BACKWARD, backward.attention,
                                          (mlp,), backward=True)
            deps = (ops.compute(f"{tag}.input", Phase.BACKWARD,
                                self.stage.kernels.mtp_input_backward(), (attn,)),)
            self.data.reduce_gradients(tag, module, last_micro)
        return deps

    # --- the schedule ----------------------------------------------------------------------
    def forward_pass(self, slot: Slot) -> Steps:
        """One micro-batch's forward through one of the stage's model chunks."""
        stage = self.stage
        chunk, first, last = self.pipeline.place(slot)
        layers, micro = list(stage.plan.chunk_layer_ids[slot.chunk]), slot.micro
        deps: tuple[int, ...] = ()
        if not first:
            deps = (self.pipeline.receive(Pass.FORWARD, micro, chunk),)
        if first or last:
            deps += self.data.gather_root(micro)
        if first:
            deps = (self.embedding_forward(micro, deps),)
        for layer in layers:
            deps = ((yield from self.layer_forward(micro, layer, layers, Phase.FORWARD, deps)),)
        if last:
            self.head_forward(micro, deps)
            yield from self.mtp_forward(micro, deps)
            return stage.ops.ops[-1].id
        return self.pipeline.send(Pass.FORWARD, micro, chunk, deps)

    def backward_pass(self, slot: Slot) -> Steps:
        """One micro-batch's backward through one of the stage's model chunks."""
        stage = self.stage
        chunk, first, last = self.pipeline.place(slot)
        layers, micro = list(stage.plan.chunk_layer_ids[slot.chunk]), slot.micro
        deps: tuple[int, ...] = ()
        if not last:
            deps = (self.pipeline.receive(Pass.BACKWARD, micro, chunk),)
        last_micro = self.pipeline.last_micro(slot)
        if last:
            mtp = yield from self.mtp_backward(micro, last_micro)
            deps = (self.head_backward(micro, mtp),)
        backwards = layers[::-1]
        for layer in backwards:
            deps = ((yield from self.layer_backward(micro, layer, backwards, deps,
                                                    last_micro)),)
        if first:
            end = stage.ops.compute(f"bwd{micro}.embedding", Phase.BACKWARD,
                                    stage.kernels.embedding_backward(), deps)
        else:
            end = self.pipeline.send(Pass.BACKWARD, micro, chunk, deps)
        if first or last:
            self.data.reduce_root(micro)
        return end

    def run(self) -> tuple[Op, ...]:
        stage, strategy = self.stage, self.stage.strategy
        order = stage_order(strategy.schedule, strategy.pp, strategy.virtual_stages,
                            stage.job.micro_batches, stage.plan.stage,
                            merge=strategy.moe_a2a_overlap)
        for step in steps(order):
            passes = [self.forward_pass(s) if s.kind is Pass.FORWARD else self.backward_pass(s)
                      for s in step]
            if len(passes) == 2:
                # The backward first: its combine all-to-all hides under the forward's
                # attention, as in Megatron-Core's merged forward-backward.
                interleave(passes[1], passes[0])
            else:
                drain(passes[0])
        self.data.optimizer_step()
        return tuple(stage.ops.ops)


def group_sets(layout: ParallelLayout, tied_pp_embedding: bool) -> dict[str, GroupSet]:
    """Rank partitions for every axis the trace uses. ``dp`` is the gradient-reduction group
    (data x context parallel ranks holding the same parameters); with expert parallelism,
    ``edp`` holds the ranks with the same experts."""
    names = [Axis.TP.value, Axis.CP.value, Axis.PP.value, Axis.DP.value]
    if layout.ep > 1 or (layout.etp or layout.tp) != layout.tp:
        names += [Axis.EP.value, EXPERT_DATA_GROUP]
    if layout.ep > 1 and (layout.etp or layout.tp) > 1:
        names.append(EXPERT_TENSOR_GROUP)
    if layout.cp_a2a > 1:
        names += [CP_A2A_GROUP, CP_RING_GROUP]
    if layout.dp_shard and layout.dp_shard < layout.dp:
        names += [DP_SHARD_GROUP, DP_REPLICATE_GROUP]
    if layout.sdp:
        names.append(SUBNETWORK_DATA_GROUP)
    if tied_pp_embedding:
        names.append(TIED_EMBEDDING_GROUP)
    return {name: GroupSet(name, layout.partition(name)) for name in names}


def build_trace(job: Job) -> Trace:
    """The step's trace: one program per pipeline stage."""
    s, m = job.strategy, job.model
    if s.world_size < 1:
        raise SpecError("strategy", "empty world")
    if m.is_hybrid and s.cp > 1:
        raise SpecError("strategy.cp", f"{s.cp}: context parallelism of Mamba layers "
                        "(Megatron-Core's MambaContextParallel) is not modelled")
    if m.is_hybrid and s.recompute in (Recompute.OP, Recompute.MODULES):
        raise SpecError("strategy.recompute", f"{s.recompute.value}: per-op and per-module "
                        "recompute of a hybrid stack are not modelled (none, selective or full)")
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep if m.is_moe else 1,
                            etp=s.expert_tp, cp_a2a=s.cp_a2a or 1, dp_shard=s.zero_shards,
                            sdp=block_ranks(m, s) if s.subnetworks else 0)
    programs = []
    replicas = job.replicas()
    per_stage = layout.world_size // s.pp
    for plan in stage_plans(m, s):
        stage_ranks = range(plan.stage * per_stage, (plan.stage + 1) * per_stage)
        for part, members in replicas:
            ranks = tuple(r for r in stage_ranks if layout.coords(r)[Axis.DP] in members)
            ops = StageBuilder(part, plan).run()
            mem = stage_memory(m, part.training, part.strategy, plan).memory
            static = mem.weights + mem.gradients + mem.optimizer + mem.comm_buffers + mem.reserve
            name = f"stage{plan.stage}" + (
                f".batch{part.training.global_batch // s.dp}" if len(replicas) > 1 else "")
            programs.append(Program(name, ranks, ops,
                                    static_memory_bytes=static, peak_memory_bytes=mem.required))
    trace = Trace(
        world_size=layout.world_size,
        programs=tuple(programs),
        group_sets=group_sets(layout, m.tied_embeddings and s.pp > 1),
        model_flops=job.model_flops_per_step,
        tokens=float(job.training.tokens_per_step),
        meta={"model": m.name, "strategy": s.to_dict(), "training": job.training.to_dict(),
              "peak_dtype": job.training.precision.gemm_dtype.value},
    )
    return validate(trace)

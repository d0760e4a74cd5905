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

from clustersim.hardware_specs import SpecError
from clustersim.workloads.axes import TIED_EMBEDDING_GROUP, Axis
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import LayerOps, Pass
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.memory import stage_memory
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.strategies.context import ContextParallel
from clustersim.workloads.strategies.data import DataParallel
from clustersim.workloads.strategies.expert import ExpertParallel
from clustersim.workloads.strategies.pipeline import PipelineParallel, stage_order
from clustersim.workloads.strategies.program import OpList, StageProgram
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.strategy import Recompute
from clustersim.workloads.trace import GroupSet, Op, Phase, Program, Trace, validate


class StageBuilder:
    """Emits one pipeline stage's program by composing the parallel strategies."""

    def __init__(self, job: Job, plan: StagePlan):
        kernels = LayerOps(job.model, job.training, job.strategy)
        self.stage = StageProgram(job=job, plan=plan, ops=OpList(), kernels=kernels)
        self.tensor = TensorParallel(self.stage)
        self.context = ContextParallel(self.stage, self.tensor)
        self.expert = ExpertParallel(self.stage, self.tensor)
        self.pipeline = PipelineParallel(self.stage)
        self.data = DataParallel(self.stage)
        self.forward_work = kernels.forward()
        self.backward_work = kernels.backward()
        self.recompute_work = kernels.recompute()

    # --- a layer -------------------------------------------------------------------------
    def layer_forward(self, micro: int, layer: int, layers: list[int], phase: Phase,
                      deps: tuple[int, ...]) -> int:
        deps = deps + self.data.before_forward(phase, micro, layer, layers)
        tag = f"{'fwd' if phase is Phase.FORWARD else 'recompute'}{micro}.layer{layer}"
        work = self.forward_work
        attn = self.context.attention(f"{tag}.attn", phase, work.attention, deps, backward=False)
        return self.expert.mlp(f"{tag}.mlp", phase, work.mlp, (attn,))

    def layer_backward(self, micro: int, layer: int, layers: list[int], deps: tuple[int, ...],
                       last_micro: bool) -> int:
        strategy = self.stage.strategy
        deps = deps + self.data.before_backward(micro, layer, layers)
        if strategy.recomputes(layers.index(layer)):
            deps = (self.layer_forward(micro, layer, layers, Phase.RECOMPUTE, deps),)
        tag = f"bwd{micro}.layer{layer}"
        attention = self.backward_work.attention
        if strategy.recompute is Recompute.SELECTIVE:
            attention = self.recompute_work.attention + attention
        mlp = self.expert.mlp(f"{tag}.mlp", Phase.BACKWARD, self.backward_work.mlp, deps)
        attn = self.context.attention(f"{tag}.attn", Phase.BACKWARD, attention, (mlp,),
                                      backward=True)
        self.data.reduce_gradients(tag, last_micro)
        return attn

    # --- embedding and LM head -----------------------------------------------------------
    def embedding_forward(self, micro: int, deps: tuple[int, ...]) -> int:
        """Vocab-parallel embedding (Megatron): each TP rank looks up its slice of the
        vocabulary, and the partial embeddings are summed over TP."""
        name = f"fwd{micro}.embedding"
        op = self.stage.ops.compute(name, Phase.FORWARD, self.stage.kernels.embedding_forward(),
                                    deps)
        return self.tensor.reduce_if_split(name, op)

    def head_forward(self, micro: int, deps: tuple[int, ...]) -> int:
        """Final norm and vocab-parallel LM head, then the vocab-parallel cross-entropy."""
        ops, name = self.stage.ops, f"fwd{micro}.head"
        kernels = self.stage.kernels.head_forward()
        if self.tensor.degree == 1:
            return ops.compute(name, Phase.FORWARD, kernels, deps)
        loss = tuple(k for k in kernels if k.name == "cross_entropy")
        logits = tuple(k for k in kernels if k.name != "cross_entropy")
        last = ops.compute(name, Phase.FORWARD, logits, self.tensor.gather_sequence(name, deps))
        last = self.tensor.cross_entropy(f"fwd{micro}.cross_entropy", last)
        return ops.compute(f"fwd{micro}.loss", Phase.FORWARD, loss, (last,))

    def head_backward(self, micro: int, deps: tuple[int, ...]) -> int:
        """LM head gradient; its input gradient is a partial sum over the vocabulary slices."""
        name = f"bwd{micro}.head"
        op = self.stage.ops.compute(name, Phase.BACKWARD, self.stage.kernels.head_backward(),
                                    deps)
        return self.tensor.reduce_if_split(name, op)

    # --- the schedule ----------------------------------------------------------------------
    def run(self) -> tuple[Op, ...]:
        stage, ops = self.stage, self.stage.ops
        strategy, index = stage.strategy, stage.plan.stage
        last_chunk = strategy.chunks - 1
        for slot in stage_order(strategy.schedule, strategy.pp, strategy.virtual_stages,
                                stage.job.micro_batches, index):
            chunk = slot.chunk * strategy.pp + index       # global chunk index
            layers = list(stage.plan.chunk_layer_ids[slot.chunk])
            micro = slot.micro
            if slot.kind is Pass.FORWARD:
                deps: tuple[int, ...] = ()
                if chunk > 0:
                    deps = (self.pipeline.receive(Pass.FORWARD, micro, chunk),)
                if chunk in (0, last_chunk):
                    deps += self.data.gather_root(micro)
                if chunk == 0:
                    deps = (self.embedding_forward(micro, deps),)
                for layer in layers:
                    deps = (self.layer_forward(micro, layer, layers, Phase.FORWARD, deps),)
                if chunk == last_chunk:
                    self.head_forward(micro, deps)
                else:
                    self.pipeline.send(Pass.FORWARD, micro, chunk, deps)
            else:
                if chunk < last_chunk:
                    deps = (self.pipeline.receive(Pass.BACKWARD, micro, chunk),)
                else:
                    deps = (self.head_backward(micro, ()),)
                last_micro = micro == stage.job.micro_batches - 1
                backwards = layers[::-1]
                for layer in backwards:
                    deps = (self.layer_backward(micro, layer, backwards, deps, last_micro),)
                if chunk == 0:
                    ops.compute(f"bwd{micro}.embedding", Phase.BACKWARD,
                                stage.kernels.embedding_backward(), deps)
                else:
                    self.pipeline.send(Pass.BACKWARD, micro, chunk, deps)
                if chunk in (0, last_chunk):
                    self.data.reduce_root(micro)
        self.data.optimizer_step()
        return tuple(ops.ops)


def group_sets(layout: ParallelLayout, tied_pp_embedding: bool) -> dict[str, GroupSet]:
    """Rank partitions for every axis the trace uses. ``dp`` is the gradient-reduction group
    (data x context parallel ranks holding the same parameters)."""
    names = [Axis.TP.value, Axis.CP.value, Axis.PP.value, Axis.DP.value]
    if layout.ep > 1:
        names.append(Axis.EP.value)
    if tied_pp_embedding:
        names.append(TIED_EMBEDDING_GROUP)
    return {name: GroupSet(name, layout.partition(name)) for name in names}


def build_trace(job: Job) -> Trace:
    """The step's trace: one program per pipeline stage."""
    s, m = job.strategy, job.model
    if s.world_size < 1:
        raise SpecError("strategy", "empty world")
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep)
    programs = []
    per_stage = layout.world_size // s.pp
    for plan in stage_plans(m, s):
        ranks = tuple(range(plan.stage * per_stage, (plan.stage + 1) * per_stage))
        ops = StageBuilder(job, plan).run()
        mem = stage_memory(m, job.training, s, plan).memory
        static = mem.weights + mem.gradients + mem.optimizer + mem.comm_buffers
        programs.append(Program(f"stage{plan.stage}", ranks, ops,
                                static_memory_bytes=static, peak_memory_bytes=mem.total))
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

"""Trace generation for dense (and MoE) transformers under hybrid parallelism.

One program per pipeline stage: every rank of a stage (all its TP, CP and DP peers) runs the same
ops. What each op is, and where communication sits:

- Tensor parallel (Megatron, Shoeybi et al. 2019): per layer an all-reduce after the attention
  projection and after fc2 in forward, and one per block in backward; with sequence parallelism
  (Korthikanti et al. 2022) each becomes an all-gather before and a reduce-scatter after the
  block, and backward re-gathers the input for the weight gradient. Full recompute repeats the
  forward's communication. With ``tp_comm_overlap`` (Megatron-Core/Transformer Engine) those
  gathers and reduce-scatters stream in chunks beside the GEMMs that consume and produce them.
- Context parallel (ring attention, Liu et al. 2023): cp - 1 exchanges of the local K/V block
  with ring neighbours, each overlapped with the attention of the block already present;
  backward also passes dK/dV. GQA makes the blocks smaller.
- Expert parallel: all-to-all dispatch before and combine after the experts.
- Pipeline parallel: the activation (and its gradient) sent between stages, split over the TP
  ranks (Megatron's scatter/gather optimisation, SC'21 sec. 4.1).
- Data parallel / ZeRO (Rajbhandari et al. SC'20): gradients reduced per layer bucket during the
  last micro-batch's backward (all-reduce for ZeRO-0, reduce-scatter for 1-2), parameters
  all-gathered after the optimizer (ZeRO-1/2; with ``overlap_param_gather``, layer by layer
  before each layer's first forward); ZeRO-3 gathers each layer's parameters before its
  forward and backward (one layer prefetched) and reduce-scatters its gradients every micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import Kernel, LayerOps, Pass
from clustersim.workloads.layout import Axis, ParallelLayout
from clustersim.workloads.memory import stage_memory, stage_params
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.strategies.pipeline import stage_order
from clustersim.workloads.strategy import Offload, Recompute, Zero3Granularity, Zero3Prefetch
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, GroupSet, Op, Phase, Program,
    RecvOp, SendOp, Stream, TokenRouting, Trace, validate,
)

_FWD_TAG, _BWD_TAG = 0, 1


@dataclass
class _Emitter:
    """Appends ops to one program, tracking the last compute op for dependencies."""

    ops: list[Op] = field(default_factory=list)
    last_compute: int | None = None

    def _id(self) -> int:
        return len(self.ops)

    def compute(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                deps: tuple[int, ...] = ()) -> int:
        op_id = self._id()
        self.ops.append(ComputeOp(op_id, name, phase, kernels, tuple(sorted(set(deps)))))
        self.last_compute = op_id
        return op_id

    def collective(self, name: str, kind: CollectiveKind, nbytes: float, group: str,
                   stream: Stream, deps: tuple[int, ...] = (), per_rank_copies: bool = False,
                   routing: TokenRouting | None = None) -> int:
        op_id = self._id()
        self.ops.append(CollectiveOp(op_id, name, kind, nbytes, group, stream,
                                     tuple(sorted(set(deps))), per_rank_copies, routing))
        return op_id

    def send(self, name: str, peer: int, nbytes: float, tag: int, deps: tuple[int, ...]) -> int:
        op_id = self._id()
        self.ops.append(SendOp(op_id, name, "pp", peer, nbytes, tag, deps=deps))
        return op_id

    def recv(self, name: str, peer: int, nbytes: float, tag: int) -> int:
        op_id = self._id()
        self.ops.append(RecvOp(op_id, name, "pp", peer, nbytes, tag))
        return op_id

    def copy(self, name: str, kind: CopyKind, nbytes: float, deps: tuple[int, ...]) -> int:
        op_id = self._id()
        self.ops.append(CopyOp(op_id, name, kind, nbytes, deps=deps))
        return op_id

    def after_compute(self) -> tuple[int, ...]:
        return () if self.last_compute is None else (self.last_compute,)


class _StageBuilder:
    """Emits one pipeline stage's program."""

    def __init__(self, job: Job, plan: StagePlan):
        self.job, self.plan = job, plan
        self.m, self.t, self.s = job.model, job.training, job.strategy
        self.ops = LayerOps(self.m, self.t, self.s)
        self.e = _Emitter()
        self.elem = self.t.precision.activation_bytes
        self.fwd_work = self.ops.forward()
        self.bwd_work = self.ops.backward()
        self.recompute_work = self.ops.recompute()
        self.micro = job.micro_batches
        layer_local = self.m.layer_params / self.s.tp
        # Parameters are gathered in the compute dtype: 16-bit, or FP32 in FP32 training.
        self.layer_param_bytes = layer_local * self.elem
        self.layer_grad_bytes = layer_local * self.elem
        self.tensor_bytes = tuple(
            self.elem * (n if n <= self.m.hidden * 2 else n / self.s.tp)
            for n in self.m.layer_tensors())
        self.grad_reduce_ops: list[int] = []
        self.gather_ops: dict[tuple[Pass, int, int], int] = {}
        self.param_gathers: set[int] = set()
        """Layers whose updated parameters the step has gathered (``overlap_param_gather``)."""
        self.layer_gather_params = 0.0
        """Parameters of one layer's gather (the stage's, less its vocabulary tables, per layer)."""
        self.activation_bytes = self.ops.tokens * self.m.hidden * self.elem

    # --- helpers ---------------------------------------------------------------------
    @property
    def zero3(self) -> bool:
        return self.s.zero >= 3 or self.s.offload is Offload.PARAMS

    def _tp_block(self, name: str, phase: Phase, kernels: tuple[Kernel, ...], deps: tuple[int, ...],
                  backward: bool) -> int:
        """A block (attention or MLP) with its tensor-parallel communication around it."""
        e, s = self.e, self.s
        nbytes = self.activation_bytes
        if s.tp_comm_overlap and s.tp > 1 and s.sequence_parallel:
            gemms = [i for i, k in enumerate(kernels) if k.op_class is OpClass.MATMUL]
            if gemms:
                return self._tp_block_overlapped(name, phase, kernels, deps, gemms[0], gemms[-1])
        if s.tp > 1 and s.sequence_parallel:
            gather = e.collective(f"{name}.tp_all_gather", CollectiveKind.ALL_GATHER, nbytes,
                                  "tp", Stream.TP, deps=deps or e.after_compute())
            deps = deps + (gather,)
        op = e.compute(name, phase, kernels, deps)
        if s.tp > 1:
            kind = CollectiveKind.REDUCE_SCATTER if s.sequence_parallel else CollectiveKind.ALL_REDUCE
            reduce = e.collective(f"{name}.tp_{kind.value}", kind, nbytes, "tp", Stream.TP, (op,))
            return reduce
        return op

    def _tp_block_overlapped(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                             deps: tuple[int, ...], first: int, last: int) -> int:
        """Megatron-Core's ``--tp-comm-overlap`` (Transformer Engine userbuffers): the
        all-gather feeding the block's first GEMM and the reduce-scatter of its last one move
        in tp chunks around the ring while the GEMM works on the chunks already there. Only
        the first gathered chunk and the last reduced one wait; the rest of each collective
        runs beside its GEMM."""
        e, s = self.e, self.s
        nbytes, chunk = self.activation_bytes, self.activation_bytes / s.tp
        gather = e.collective(f"{name}.tp_all_gather.first_chunk", CollectiveKind.ALL_GATHER,
                              chunk, "tp", Stream.TP, deps or e.after_compute())
        streamed = e.collective(f"{name}.tp_all_gather.overlapped", CollectiveKind.ALL_GATHER,
                                nbytes - chunk, "tp", Stream.TP, (gather,))
        op = e.compute(f"{name}.gemm_in", phase, kernels[:first + 1], deps + (gather,))
        if first + 1 < last:
            op = e.compute(name, phase, kernels[first + 1:last], (op, streamed))
        ready = (op, streamed)
        reduced = e.collective(f"{name}.tp_reduce_scatter.overlapped",
                               CollectiveKind.REDUCE_SCATTER, nbytes - chunk, "tp", Stream.TP,
                               ready)
        # The last GEMM (and what follows it in the block) runs beside the reduce-scatter; one
        # GEMM that both gathers and reduces streams its chunks both ways.
        rest = kernels[last:] if first < last else kernels[last + 1:]
        if rest:
            op = e.compute(f"{name}.gemm_out", phase, rest, ready)
        return e.collective(f"{name}.tp_reduce_scatter.last_chunk", CollectiveKind.REDUCE_SCATTER,
                            chunk, "tp", Stream.TP, (op, reduced))

    def _ep_block(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                  deps: tuple[int, ...]) -> int:
        """MoE MLP: dispatch all-to-all, experts, combine all-to-all (for ep > 1)."""
        e, s, m = self.e, self.s, self.m
        if not m.is_moe or s.ep == 1:
            return self._tp_block(name, phase, kernels, deps, phase is Phase.BACKWARD)
        # Each rank dispatches its own tokens (its sequence shard under sequence parallelism).
        routing = TokenRouting(dispatcher=s.ep_dispatcher, tokens=self.ops.norm_tokens,
                               token_bytes=m.hidden * self.elem, top_k=m.top_k,
                               experts=m.num_experts, groups=m.expert_groups,
                               groups_per_token=m.expert_group_limit or m.expert_groups)
        pre = tuple(k for k in kernels if not k.name.startswith("expert"))
        experts = tuple(k for k in kernels if k.name.startswith("expert"))
        first = e.compute(f"{name}.router", phase, pre, deps)
        dispatch = e.collective(f"{name}.ep_dispatch", CollectiveKind.ALL_TO_ALL,
                                routing.payload_bytes, "ep", Stream.EP, (first,), routing=routing)
        mid = e.compute(f"{name}.experts", phase, experts, (dispatch,))
        return e.collective(f"{name}.ep_combine", CollectiveKind.ALL_TO_ALL,
                            routing.payload_bytes, "ep", Stream.EP, (mid,), routing=routing)

    def _attention(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                   deps: tuple[int, ...], backward: bool) -> int:
        """Attention block; with cp > 1 the core runs in cp pieces behind K/V ring exchanges."""
        s, e = self.s, self.e
        if s.cp == 1:
            return self._tp_block(name, phase, kernels, deps, backward)
        core_names = ("flash_attn", "attn_scores", "softmax", "attn_values")
        is_core = [k.name.split(".")[0] in core_names for k in kernels]
        first_core = is_core.index(True)
        last_core = len(is_core) - 1 - is_core[::-1].index(True)
        pre, core, post = kernels[:first_core], kernels[first_core:last_core + 1], kernels[last_core + 1:]
        m = self.m
        block = self.ops.tokens * max(1, m.kv_heads // s.tp) * m.head_dim * self.elem * 2  # K and V
        block *= 2 if backward else 1     # backward also passes dK and dV
        piece = tuple(_scaled(k, 1.0 / s.cp) for k in core)
        start = self._tp_gather_if_sp(name, deps)
        op = e.compute(f"{name}.pre", phase, pre, start) if pre else None
        prev_exchange = None
        ready = (op,) if op is not None else start
        for step in range(s.cp):
            core_deps = ready if step == 0 else (prev_exchange,)
            if step < s.cp - 1:
                prev_exchange = e.collective(f"{name}.cp_ring_{step}", CollectiveKind.RING_EXCHANGE,
                                             block, "cp", Stream.CP,
                                             ready if step == 0 else (prev_exchange,))
            e.compute(f"{name}.core_{step}", phase, piece, core_deps)
        out = e.compute(f"{name}.post", phase, post, e.after_compute())
        if s.tp > 1:
            kind = CollectiveKind.REDUCE_SCATTER if s.sequence_parallel else CollectiveKind.ALL_REDUCE
            return e.collective(f"{name}.tp_{kind.value}", kind, self.activation_bytes, "tp",
                                Stream.TP, (out,))
        return out

    def _tp_gather_if_sp(self, name: str, deps: tuple[int, ...]) -> tuple[int, ...]:
        if self.s.tp > 1 and self.s.sequence_parallel:
            g = self.e.collective(f"{name}.tp_all_gather", CollectiveKind.ALL_GATHER,
                                  self.activation_bytes, "tp", Stream.TP,
                                  deps or self.e.after_compute())
            return deps + (g,)
        return deps

    def _gather_params(self, kind: Pass, micro: int, layer: int, deps: tuple[int, ...]) -> int:
        """ZeRO-3 all-gather of one layer's parameters (deduplicated per pass and layer): one
        collective for the layer, or one per parameter tensor."""
        key = (kind, micro, layer)
        if key not in self.gather_ops:
            name = f"{kind.value}{micro}.layer{layer}.zero3_all_gather"
            if self.s.offload is Offload.PARAMS:
                deps = (self.e.copy(f"{name}.h2d", CopyKind.HOST_TO_DEVICE,
                                    self.layer_param_bytes / (self.s.dp * self.s.cp), deps),)
            if self.s.zero3_granularity is Zero3Granularity.TENSOR:
                # DeepSpeed's per-parameter gather (v0.3.16, partition_parameters.py
                # ``_allgather_param``) calls torch.cuda.synchronize() first: it waits for the
                # gradient reduce-scatters still in flight, not only for the compute stream.
                deps = deps + tuple(self.grad_reduce_ops[-1:])
                for i, size in enumerate(self.tensor_bytes):
                    deps = (self.e.collective(f"{name}.t{i}", CollectiveKind.ALL_GATHER, size,
                                              "dp", Stream.DP, deps, per_rank_copies=True),)
                self.gather_ops[key] = deps[0]
            else:
                self.gather_ops[key] = self.e.collective(
                    name, CollectiveKind.ALL_GATHER, self.layer_param_bytes, "dp", Stream.DP, deps)
        return self.gather_ops[key]

    def _zero3_gather(self, kind: Pass, micro: int, layer: int, layers: list[int]) -> int:
        """Gather ``layer`` (and, with prefetch, the next one) before it computes."""
        gather = self._gather_params(kind, micro, layer, self.e.after_compute())
        pos = layers.index(layer)
        ahead = self.s.zero3_prefetch is Zero3Prefetch.ALL or (
            kind is Pass.BACKWARD and self.s.zero3_prefetch is Zero3Prefetch.BACKWARD)
        if ahead and pos + 1 < len(layers):
            self._gather_params(kind, micro, layers[pos + 1], self.e.after_compute())
        return gather

    # --- a layer -----------------------------------------------------------------------
    def layer_forward(self, micro: int, layer: int, layers: list[int], phase: Phase,
                      deps: tuple[int, ...]) -> int:
        fwd = self.fwd_work
        regather = (phase is Phase.RECOMPUTE
                    and self.s.zero3_granularity is Zero3Granularity.TENSOR)
        if self.zero3 and (phase is Phase.FORWARD or regather):
            kind = Pass.FORWARD if phase is Phase.FORWARD else Pass.RECOMPUTE
            deps = deps + (self._zero3_gather(kind, micro, layer, layers),)
        if phase is Phase.FORWARD and self._gathers_params and self.s.overlap_param_gather:
            deps = deps + self._param_gather(layer)
        tag = f"{'fwd' if phase is Phase.FORWARD else 'recompute'}{micro}.layer{layer}"
        attn = self._attention(f"{tag}.attn", phase, fwd.attention, deps, backward=False)
        return self._ep_block(f"{tag}.mlp", phase, fwd.mlp, (attn,))

    @property
    def _gathers_params(self) -> bool:
        """ZeRO-1/2 with data parallelism: every step all-gathers the updated parameters."""
        return 1 <= self.s.zero <= 2 and self.s.dp * self.s.cp > 1

    def _param_gather(self, layer: int) -> tuple[int, ...]:
        """The all-gather of one layer's updated parameters before its first forward of the
        step (the first one also brings the embedding and LM-head tables). Nothing waits for
        the others, so each one runs while the layers before it compute."""
        if layer in self.param_gathers:
            return ()
        root = len(self._root_tables()) * self.m.vocab * self.m.hidden / self.s.tp
        if not self.param_gathers:
            dense, expert = stage_params(self.m, self.s, self.plan)
            layers = sum(len(chunk) for chunk in self.chunk_layers())
            self.layer_gather_params = (dense + expert - root) / layers
        nbytes = self.layer_gather_params + (0.0 if self.param_gathers else root)
        self.param_gathers.add(layer)
        return (self.e.collective(f"layer{layer}.dp_param_all_gather", CollectiveKind.ALL_GATHER,
                                  nbytes * self.elem, "dp", Stream.DP),)

    def layer_backward(self, micro: int, layer: int, layers: list[int], deps: tuple[int, ...],
                       last_micro: bool) -> int:
        e, s = self.e, self.s
        if self.zero3:
            deps = deps + (self._zero3_gather(Pass.BACKWARD, micro, layer, layers),)
        if s.recomputes(layers.index(layer)):
            deps = (self.layer_forward(micro, layer, layers, Phase.RECOMPUTE, deps),)
        tag = f"bwd{micro}.layer{layer}"
        mlp_kernels = self.bwd_work.mlp
        attn_kernels = self.recompute_work.attention + self.bwd_work.attention \
            if s.recompute is Recompute.SELECTIVE else self.bwd_work.attention
        mlp = self._ep_block(f"{tag}.mlp", Phase.BACKWARD, mlp_kernels, deps)
        attn = self._attention(f"{tag}.attn", Phase.BACKWARD, attn_kernels, (mlp,), backward=True)
        grads_ready = e.last_compute
        if self.zero3 and s.zero3_granularity is Zero3Granularity.TENSOR:
            # One reduce-scatter per parameter from a list of per-rank slices, which PyTorch
            # flattens with one copy per rank (DeepSpeed v0.3.16 ``_reduce_scatter_gradient``).
            for i, size in enumerate(self.tensor_bytes):
                self.grad_reduce_ops.append(e.collective(
                    f"{tag}.zero3_reduce_scatter.t{i}", CollectiveKind.REDUCE_SCATTER, size, "dp",
                    Stream.DP, (grads_ready,), per_rank_copies=True))
        elif self.zero3:
            self.grad_reduce_ops.append(e.collective(
                f"{tag}.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER,
                self.layer_grad_bytes, "dp", Stream.DP, (grads_ready,)))
        elif last_micro and s.dp * s.cp > 1:
            kind = CollectiveKind.ALL_REDUCE if s.zero == 0 else CollectiveKind.REDUCE_SCATTER
            self.grad_reduce_ops.append(e.collective(
                f"{tag}.dp_{kind.value}", kind, self.layer_grad_bytes, "dp", Stream.DP,
                (grads_ready,)))
        return attn

    # --- a chunk pass --------------------------------------------------------------------
    def chunk_layers(self) -> list[list[int]]:
        """Global layer indices of each of this stage's chunks."""
        plans = stage_plans(self.m, self.s)
        sizes = [0] * self.s.chunks
        for p in plans:
            for v, n in enumerate(p.chunk_layers):
                sizes[v * self.s.pp + p.stage] = n
        starts = [sum(sizes[:c]) for c in range(len(sizes))]
        return [list(range(starts[c], starts[c] + sizes[c]))
                for c in range(self.plan.stage, self.s.chunks, self.s.pp)]

    def run(self) -> tuple[Op, ...]:
        s, e = self.s, self.e
        pp, v, stage = s.pp, s.virtual_stages, self.plan.stage
        layers_of = self.chunk_layers()
        last_global = s.chunks - 1
        p2p_bytes = self.activation_bytes / s.tp
        for slot in stage_order(s.schedule, pp, v, self.micro, stage):
            g = slot.chunk * pp + stage      # global chunk index
            layers = layers_of[slot.chunk]
            prev_peer, next_peer = (stage - 1) % pp, (stage + 1) % pp
            if slot.kind is Pass.FORWARD:
                deps: tuple[int, ...] = ()
                if g > 0:
                    deps = (e.recv(f"recv_fwd{slot.micro}.chunk{g}", prev_peer, p2p_bytes,
                                   _tag(_FWD_TAG, slot.micro, g)),)
                if g in (0, last_global):
                    deps += self._gather_root(slot.micro)
                if g == 0:
                    deps = (self._embedding_forward(slot.micro, deps),)
                for layer in layers:
                    deps = (self.layer_forward(slot.micro, layer, layers, Phase.FORWARD, deps),)
                if g == last_global:
                    self._head_forward(slot.micro, deps)
                else:
                    e.send(f"send_fwd{slot.micro}.chunk{g}", next_peer, p2p_bytes,
                           _tag(_FWD_TAG, slot.micro, g + 1), deps)
            else:
                deps = ()
                if g < last_global:
                    deps = (e.recv(f"recv_bwd{slot.micro}.chunk{g}", next_peer, p2p_bytes,
                                   _tag(_BWD_TAG, slot.micro, g)),)
                else:
                    deps = (self._head_backward(slot.micro, deps),)
                last_micro = slot.micro == self.micro - 1
                rev = layers[::-1]
                for layer in rev:
                    deps = (self.layer_backward(slot.micro, layer, rev, deps, last_micro),)
                if g == 0:
                    e.compute(f"bwd{slot.micro}.embedding", Phase.BACKWARD,
                              self.ops.embedding_backward(), deps)
                else:
                    e.send(f"send_bwd{slot.micro}.chunk{g}", prev_peer, p2p_bytes,
                           _tag(_BWD_TAG, slot.micro, g - 1), deps)
                if g in (0, last_global):
                    self._reduce_root(slot.micro)
        self.optimizer()
        return tuple(e.ops)

    # --- embedding and LM head ---------------------------------------------------------------
    def _root_tables(self) -> list[str]:
        """The vocabulary tables this stage holds (embedding, LM head), each vocab x hidden / tp."""
        m, s, plan = self.m, self.s, self.plan
        return ((["embedding"] if plan.has_embedding else [])
                + (["head"] if plan.has_head and not (m.tied_embeddings and s.pp == 1) else []))

    def _root_bytes(self) -> float:
        """ZeRO-3 of the embedding and LM head as FSDP2 shards them (the root unit, which
        ``fully_shard`` keeps unsharded from forward to backward): the bytes gathered once
        before a micro-batch's forward and reduce-scattered after its backward; 0 without."""
        return (len(self._root_tables()) * self.m.vocab * self.m.hidden / self.s.tp * self.elem
                if self.zero3 else 0.0)

    def _gather_root(self, micro: int) -> tuple[int, ...]:
        nbytes = self._root_bytes()
        if not nbytes:
            return ()
        return (self.e.collective(f"fwd{micro}.root.zero3_all_gather", CollectiveKind.ALL_GATHER,
                                  nbytes, "dp", Stream.DP, self.e.after_compute()),)

    def _reduce_root(self, micro: int) -> None:
        nbytes = self._root_bytes()
        if nbytes:
            self.grad_reduce_ops.append(self.e.collective(
                f"bwd{micro}.root.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER, nbytes,
                "dp", Stream.DP, self.e.after_compute()))

    def _tp_reduce(self, name: str, deps: tuple[int, ...]) -> int:
        """The TP reduction of a vocab-parallel layer's output (reduce-scatter under SP)."""
        kind = (CollectiveKind.REDUCE_SCATTER if self.s.sequence_parallel
                else CollectiveKind.ALL_REDUCE)
        return self.e.collective(f"{name}.tp_{kind.value}", kind, self.activation_bytes, "tp",
                                 Stream.TP, deps)

    def _embedding_forward(self, micro: int, deps: tuple[int, ...]) -> int:
        """Vocab-parallel embedding (Megatron): each TP rank looks up its slice of the
        vocabulary, and the partial embeddings are summed over TP."""
        op = self.e.compute(f"fwd{micro}.embedding", Phase.FORWARD, self.ops.embedding_forward(),
                            deps)
        return self._tp_reduce(f"fwd{micro}.embedding", (op,)) if self.s.tp > 1 else op

    def _head_forward(self, micro: int, deps: tuple[int, ...]) -> int:
        """Final norm and vocab-parallel LM head, then the vocab-parallel cross-entropy: three
        all-reduces of one FP32 value per token over TP (max logit, sum of exponentials,
        target logit; Megatron's ``_VocabParallelCrossEntropy``)."""
        e, s = self.e, self.s
        kernels = self.ops.head_forward()
        loss = tuple(k for k in kernels if k.name == "cross_entropy")
        logits = tuple(k for k in kernels if k.name != "cross_entropy")
        if s.tp == 1:
            return e.compute(f"fwd{micro}.head", Phase.FORWARD, kernels, deps)
        deps = self._tp_gather_if_sp(f"fwd{micro}.head", deps)
        last = e.compute(f"fwd{micro}.head", Phase.FORWARD, logits, deps)
        for step in ("max", "sum_exp", "target"):
            last = e.collective(f"fwd{micro}.cross_entropy_{step}.tp_all_reduce",
                                CollectiveKind.ALL_REDUCE, self.ops.tokens * 4.0, "tp",
                                Stream.TP, (last,))
        return e.compute(f"fwd{micro}.loss", Phase.FORWARD, loss, (last,))

    def _head_backward(self, micro: int, deps: tuple[int, ...]) -> int:
        """LM head gradient; its input gradient is a partial sum over the vocabulary slices."""
        op = self.e.compute(f"bwd{micro}.head", Phase.BACKWARD, self.ops.head_backward(), deps)
        return self._tp_reduce(f"bwd{micro}.head", (op,)) if self.s.tp > 1 else op

    def optimizer(self) -> None:
        e, s, m = self.e, self.s, self.m
        deps = tuple(self.grad_reduce_ops) + e.after_compute()
        if s.dp * s.cp > 1 and not self.zero3:
            # The embedding and LM-head gradients join the data-parallel reduction too.
            table = (m.vocab * m.hidden / s.tp) * self.elem
            kind = CollectiveKind.ALL_REDUCE if s.zero == 0 else CollectiveKind.REDUCE_SCATTER
            for part in self._root_tables():
                deps += (e.collective(f"{part}_grad.dp_{kind.value}", kind, table, "dp",
                                      Stream.DP, e.after_compute()),)
        if m.tied_embeddings and s.pp > 1 and (self.plan.has_embedding or self.plan.has_head):
            table = m.vocab * m.hidden / s.tp * self.elem
            deps += (e.collective("embedding_grad_all_reduce", CollectiveKind.ALL_REDUCE, table,
                                  "embedding", Stream.DP, e.after_compute()),)
        dense, expert = stage_params(m, s, self.plan)
        shard = (s.dp * s.cp) if s.zero >= 1 else 1
        local = dense / shard + expert / max(1, (s.dp * s.cp // s.ep) if s.zero >= 1 else 1)
        if s.offload is Offload.NONE:
            step = e.compute("optimizer_step", Phase.OPTIMIZER, self.ops.optimizer_step(local), deps)
        else:
            grads = e.copy("grads_d2h", CopyKind.DEVICE_TO_HOST, local * self.elem, deps)
            host = e.copy("host_adam", CopyKind.HOST_COMPUTE,
                          self.ops.optimizer_step(local)[0].bytes, (grads,))
            step = e.copy("params_h2d", CopyKind.HOST_TO_DEVICE, local * 2.0, (host,))
        if self._gathers_params and not s.overlap_param_gather:
            e.collective("dp_param_all_gather", CollectiveKind.ALL_GATHER,
                         (dense + expert) * self.elem, "dp", Stream.DP, (step,))


def _tag(kind: int, micro: int, chunk: int) -> int:
    return (micro * 1_000_003 + chunk) * 2 + kind


def _scaled(k: Kernel, factor: float) -> Kernel:
    return replace(k, flops=k.flops * factor, bytes=k.bytes * factor)


def group_sets(layout: ParallelLayout, ep: int, tied_pp_embedding: bool) -> dict[str, GroupSet]:
    """Rank partitions for every axis the trace uses. ``dp`` is the gradient-reduction group
    (data x context parallel ranks holding the same parameters)."""
    ranks = np.arange(layout.world_size)
    tp, cp, dp, pp = (layout.tp, layout.cp, layout.dp, layout.pp)
    grid = ranks.reshape(pp, dp, cp, tp)   # rank = tp + TP * (cp + CP * (dp + DP * pp))

    def groups(array: np.ndarray) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(r) for r in row) for row in array)

    sets = {
        "tp": groups(grid.reshape(-1, tp)),
        "cp": groups(grid.transpose(0, 1, 3, 2).reshape(-1, cp)),
        "pp": groups(grid.transpose(1, 2, 3, 0).reshape(-1, pp)),
        # data x context ranks of one (pp, tp) position: they hold the same parameters
        "dp": groups(grid.transpose(0, 3, 1, 2).reshape(-1, dp * cp)),
    }
    if ep > 1:
        # expert-parallel groups: consecutive blocks of ep ranks within each dp x cp group
        sets["ep"] = groups(grid.transpose(0, 3, 1, 2).reshape(-1, ep))
    if tied_pp_embedding:
        sets["embedding"] = groups(grid[[0, pp - 1]].transpose(1, 2, 3, 0).reshape(-1, 2))
    return {name: GroupSet(name, g) for name, g in sets.items()}


def build_trace(job: Job) -> Trace:
    """The step's trace: one program per pipeline stage."""
    s, m = job.strategy, job.model
    if s.world_size < 1:
        raise SpecError("strategy", "empty world")
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)
    programs = []
    per_stage = layout.world_size // s.pp
    for plan in stage_plans(m, s):
        ranks = tuple(range(plan.stage * per_stage, (plan.stage + 1) * per_stage))
        ops = _StageBuilder(job, plan).run()
        mem = stage_memory(m, job.training, s, plan).memory
        static = mem.weights + mem.gradients + mem.optimizer + mem.comm_buffers
        programs.append(Program(f"stage{plan.stage}", ranks, ops,
                                static_memory_bytes=static, peak_memory_bytes=mem.total))
    trace = Trace(
        world_size=layout.world_size,
        programs=tuple(programs),
        group_sets=group_sets(layout, s.ep, m.tied_embeddings and s.pp > 1),
        model_flops=job.model_flops_per_step,
        tokens=float(job.training.tokens_per_step),
        meta={"model": m.name, "strategy": s.to_dict(), "training": job.training.to_dict(),
              "peak_dtype": job.training.precision.gemm_dtype.value},
    )
    return validate(trace)

"""Data parallelism and ZeRO (Rajbhandari et al. SC'20): gradient reductions, parameter
gathers, the optimizer step and its offload.

- ZeRO-0: gradients all-reduced per layer bucket during the last micro-batch's backward.
- ZeRO-1/2: the same buckets reduce-scattered; after the optimizer step the updated parameters
  are all-gathered (with ``overlap_param_gather``, Megatron-Core's distributed optimizer, layer
  by layer before each layer's first forward of the next step).
- ZeRO-3 (FSDP): each layer's parameters all-gathered before its forward and its backward (one
  layer prefetched) and its gradients reduce-scattered every micro-batch; the embedding and LM
  head form the root unit, gathered once per micro-batch. Per-tensor granularity is DeepSpeed's
  2020-21 ZeRO-3: one gather and one reduce-scatter per parameter tensor.
- FSDP under pipeline parallelism (torchtitan): each layer gathered once per step, at the
  stage's first forward, kept through every micro-batch, its gradients reduce-scattered in the
  last micro-batch's backward (``Strategy.fsdp_keeps_gathered``).
- FP8 weights (``training.fp8_param_gather``: Megatron's ``--fp8-param-gather``, FSDP2's float8
  all-gather) are gathered in 1 byte, NVFP4 weights (``fp4_param_gather``) in 0.5 + 1/16; the
  vocabulary tables and gradients stay 16-bit. MXFP8 weights under the distributed optimizer
  are gathered in BF16 (``fp8.gathered_weight_bytes``).
- FP32 gradient reduction (``training.fp32_grad_reduce``: torchtitan's FSDP2 mixed-precision
  policy, ``reduce_dtype=float32``): every gradient reduction carries 4 bytes per element.
- Offload (ZeRO-Offload, ZeRO-Infinity): gradients to the host, the Adam step there, parameters
  back; offloaded parameters also come from the host before each gather.

What is gathered and reduced, over which ranks, is ``workloads/shards.py``'s: dense and
vocabulary parameters over the data x context-parallel ranks (``dp``), routed experts over the
ranks holding the same experts (``edp``) when expert parallelism splits them. A shard whose
group is one rank moves nothing and is left out. Under HSDP the shard group is ``dp_shard``
and each gradient reduction is followed by an all-reduce of the reduced shard across the
replica groups (``dp_replicate``; FSDP2's HSDP ``post_backward``: reduce-scatter, then
all-reduce of the shard), also when the shard group is one rank (DDP's all-reduce).
"""

from __future__ import annotations

from clustersim.workloads.axes import (
    DP_REPLICATE_GROUP, SUBNETWORK_DATA_GROUP, TIED_EMBEDDING_GROUP, Axis,
)
from clustersim.workloads.fp8 import gathered_weight_bytes
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.shards import ParamKind, Shard, stage_shards
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategy import Offload, Zero3Granularity, Zero3Prefetch
from clustersim.workloads.trace import CollectiveKind, CopyKind, Phase


class DataParallel:
    """Emits a stage's data-parallel communication and its optimizer step."""

    def __init__(self, stage: StageProgram):
        self.stage = stage
        s = stage.strategy
        self.zero3 = s.zero >= 3 or s.offload is Offload.PARAMS
        self.per_tensor = self.zero3 and s.zero3_granularity is Zero3Granularity.TENSOR
        self.keeps_gathered = s.fsdp_keeps_gathered
        self.last_micro = stage.job.micro_batches - 1
        self.gemm_bytes = gathered_weight_bytes(stage.job.training, s)
        """Bytes of a weight gathered in the GEMM format (1 for FP8, 0.5 + 1/16 for NVFP4), or
        None where weights are gathered in the compute dtype."""
        self.fp32_grads = stage.job.training.fp32_grad_reduce
        self.shards = stage_shards(stage.model, s, stage.plan)
        self.gathers_updated = 1 <= s.zero <= 2 and any(
            shard.ranks > 1 for shard in self.shards.by_group().values())
        """ZeRO-1/2 with parameters shared by several ranks: every step all-gathers the
        updated parameters."""
        self.root_parts = tuple((name, part) for name, part in (
            ("embedding", self.shards.embedding), ("head", self.shards.head)) if part)
        """This stage's vocabulary-side parameters (embedding, LM head), by part."""
        self.grad_reductions: list[int] = []
        """Gradient reductions issued so far (the optimizer waits for them all)."""
        self._gathers: dict[tuple[Pass, int, int], tuple[int, ...]] = {}
        self._updated: set[int] = set()

    def _collectives(self, name: str, kind: CollectiveKind, shards: tuple[Shard, ...],
                     deps: tuple[int, ...], per_rank_copies: bool = False,
                     weights: bool = False) -> tuple[int, ...]:
        """One collective per group of ranks that hold ``shards`` (their parameters summed, in
        the compute dtype, or FP8 for gathered ``weights`` of layers with ``fp8_param_gather``;
        the experts' one named ``.experts``), none over a group of one."""
        groups: dict[str, tuple[Shard, float]] = {}
        for shard in shards:
            low = weights and self.gemm_bytes is not None and shard.kind is not ParamKind.VOCAB
            nbytes = shard.params * (self.gemm_bytes if low else self.stage.element_bytes)
            if kind is not CollectiveKind.ALL_GATHER and self.fp32_grads:
                nbytes = shard.params * 4.0    # FSDP2's FP32 reduce dtype
            seen = groups.get(shard.group)
            groups[shard.group] = (shard, nbytes) if seen is None else (seen[0], seen[1] + nbytes)
        out = []
        for group, (shard, nbytes) in groups.items():
            suffix = (".blocks" if group == SUBNETWORK_DATA_GROUP else ".experts"
                      if shard.kind is ParamKind.EXPERT and group != Axis.DP.value else "")
            reduced = deps
            if shard.ranks > 1:
                reduced = (self.stage.ops.collective(
                    f"{name}{suffix}", kind, nbytes, Axis.DP, deps, group=group,
                    per_rank_copies=per_rank_copies),)
            if kind is not CollectiveKind.ALL_GATHER and shard.replicas > 1:
                # HSDP: the reduced gradient shard, all-reduced across the replica groups.
                reduced = (self.stage.ops.collective(
                    f"{name}{suffix}.replicate_all_reduce", CollectiveKind.ALL_REDUCE,
                    nbytes / shard.ranks, Axis.DP, reduced, group=DP_REPLICATE_GROUP),)
            out += reduced if reduced != deps else ()
        return tuple(out)

    # --- ZeRO-3 --------------------------------------------------------------------------
    def before_forward(self, phase: Phase, micro: int, layer: int, layers: list[int]
                       ) -> tuple[int, ...]:
        """Gathers a layer's forward (or recompute) waits for."""
        out: tuple[int, ...] = ()
        regather = phase is Phase.RECOMPUTE and self.per_tensor
        if self.zero3 and (phase is Phase.FORWARD or regather):
            kind = Pass.FORWARD if phase is Phase.FORWARD else Pass.RECOMPUTE
            # Kept gathered: every micro-batch waits for the first one's gather.
            out += self._gather_ahead(kind, 0 if self.keeps_gathered else micro, layer, layers)
        if (phase is Phase.FORWARD and self.gathers_updated
                and self.stage.strategy.overlap_param_gather):
            out += self._gather_updated(layer)
        return out

    def before_backward(self, micro: int, layer: int, layers: list[int]) -> tuple[int, ...]:
        """Gathers a layer's backward waits for."""
        if not self.zero3 or self.keeps_gathered:
            return ()
        return self._gather_ahead(Pass.BACKWARD, micro, layer, layers)

    def _gather_ahead(self, kind: Pass, micro: int, layer: int, layers: list[int]
                      ) -> tuple[int, ...]:
        """Gather ``layer`` (and, with prefetch, the next one) before it computes."""
        ops, prefetch = self.stage.ops, self.stage.strategy.zero3_prefetch
        gather = self._gather(kind, micro, layer, ops.after_compute())
        position = layers.index(layer)
        ahead = prefetch is Zero3Prefetch.ALL or (
            kind is Pass.BACKWARD and prefetch is Zero3Prefetch.BACKWARD)
        if ahead and position + 1 < len(layers):
            self._gather(kind, micro, layers[position + 1], ops.after_compute())
        return gather

    def _gather(self, kind: Pass, micro: int, layer: int, deps: tuple[int, ...]
                ) -> tuple[int, ...]:
        """ZeRO-3 all-gather of one layer's parameters (deduplicated per pass and layer): one
        collective for the layer (per group of ranks), or one per parameter tensor."""
        key = (kind, micro, layer)
        if key in self._gathers:
            return self._gathers[key]
        ops, s = self.stage.ops, self.stage.strategy
        name = f"{kind.value}{micro}.layer{layer}.zero3_all_gather"
        layer_shards = self.shards.layers[layer]
        if s.offload is Offload.PARAMS:
            kept = sum(shard.resident(True) for shard in layer_shards)
            deps = (ops.copy(f"{name}.h2d", CopyKind.HOST_TO_DEVICE,
                             kept * self.stage.element_bytes, deps),)
        if self.per_tensor:
            # DeepSpeed's per-parameter gather (v0.3.16, partition_parameters.py
            # ``_allgather_param``) calls torch.cuda.synchronize() first: it waits for the
            # gradient reduce-scatters still in flight, not only for the compute stream.
            deps = deps + tuple(self.grad_reductions[-1:])
            for i, tensor in enumerate(self.shards.tensors[layer]):
                deps = self._collectives(f"{name}.t{i}", CollectiveKind.ALL_GATHER, (tensor,),
                                         deps, per_rank_copies=True, weights=True) or deps
            gathered = deps
        else:
            gathered = self._collectives(name, CollectiveKind.ALL_GATHER, layer_shards, deps,
                                         weights=True)
        self._gathers[key] = gathered or (deps if s.offload is Offload.PARAMS else ())
        return self._gathers[key]

    def _root_gathered(self) -> tuple[Shard, ...]:
        """ZeRO-3 of the embedding and LM head as FSDP2 shards them (the root unit, which
        ``fully_shard`` keeps unsharded from forward to backward): gathered once before a
        micro-batch's forward and reduce-scattered after its backward; nothing without."""
        root = self.shards.root
        return (root,) if self.zero3 and root else ()

    def gather_root(self, micro: int) -> tuple[int, ...]:
        if self.keeps_gathered and micro > 0:
            return ()
        return self._collectives(f"fwd{micro}.root.zero3_all_gather", CollectiveKind.ALL_GATHER,
                                 self._root_gathered(), self.stage.ops.after_compute())

    def reduce_root(self, micro: int) -> None:
        if self.keeps_gathered and micro != self.last_micro:
            return
        self.grad_reductions += self._collectives(
            f"bwd{micro}.root.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER,
            self._root_gathered(), self.stage.ops.after_compute())

    # --- ZeRO-1/2 with overlap_param_gather --------------------------------------------------
    def _gather_updated(self, layer: int) -> tuple[int, ...]:
        """The all-gather of one layer's updated parameters before its first forward of the
        step (the first one also brings the embedding and LM-head tables). Nothing waits for
        the others, so each one runs while the layers before it compute."""
        if layer in self._updated:
            return ()
        shards = self.shards.layers[layer]
        if not self._updated and self.shards.root:
            shards += (self.shards.root,)
        self._updated.add(layer)
        return self._collectives(f"layer{layer}.dp_param_all_gather", CollectiveKind.ALL_GATHER,
                                 shards, (), weights=True)

    # --- gradients -------------------------------------------------------------------------
    def reduce_gradients(self, tag: str, layer: int, last_micro: bool) -> None:
        """A layer's gradient reduction once its backward is done: every micro-batch under
        ZeRO-3, else in the last micro-batch's backward (gradient accumulation before)."""
        ready = (self.stage.ops.last_compute,)
        if self.per_tensor:
            # One reduce-scatter per parameter from a list of per-rank slices, which PyTorch
            # flattens with one copy per rank (DeepSpeed v0.3.16 ``_reduce_scatter_gradient``).
            for i, tensor in enumerate(self.shards.tensors[layer]):
                self.grad_reductions += self._collectives(
                    f"{tag}.zero3_reduce_scatter.t{i}", CollectiveKind.REDUCE_SCATTER, (tensor,),
                    ready, per_rank_copies=True)
        elif self.zero3 and not self.keeps_gathered:
            self.grad_reductions += self._collectives(
                f"{tag}.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER,
                self.shards.layers[layer], ready)
        elif last_micro:
            kind = self._reduce_kind()
            self.grad_reductions += self._collectives(f"{tag}.dp_{kind.value}", kind,
                                                      self.shards.layers[layer], ready)

    def _reduce_kind(self) -> CollectiveKind:
        """All-reduce without ZeRO; reduce-scatter when the optimizer state is sharded."""
        return (CollectiveKind.ALL_REDUCE if self.stage.strategy.zero == 0
                else CollectiveKind.REDUCE_SCATTER)

    # --- the optimizer step ------------------------------------------------------------------
    def optimizer_step(self) -> None:
        """The embedding and LM-head gradient reductions, the Adam step on this rank's share
        (on the host with offload), and ZeRO-1/2's all-gather of the updated parameters."""
        stage, ops = self.stage, self.stage.ops
        s, m, plan, elem = stage.strategy, stage.model, stage.plan, stage.element_bytes
        deps = tuple(self.grad_reductions) + ops.after_compute()
        if not self.zero3:
            # The embedding and LM-head gradients join the data-parallel reduction too.
            kind = self._reduce_kind()
            for part, shard in self.root_parts:
                deps += self._collectives(f"{part}_grad.dp_{kind.value}", kind, (shard,),
                                          ops.after_compute())
        if m.tied_embeddings and s.pp > 1 and (plan.has_embedding or plan.has_head):
            deps += (ops.collective("embedding_grad_all_reduce", CollectiveKind.ALL_REDUCE,
                                    self.shards.table_params * elem, Axis.DP,
                                    ops.after_compute(), group=TIED_EMBEDDING_GROUP),)
        held = tuple(self.shards.by_group().values())
        local = sum(shard.resident(s.zero >= 1) for shard in held)
        adam = stage.kernels.optimizer_step(local)
        if s.offload is Offload.NONE:
            step = ops.compute("optimizer_step", Phase.OPTIMIZER, adam, deps)
        else:
            grads = ops.copy("grads_d2h", CopyKind.DEVICE_TO_HOST, local * elem, deps)
            host = ops.copy("host_adam", CopyKind.HOST_COMPUTE, adam[0].bytes, (grads,))
            step = ops.copy("params_h2d", CopyKind.HOST_TO_DEVICE, local * 2.0, (host,))
        if self.gathers_updated and not s.overlap_param_gather:
            self._collectives("dp_param_all_gather", CollectiveKind.ALL_GATHER, held, (step,),
                              weights=True)

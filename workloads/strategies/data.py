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
- Offload (ZeRO-Offload, ZeRO-Infinity): gradients to the host, the Adam step there, parameters
  back; offloaded parameters also come from the host before each gather.
"""

from __future__ import annotations

from clustersim.workloads.axes import TIED_EMBEDDING_GROUP, Axis
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.memory import stage_params
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategy import Offload, Zero3Granularity, Zero3Prefetch
from clustersim.workloads.trace import CollectiveKind, CopyKind, Phase


class DataParallel:
    """Emits a stage's data-parallel communication and its optimizer step."""

    def __init__(self, stage: StageProgram):
        self.stage = stage
        s, m = stage.strategy, stage.model
        self.replicas = s.dp * s.cp
        """Ranks that hold the same parameters (data x context parallel)."""
        self.zero3 = s.zero >= 3 or s.offload is Offload.PARAMS
        self.per_tensor = self.zero3 and s.zero3_granularity is Zero3Granularity.TENSOR
        self.gathers_updated = 1 <= s.zero <= 2 and self.replicas > 1
        """ZeRO-1/2 with data parallelism: every step all-gathers the updated parameters."""
        self.grad_reductions: list[int] = []
        """Gradient reductions issued so far (the optimizer waits for them all)."""
        self._gathers: dict[tuple[Pass, int, int], int] = {}
        self._updated: set[int] = set()
        elem = stage.element_bytes
        layer_local = m.layer_params / s.tp
        # Parameters are gathered in the compute dtype: 16-bit, or FP32 in FP32 training.
        self.layer_bytes = layer_local * elem
        self.tensor_bytes = tuple(elem * (n if n <= m.hidden * 2 else n / s.tp)
                                  for n in m.layer_tensors())
        self.root_tables = ((["embedding"] if stage.plan.has_embedding else [])
                            + (["head"] if stage.plan.has_head
                               and not (m.tied_embeddings and s.pp == 1) else []))
        """The vocabulary tables this stage holds (embedding, LM head)."""
        self.table_params = m.vocab * m.hidden / s.tp
        self._updated_layer_params = 0.0

    # --- ZeRO-3 --------------------------------------------------------------------------
    def before_forward(self, phase: Phase, micro: int, layer: int, layers: list[int]
                       ) -> tuple[int, ...]:
        """Gathers a layer's forward (or recompute) waits for."""
        out: tuple[int, ...] = ()
        regather = phase is Phase.RECOMPUTE and self.per_tensor
        if self.zero3 and (phase is Phase.FORWARD or regather):
            kind = Pass.FORWARD if phase is Phase.FORWARD else Pass.RECOMPUTE
            out += (self._gather_ahead(kind, micro, layer, layers),)
        if (phase is Phase.FORWARD and self.gathers_updated
                and self.stage.strategy.overlap_param_gather):
            out += self._gather_updated(layer)
        return out

    def before_backward(self, micro: int, layer: int, layers: list[int]) -> tuple[int, ...]:
        """Gathers a layer's backward waits for."""
        return (self._gather_ahead(Pass.BACKWARD, micro, layer, layers),) if self.zero3 else ()

    def _gather_ahead(self, kind: Pass, micro: int, layer: int, layers: list[int]) -> int:
        """Gather ``layer`` (and, with prefetch, the next one) before it computes."""
        ops, prefetch = self.stage.ops, self.stage.strategy.zero3_prefetch
        gather = self._gather(kind, micro, layer, ops.after_compute())
        position = layers.index(layer)
        ahead = prefetch is Zero3Prefetch.ALL or (
            kind is Pass.BACKWARD and prefetch is Zero3Prefetch.BACKWARD)
        if ahead and position + 1 < len(layers):
            self._gather(kind, micro, layers[position + 1], ops.after_compute())
        return gather

    def _gather(self, kind: Pass, micro: int, layer: int, deps: tuple[int, ...]) -> int:
        """ZeRO-3 all-gather of one layer's parameters (deduplicated per pass and layer): one
        collective for the layer, or one per parameter tensor."""
        key = (kind, micro, layer)
        if key in self._gathers:
            return self._gathers[key]
        ops, s = self.stage.ops, self.stage.strategy
        name = f"{kind.value}{micro}.layer{layer}.zero3_all_gather"
        if s.offload is Offload.PARAMS:
            deps = (ops.copy(f"{name}.h2d", CopyKind.HOST_TO_DEVICE,
                             self.layer_bytes / self.replicas, deps),)
        if self.per_tensor:
            # DeepSpeed's per-parameter gather (v0.3.16, partition_parameters.py
            # ``_allgather_param``) calls torch.cuda.synchronize() first: it waits for the
            # gradient reduce-scatters still in flight, not only for the compute stream.
            deps = deps + tuple(self.grad_reductions[-1:])
            for i, size in enumerate(self.tensor_bytes):
                deps = (ops.collective(f"{name}.t{i}", CollectiveKind.ALL_GATHER, size, Axis.DP,
                                       deps, per_rank_copies=True),)
            self._gathers[key] = deps[0]
        else:
            self._gathers[key] = ops.collective(name, CollectiveKind.ALL_GATHER,
                                                self.layer_bytes, Axis.DP, deps)
        return self._gathers[key]

    def _root_bytes(self) -> float:
        """ZeRO-3 of the embedding and LM head as FSDP2 shards them (the root unit, which
        ``fully_shard`` keeps unsharded from forward to backward): the bytes gathered once
        before a micro-batch's forward and reduce-scattered after its backward; 0 without."""
        if not self.zero3:
            return 0.0
        return len(self.root_tables) * self.table_params * self.stage.element_bytes

    def gather_root(self, micro: int) -> tuple[int, ...]:
        nbytes, ops = self._root_bytes(), self.stage.ops
        if not nbytes:
            return ()
        return (ops.collective(f"fwd{micro}.root.zero3_all_gather", CollectiveKind.ALL_GATHER,
                               nbytes, Axis.DP, ops.after_compute()),)

    def reduce_root(self, micro: int) -> None:
        nbytes, ops = self._root_bytes(), self.stage.ops
        if nbytes:
            self.grad_reductions.append(ops.collective(
                f"bwd{micro}.root.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER, nbytes,
                Axis.DP, ops.after_compute()))

    # --- ZeRO-1/2 with overlap_param_gather --------------------------------------------------
    def _gather_updated(self, layer: int) -> tuple[int, ...]:
        """The all-gather of one layer's updated parameters before its first forward of the
        step (the first one also brings the embedding and LM-head tables). Nothing waits for
        the others, so each one runs while the layers before it compute."""
        if layer in self._updated:
            return ()
        root = len(self.root_tables) * self.table_params
        if not self._updated:
            dense, expert = stage_params(self.stage.model, self.stage.strategy, self.stage.plan)
            self._updated_layer_params = (dense + expert - root) / self.stage.plan.layers
        params = self._updated_layer_params + (0.0 if self._updated else root)
        self._updated.add(layer)
        return (self.stage.ops.collective(f"layer{layer}.dp_param_all_gather",
                                          CollectiveKind.ALL_GATHER,
                                          params * self.stage.element_bytes, Axis.DP),)

    # --- gradients -------------------------------------------------------------------------
    def reduce_gradients(self, tag: str, last_micro: bool) -> None:
        """A layer's gradient reduction once its backward is done: every micro-batch under
        ZeRO-3, else in the last micro-batch's backward (gradient accumulation before)."""
        ops = self.stage.ops
        ready = (ops.last_compute,)
        if self.per_tensor:
            # One reduce-scatter per parameter from a list of per-rank slices, which PyTorch
            # flattens with one copy per rank (DeepSpeed v0.3.16 ``_reduce_scatter_gradient``).
            for i, size in enumerate(self.tensor_bytes):
                self.grad_reductions.append(ops.collective(
                    f"{tag}.zero3_reduce_scatter.t{i}", CollectiveKind.REDUCE_SCATTER, size,
                    Axis.DP, ready, per_rank_copies=True))
        elif self.zero3:
            self.grad_reductions.append(ops.collective(
                f"{tag}.zero3_reduce_scatter", CollectiveKind.REDUCE_SCATTER, self.layer_bytes,
                Axis.DP, ready))
        elif last_micro and self.replicas > 1:
            kind = self._reduce_kind()
            self.grad_reductions.append(ops.collective(
                f"{tag}.dp_{kind.value}", kind, self.layer_bytes, Axis.DP, ready))

    def _reduce_kind(self) -> CollectiveKind:
        """All-reduce without ZeRO; reduce-scatter when the optimizer state is sharded."""
        return (CollectiveKind.ALL_REDUCE if self.stage.strategy.zero == 0
                else CollectiveKind.REDUCE_SCATTER)

    # --- the optimizer step ------------------------------------------------------------------
    def optimizer_step(self) -> None:
        """The vocabulary tables' gradient reductions, the Adam step on this rank's share
        (on the host with offload), and ZeRO-1/2's all-gather of the updated parameters."""
        stage, ops = self.stage, self.stage.ops
        s, m, plan, elem = stage.strategy, stage.model, stage.plan, stage.element_bytes
        deps = tuple(self.grad_reductions) + ops.after_compute()
        if self.replicas > 1 and not self.zero3:
            # The embedding and LM-head gradients join the data-parallel reduction too.
            kind = self._reduce_kind()
            for part in self.root_tables:
                deps += (ops.collective(f"{part}_grad.dp_{kind.value}", kind,
                                        self.table_params * elem, Axis.DP, ops.after_compute()),)
        if m.tied_embeddings and s.pp > 1 and (plan.has_embedding or plan.has_head):
            deps += (ops.collective("embedding_grad_all_reduce", CollectiveKind.ALL_REDUCE,
                                    self.table_params * elem, Axis.DP, ops.after_compute(),
                                    group=TIED_EMBEDDING_GROUP),)
        dense, expert = stage_params(m, s, plan)
        shard = self.replicas if s.zero >= 1 else 1
        local = dense / shard + expert / max(1, s.expert_dp if s.zero >= 1 else 1)
        adam = stage.kernels.optimizer_step(local)
        if s.offload is Offload.NONE:
            step = ops.compute("optimizer_step", Phase.OPTIMIZER, adam, deps)
        else:
            grads = ops.copy("grads_d2h", CopyKind.DEVICE_TO_HOST, local * elem, deps)
            host = ops.copy("host_adam", CopyKind.HOST_COMPUTE, adam[0].bytes, (grads,))
            step = ops.copy("params_h2d", CopyKind.HOST_TO_DEVICE, local * 2.0, (host,))
        if self.gathers_updated and not s.overlap_param_gather:
            ops.collective("dp_param_all_gather", CollectiveKind.ALL_GATHER,
                           (dense + expert) * elem, Axis.DP, (step,))

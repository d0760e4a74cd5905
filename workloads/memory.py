"""Memory per device of every pipeline stage: model state, activations, buffers, reserve.

Sources:
- Model state of mixed-precision Adam: 2 (16-bit weights) + 2 (16-bit gradients) + 12 (FP32
  master weights, momentum, variance) bytes per parameter, ZeRO stages 1/2/3 shard the last,
  the last two, and all three terms over the data-parallel group (Rajbhandari et al. SC'20,
  sec. 3 and Fig. 1). FP32 training keeps 4 + 4 + 8.
- Activations per layer per micro-batch: Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models", arXiv 2205.05198), sec. 4 and Table 2:
  s b h (34 + 5 a s / h) bytes with no parallelism, split by t with tensor (and sequence)
  parallelism, s b h (34 / t) with sequence parallelism and selective recompute, 2 s b h with
  full recompute. The function below derives those terms from the layer's tensors, so GQA,
  gated MLPs, missing dropout, fused attention and context parallelism change them the right way.
- In-flight micro-batches: 1F1B keeps pp - i on stage i, GPipe all m, the interleaved schedule
  multiplies stage 0's by (1 + (pp - 1) / (pp v)) (Korthikanti sec. 4.2.3; Megatron-LM's
  ``get_num_warmup_microbatches``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from clustersim.workloads.model import Mlp, TransformerSpec
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.strategy import (
    Offload, Recompute, Schedule, Strategy, Zero3Granularity, micro_batches,
)
from clustersim.workloads.training import AttentionKernel, TrainingSpec

GIB = 2.0**30

CONTEXT_RESERVE_BYTES = 1.0 * GIB
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL's own state: PyTorch's CUDA-semantics notes
put the context alone at several hundred MB; 1 GiB in all is the usual rule of thumb."""
FRAGMENTATION = 0.05
"""Caching-allocator slack on top of live tensors (fraction of the rest)."""
NCCL_BUFFER_BYTES = 4 * 2**20 * 2 * 8
"""Per communicator in use: NCCL_BUFFSIZE (4 MiB default, NCCL docs) x send/recv x 8 channels."""


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    comm_buffers: float
    reserve: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def to_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total"] = self.total
        return out


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    layers: int
    memory: MemoryBreakdown
    offloaded_bytes: float
    """State this device keeps in the offload tier (host DRAM by default)."""


def layer_activation_bytes(model: TransformerSpec, training: TrainingSpec,
                           strategy: Strategy, layer: int | None = None) -> float:
    """Stored activations of one layer, one micro-batch, one device (Korthikanti et al. 2022).

    With MHA, a GeLU MLP of 4h, dropout, unfused attention and no recompute this is exactly
    s b h (10 + 24/t + 5 a s/(h t)), or s b h (34/t + 5 a s/(h t)) with sequence parallelism.
    ``layer`` picks the layer where they differ (None: the last). MLA keeps its query and
    key/value latents (replicated, as its down-projections are), Q and K of head_dim and V of
    v_head_dim per head; a MoE layer keeps each routed copy of a token as its expert's input,
    the experts' (top_k of them) and shared experts' intermediates.
    """
    m, t, st = model, training, strategy
    if st.recompute is Recompute.FULL:
        # Only the layer input, sharded by sequence parallelism when it is on.
        return 2.0 * _sbh(m, t, st) / (st.tp if st.sequence_parallel else 1)
    i = m.layers - 1 if layer is None else layer
    tp, sp = st.tp, st.sequence_parallel
    e = t.precision.activation_bytes
    sbh = _sbh(m, t, st)                       # s b h on this device's sequence shard
    per = sbh / m.hidden                       # s b
    mask = 1.0 if m.dropout else 0.0           # dropout masks: 1 byte per element
    moe = m.is_moe_layer(i)
    ffn = (m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn) if moe else m.ffn_hidden
    # Kept whole on each TP rank unless sequence parallelism splits them: the inputs of the two
    # norms, of the QKV GEMM and of fc1 (or the router), and the two dropout masks.
    replicated = (4 * e + 2 * mask) * sbh
    # Split over TP:
    split = (e * per * (m.q_dim + m.kv_dim)    # Q and K for QK^T
             + e * per * m.v_dim               # V
             + e * per * m.attn_out_dim)       # attention-projection input
    split += e * per * ffn * (3 if m.mlp is Mlp.SWIGLU else 2)   # gate/up outputs, fc2 input
    whole = 0.0
    if m.is_mla:   # latents in and out of their norms, on every TP rank
        whole += 2 * e * per * (m.q_lora_rank + m.kv_lora_rank)
    if moe:        # each token's copy for each of its experts (expert TP keeps rows whole)
        whole += e * per * m.top_k * m.hidden
    core = 0.0
    if t.attention is AttentionKernel.STANDARD and st.recompute is Recompute.NONE:
        scores = per * m.heads * t.seq_len    # b a s_local s
        core = scores * (e + (mask + e if m.dropout else 0.0))  # softmax out, mask, dropout out
    elif t.attention.fused:
        core = 4.0 * per * m.heads            # FP32 log-sum-exp per query and head
    return replicated / (tp if sp else 1) + whole + (split + core) / tp


def _sbh(model: TransformerSpec, training: TrainingSpec, strategy: Strategy) -> float:
    return training.micro_batch * (training.seq_len / strategy.cp) * model.hidden


def inflight_layer_sets(plan: StagePlan, strategy: Strategy, micro: int) -> float:
    """Layer-micro-batch activation sets stage ``plan.stage`` holds at its peak."""
    pp, v, i = strategy.pp, strategy.virtual_stages, plan.stage
    if strategy.schedule is Schedule.GPIPE:
        return float(micro * plan.layers)
    if strategy.schedule is Schedule.INTERLEAVED and v > 1:
        chunks = min(2 * (pp - i - 1) + (v - 1) * pp + 1, micro * v)
        return chunks * plan.layers / v
    return float(min(pp - i, micro) * plan.layers)


def stage_params(model: TransformerSpec, strategy: Strategy, plan: StagePlan) -> tuple[float, float]:
    """(dense, expert) parameters one device of this stage holds before ZeRO sharding.

    TP splits the GEMM weights and the vocabulary; norms are replicated. With tied embeddings
    and pp > 1 the last stage keeps its own copy of the embedding for the LM head (Megatron)."""
    m, tp = model, strategy.tp
    norms = 2 * m.norm_params
    dense = plan.layers * ((m.dense_layer_params - norms) / tp + norms)
    expert = 0.0
    if m.is_moe:
        expert = plan.layers * m.expert_layer_params / (strategy.expert_tp * strategy.ep)
    else:
        dense += plan.layers * m.expert_layer_params / tp
    if plan.has_embedding:
        dense += m.vocab * m.hidden / tp + (m.embedding_params - m.vocab * m.hidden)
    if plan.has_head:
        dense += m.norm_params
        if not m.tied_embeddings or (strategy.pp > 1):
            dense += m.vocab * m.hidden / tp
    return dense, expert


def _state_bytes(params: float, shard: int, training: TrainingSpec, strategy: Strategy
                 ) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, offloaded) bytes for ``params`` sharded ``shard`` ways."""
    w, g, o = (2.0, 2.0, 12.0) if training.precision.mixed else (4.0, 4.0, 8.0)
    z = strategy.zero
    weights = params * w / (shard if z >= 3 else 1)
    grads = params * g / (shard if z >= 2 else 1)
    optim = params * o / (shard if z >= 1 else 1)
    offloaded = 0.0
    if strategy.offload in (Offload.OPTIMIZER, Offload.PARAMS):
        offloaded += optim
        optim = 0.0
    if strategy.offload is Offload.PARAMS:
        offloaded += weights
        weights = 0.0
    return weights, grads, optim, offloaded


def stage_memory(model: TransformerSpec, training: TrainingSpec, strategy: Strategy,
                 plan: StagePlan) -> StageMemory:
    st = strategy
    micro = micro_batches(training, st)
    dense, expert = stage_params(model, st, plan)
    dp_shard = st.dp * st.cp
    dw, dg, do, doff = _state_bytes(dense, dp_shard, training, st)
    ew, eg, eo, eoff = _state_bytes(expert, max(1, st.expert_dp), training, st)

    e = training.precision.activation_bytes
    per_layer = layer_activation_bytes(model, training, st)
    sbh = _sbh(model, training, st)
    if st.recompute is Recompute.FULL:
        kept = replace(st, recompute=Recompute.NONE)
        whole = layer_activation_bytes(model, training, kept)
        # Block recompute: the first recompute_layers of each chunk keep only their input.
        recomputed = st.recomputed_layers(plan.chunk_layers)
        per_layer = (recomputed * per_layer + (plan.layers - recomputed) * whole) / plan.layers
        # The layer being recomputed holds its full activations during its backward.
        activations = inflight_layer_sets(plan, st, micro) * per_layer + whole
    else:
        activations = inflight_layer_sets(plan, st, micro) * per_layer
    if plan.has_embedding:
        extra = (1.0 if model.dropout else 0.0) + (2 * e if model.embedding_norm else 0.0)
        inflight = micro if st.schedule is Schedule.GPIPE else min(st.pp, micro)
        activations += inflight * extra * sbh / (st.tp if st.sequence_parallel else 1)
    if plan.has_head:
        inflight = micro if st.schedule is Schedule.GPIPE else 1
        tokens = sbh / model.hidden
        # Final-norm input, LM-head input, and FP32 logits kept for the cross-entropy gradient.
        head = (e * sbh / (st.tp if st.sequence_parallel else 1) + e * sbh
                + 4.0 * tokens * model.vocab / st.tp)
        activations += inflight * head

    comm = 0.0
    communicators = sum(1 for d in (st.tp, st.pp, st.dp, st.cp, st.ep) if d > 1)
    comm += communicators * NCCL_BUFFER_BYTES
    layer_local = model.layer_params / (st.tp * (st.ep if model.is_moe else 1))
    if st.zero >= 3 or st.offload is Offload.PARAMS:
        # Gathered 16-bit parameters of the current and the prefetched unit (a layer, or a
        # tensor), plus one unit's full gradient before its reduce-scatter.
        unit = layer_local
        if st.zero3_granularity is Zero3Granularity.TENSOR:
            unit = max(model.layer_tensors()) / st.tp
        comm += 3 * unit * 2.0
    if st.sequence_parallel:
        comm += e * sbh           # all-gather output buffer
    if st.cp > 1:
        tokens = sbh / model.hidden
        comm += 2 * 2 * e * tokens * model.kv_dim / st.tp   # double-buffered K and V blocks
    if st.pp > 1:
        comm += 2 * e * sbh       # send and receive buffers
    live = dw + ew + dg + eg + do + eo + activations + comm
    reserve = CONTEXT_RESERVE_BYTES + FRAGMENTATION * live
    breakdown = MemoryBreakdown(weights=dw + ew, gradients=dg + eg, optimizer=do + eo,
                                activations=activations, comm_buffers=comm, reserve=reserve)
    return StageMemory(stage=plan.stage, layers=plan.layers, memory=breakdown,
                       offloaded_bytes=doff + eoff)


def memory_per_stage(model: TransformerSpec, training: TrainingSpec,
                     strategy: Strategy) -> tuple[StageMemory, ...]:
    return tuple(stage_memory(model, training, strategy, plan)
                 for plan in stage_plans(model, strategy))

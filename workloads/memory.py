"""Memory per device of every pipeline stage: model state, activations, buffers, reserve.

Sources:
- Model state of mixed-precision Adam: 2 (16-bit weights) + 2 (16-bit gradients) + 12 (FP32
  master weights, momentum, variance) bytes per parameter, ZeRO stages 1/2/3 shard the last,
  the last two, and all three terms over the ranks that hold the same parameters (Rajbhandari
  et al. SC'20, sec. 3 and Fig. 1). FP32 training keeps 4 + 4 + 8. What each device holds and
  over how many ranks ZeRO shards it comes from ``workloads/shards.py``, as the trace's
  gathers and reductions do.
- Activations per layer per micro-batch: Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models", arXiv 2205.05198), sec. 4 and Table 2:
  s b h (34 + 5 a s / h) bytes with no parallelism, split by t with tensor (and sequence)
  parallelism, s b h (34 / t) with sequence parallelism and selective recompute, 2 s b h with
  full recompute. The function below derives those terms from the layer's tensors, so GQA,
  gated MLPs, missing dropout, fused attention and context parallelism change them the right way.
- In-flight micro-batches: 1F1B keeps pp - i on stage i, GPipe all m, the interleaved schedule
  multiplies stage 0's by (1 + (pp - 1) / (pp v)) (Korthikanti sec. 4.2.3; Megatron-LM's
  ``get_num_warmup_microbatches``); the 1F1B all-to-all overlap's merged schedule holds one
  layer more (``inflight_layer_sets``); DualPipe PP + 1 micro-batches of
  one of its two chunks (DeepSeek-V3 report, arXiv 2412.19437 Table 2).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from clustersim.hardware_specs import Dtype
from clustersim.workloads.hybrid import LayerType
from clustersim.workloads.hybrid_memory import hybrid_layer_bytes
from clustersim.workloads.layer_ops import op_saved_matmul_width
from clustersim.workloads.pipelining_memory import ChunkBytes, Held, peak_held, rank_actions
from clustersim.workloads.model import Mlp, TransformerSpec
from clustersim.workloads.shards import ParamKind, Shard, stage_shards, vocab_rows
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.strategy import (
    Offload, Recompute, RecomputeModule, Schedule, Strategy, Zero3Granularity, micro_batches,
)
from clustersim.workloads.fp8 import MX_SCALE_BYTES, stored_weight_bytes, weight_copy_bytes
from clustersim.workloads.training import (
    AttentionKernel, CrossEntropy, Fp8Recipe, Precision, TrainingSpec,
)

GIB = 2.0**30
"""Bytes in a gibibyte (IEC 80000-13): the one memory unit of every output."""

CONTEXT_RESERVE_BYTES = 1.0 * GIB
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL's own state: PyTorch's CUDA-semantics notes
put the context alone at several hundred MB; 1 GiB in all is the usual rule of thumb. Outside
PyTorch's caching allocator: ``torch.cuda.memory_reserved`` does not count it."""
FRAGMENTATION = 0.15
"""Share of the caching allocator's reserved memory that no live tensor uses at the peak
(1 - allocated / reserved). PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp;
the CUDA-semantics notes, "Memory management") keeps freed blocks cached, rounds requests over
1 MB up to 2 MiB and serves them by splitting cached segments, so a free split block that is
too small for the next request stays reserved. GMLake (Guo et al., ASPLOS'24, arXiv 2401.08156)
measures that slack in LLM training with recomputation, ZeRO and offload on A100-80GB and
removes 15% of it on average (up to 33%) over eight LLMs: 15% is the average share used here."""
NCCL_BUFFER_BYTES = 4 * 2**20 * 2 * 8
"""Per communicator in use: NCCL_BUFFSIZE (4 MiB default, NCCL docs) x send/recv x 8 channels;
NCCL allocates them itself, outside the caching allocator."""


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    comm_buffers: float
    fragmentation: float
    """Reserved by the caching allocator, used by no live tensor (``FRAGMENTATION``)."""
    reserve: float
    """Outside the allocator: CUDA context and NCCL's own buffers."""

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def allocated(self) -> float:
        """Live tensors at the peak (``torch.cuda.max_memory_allocated``)."""
        return self.total - self.fragmentation - self.reserve

    @property
    def required(self) -> float:
        """What must fit in the device's memory: live tensors, CUDA context and NCCL buffers.
        The fragmentation does not count: before it raises out-of-memory the caching allocator
        frees its unused cached blocks and retries ``cudaMalloc`` (``release_cached_blocks``
        in ``CUDACachingAllocator.cpp``; torchtitan logs these as allocation retries)."""
        return self.allocated + self.reserve

    @property
    def allocator_reserved(self) -> float:
        """What the caching allocator holds at the peak (``torch.cuda.max_memory_reserved``,
        the figure torchtitan logs as its peak memory)."""
        return self.total - self.reserve

    def to_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total"] = self.total
        out["allocated"] = self.allocated
        out["allocator_reserved"] = self.allocator_reserved
        out["required"] = self.required
        return out


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    layers: int
    memory: MemoryBreakdown
    offloaded_bytes: float
    """State this device keeps in the offload tier (host DRAM by default)."""
    offloaded_activation_bytes: float = 0.0
    """Saved activations this device holds in host memory at the forward's end
    (``Strategy.offload_activation_layers``): not model state, so no checkpoint copies it."""


def layer_activation_bytes(model: TransformerSpec, training: TrainingSpec,
                           strategy: Strategy, layer: int | None = None) -> float:
    """Stored activations of one layer, one micro-batch, one device (Korthikanti et al. 2022).

    With MHA, a GeLU MLP of 4h, dropout, unfused attention and no recompute this is exactly
    s b h (10 + 24/t + 5 a s/(h t)), or s b h (34/t + 5 a s/(h t)) with sequence parallelism.
    ``layer`` picks the layer where they differ (None: the last). MLA keeps its query and
    key/value latents (replicated, as its down-projections are), Q and K of head_dim and V of
    v_head_dim per head; a MoE layer keeps each routed copy of a token as its expert's input,
    the experts' (top_k of them) and shared experts' intermediates. Under FP8 (NVFP4) with
    ``fp8_saved_inputs`` the linear layers keep their FP8-cast inputs (``linear_input_bytes``)
    where 16-bit training keeps the 16-bit tensor; the attention kernel, the norms, the router
    and the activation function keep theirs in 16 bits, so the attention output is held twice.
    """
    m, t, st = model, training, strategy
    if st.recompute is Recompute.FULL:
        # Only the layer input, sharded by sequence parallelism when it is on.
        return 2.0 * _sbh(m, t, st) / st.sequence_split
    if st.recompute is Recompute.OP:
        return _op_saved_bytes(m, t, st)
    i = m.layers - 1 if layer is None else layer
    tp, sp = st.tp, st.sequence_parallel
    if m.is_hybrid:
        return _hybrid_layer(m, t, st, i)
    e = t.precision.activation_bytes
    f = linear_input_bytes(t)                  # a linear layer's saved input
    sbh = _sbh(m, t, st)                       # s b h on this device's sequence shard
    per = sbh / m.hidden                       # s b
    mask = 1.0 if m.dropout else 0.0           # dropout masks: 1 byte per element
    moe = m.is_moe_layer(i)
    ffn = (m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn) if moe else m.ffn_hidden
    # Kept whole on each TP rank unless sequence parallelism splits them: the inputs of the two
    # norms, of the QKV GEMM and of fc1 (or of the router, which stays 16-bit), and the two
    # dropout masks.
    fed = (f, e if moe else f)                 # QKV input, fc1 or router input
    replicated = (2 * e + sum(fed) + 2 * mask) * sbh
    # Split over TP:
    split = (e * per * (m.q_dim + m.kv_dim)    # Q and K for QK^T
             + e * per * m.v_dim               # V
             + e * per * m.attn_out_dim)       # attention output (the kernel's backward)
    if f != e:                                 # the projection's own FP8 copy of it
        split += f * per * m.attn_out_dim
    mlp = per * ffn * ((2 * e if m.mlp is Mlp.SWIGLU else e) + f)   # fc1 outputs, fc2 input
    # A clamped activation (gpt-oss) keeps fc1's outputs for the clamps' backward and the
    # clamped copy for the fused activation's (see LayerOps._moe_mlp).
    clamped = (per * m.top_k * m.expert_ffn * (2 if m.mlp is Mlp.SWIGLU else 1) * e
               if moe and m.activation_clamp else 0.0)
    split += mlp + clamped
    whole = 0.0
    if m.is_mla:   # latents into their norms, and the norms' outputs into the up-projections
        whole += (e + f) * per * (m.q_lora_rank + m.kv_lora_rank)
    if moe:        # each token's copy for each of its experts (expert TP keeps rows whole)
        whole += f * per * m.top_k * m.hidden
    modules = st.recompute_modules if st.recompute is Recompute.MODULES else ()
    if RecomputeModule.LAYERNORM in modules:   # norm outputs rebuilt from their inputs
        replicated -= sum(fed) * sbh
        if m.is_mla:
            whole -= f * per * (m.q_lora_rank + m.kv_lora_rank)
    if RecomputeModule.MLA_UP_PROJ in modules:  # Q, K and V rebuilt from the latents
        split -= e * per * (m.q_dim + m.kv_dim + m.v_dim)
    if RecomputeModule.MOE in modules and moe:   # the block keeps only its input (above)
        whole -= f * per * m.top_k * m.hidden
        split -= mlp + clamped
    elif RecomputeModule.MLP in modules and not moe:   # the dense MLP keeps only its input
        split -= mlp
    elif RecomputeModule.MOE_ACT in modules and moe:   # fc2's inputs and the clamped copy
        split -= f * per * m.top_k * m.expert_ffn + clamped
    if moe and st.moe_paged_stash_buffer and RecomputeModule.MOE not in modules:
        whole += (st.moe_paged_stash_buffer - 1.0) * _routed_saved_bytes(m, t, st, per, modules)
    core = 0.0
    if t.attention is AttentionKernel.STANDARD and st.recompute is Recompute.NONE:
        core = _score_bytes(m, t, per)
    elif t.attention.fused:
        core = 4.0 * per * m.heads            # FP32 log-sum-exp per query and head
    return replicated / (tp if sp else 1) + whole + (split + core) / tp


def _hybrid_layer(model: TransformerSpec, training: TrainingSpec, strategy: Strategy,
                  layer: int) -> float:
    """A hybrid stack's layer (``workloads/hybrid_memory.py``), with the paged stash's spare
    room beside a MoE layer's routed experts."""
    per = _sbh(model, training, strategy) / model.hidden
    kept, routed = hybrid_layer_bytes(
        model, layer, per, training.precision.activation_bytes, linear_input_bytes(training),
        strategy.tp, strategy.sequence_parallel, training.attention.fused)
    if routed and strategy.moe_paged_stash_buffer:
        kept += (strategy.moe_paged_stash_buffer - 1.0) * _routed_saved_bytes(
            model, training, strategy, per, ())
    if (model.layer_type(layer) is LayerType.ATTENTION and strategy.recompute is Recompute.NONE
            and training.attention is AttentionKernel.STANDARD):
        kept += _score_bytes(model, training, per) / strategy.tp
    return kept


def _score_bytes(model: TransformerSpec, training: TrainingSpec, tokens: float) -> float:
    """Unfused attention's stored scores, b a s_local s elements: softmax output, and with
    dropout its 1-byte mask and output."""
    e, scores = training.precision.activation_bytes, tokens * model.heads * training.seq_len
    return scores * (e + (1.0 + e if model.dropout else 0.0))


def _routed_saved_bytes(model: TransformerSpec, training: TrainingSpec, strategy: Strategy,
                        tokens: float, modules: tuple[RecomputeModule, ...]) -> float:
    """What the routed experts' fused grouped MLP saves for its backward on one device, at
    balanced routing: its fc1 input (each token's copy per expert), fc1 output and fc2 input.
    These are the tensors Megatron-Core's paged stash copies into its buffer (``experts.py``:
    the grouped MLP runs inside ``get_paged_stash_context``; ``moe/paged_stash.py``,
    ``allocate_stash_buffers`` sizes the CUDA buffer at the factor times the average tokens)."""
    m, e, f = model, training.precision.activation_bytes, linear_input_bytes(training)
    act_in = 2 * e if m.mlp is Mlp.SWIGLU else e
    fc2_in = 0.0 if RecomputeModule.MOE_ACT in modules else f
    return tokens * m.top_k * (f * m.hidden + m.expert_ffn * (act_in + fc2_in) / strategy.tp)


def linear_input_bytes(training: TrainingSpec) -> float:
    """Bytes per element of the input a linear layer saves for its weight gradient.

    Transformer Engine's FP8 ``Linear`` saves the FP8 copy it cast for the forward GEMM (only
    its column-wise data with MXFP8, plus one scale byte per 32 elements; TE ``linear.py``,
    "Cached input tensor"), as DeepSeek-V3's framework does (arXiv 2412.19437, sec. 3.3.3);
    torchao's ``Float8Linear`` (torchtitan) saves the 16-bit input (``save_for_backward(input_hp,
    weight_hp_t)``) and casts again in the backward, as do 16-bit runs. Under NVFP4 TE keeps
    the column-wise (Hadamard-transformed) NVFP4 copy wgrad reads, 0.5 + 1/16 bytes."""
    e = training.precision.activation_bytes
    if not training.precision.quantized or not training.fp8_saved_inputs:
        return e
    if training.precision is Precision.NVFP4:
        return Dtype.NVFP4.bytes
    return 1.0 + (MX_SCALE_BYTES / 2 if training.fp8_recipe is Fp8Recipe.MXFP8 else 0.0)


def _op_saved_bytes(model: TransformerSpec, training: TrainingSpec, strategy: Strategy) -> float:
    """Per-op recompute (tp = 1) keeps the layer input, the outputs of every other matmul (under
    ``torch.compile`` those the backward reads), and a fused attention kernel's output with its
    FP32 log-sum-exp."""
    m, t = model, training
    e = t.precision.activation_bytes
    per = _sbh(m, t, strategy) / m.hidden
    width = m.hidden + op_saved_matmul_width(m, backward_reads_only=t.compiled)
    lse = 0.0
    if t.attention.fused:
        width += m.attn_out_dim
        lse = 4.0 * per * m.heads
    return e * per * width + lse


def _mean_over_layers(model: TransformerSpec, training: TrainingSpec, strategy: Strategy,
                      plan: StagePlan) -> float:
    """Stored activations of one of the stage's layers, averaged over them (layers of a mixture
    of experts differ: DeepSeek-V3's dense first layers keep less than its MoE layers)."""
    by_kind: dict[tuple, float] = {}
    for i in plan.layer_ids:
        kind = model.layer_kind(i)
        if kind not in by_kind:
            by_kind[kind] = layer_activation_bytes(model, training, strategy, i)
    return sum(by_kind[model.layer_kind(i)] for i in plan.layer_ids) / len(plan.layer_ids)


def _sbh(model: TransformerSpec, training: TrainingSpec, strategy: Strategy) -> float:
    return training.micro_batch * (training.seq_len / strategy.cp) * model.hidden


def inflight_layer_sets(plan: StagePlan, strategy: Strategy, micro: int) -> float:
    """Layer-micro-batch activation sets stage ``plan.stage`` holds at its peak.

    The 1F1B all-to-all overlap runs one more warm-up forward, then pairs the next forward
    with the oldest backward layer by layer (forward layer j with backward layer L - 1 - j,
    each backward layer released after its pair: Megatron-LM ``model_chunk_schedule_plan.py``,
    ``TransformerModelChunkSchedulePlan.run``; ``combined_1f1b.py`` for PP = 1). Its peak is
    the plain schedule's chunks plus the one layer both passes hold during a pair, not one
    more micro-batch."""
    pp, v, i = strategy.pp, strategy.virtual_stages, plan.stage
    if strategy.schedule is Schedule.GPIPE:
        return float(micro * plan.layers)
    if strategy.schedule is Schedule.DUALPIPE:
        # PP + 1 micro-batches of one chunk (DeepSeek-V3 report, Table 2).
        return min(pp + 1, micro) * plan.layers / 2
    if strategy.schedule is Schedule.INTERLEAVED and v > 1:
        held, most = 2 * (pp - i - 1) + (v - 1) * pp + 1, micro * v
        layers = plan.layers / v
    else:
        held, most, layers = pp - i, micro, float(plan.layers)
    paired = 1.0 if strategy.moe_a2a_overlap and held < most else 0.0
    return min(held, most) * layers + paired


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes of model state per parameter."""

    weights: float
    gradients: float
    optimizer: float


def model_state_bytes(training: TrainingSpec) -> StateBytes:
    """Mixed-precision Adam keeps 2 (16-bit weights) + 2 (16-bit gradients) + 12 (FP32 master
    weights, momentum, variance) bytes per parameter; FP32 training 4 + 4 + 8 (Rajbhandari et
    al. SC'20, sec. 3.1)."""
    if training.precision.mixed:
        return StateBytes(weights=2.0, gradients=2.0, optimizer=12.0)
    return StateBytes(weights=4.0, gradients=4.0, optimizer=8.0)


def _state_bytes(shard: Shard, training: TrainingSpec, strategy: Strategy
                 ) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, offloaded) bytes of ``shard`` on one device: ZeRO
    stages 1, 2, 3 shard the optimizer state, then the gradients, then the weights."""
    per, z = model_state_bytes(training), strategy.zero
    kept = strategy.fsdp_keeps_gathered      # gathered weights, unsharded gradients all step
    # FP8/NVFP4 weights (Megatron --fp8-param-gather and fp4_param_gather, torchao float8
    # parameters): stored in the GEMM format (MXFP8: both scaled copies); tables stay 16-bit.
    low = stored_weight_bytes(training)
    if low is None or shard.kind is ParamKind.VOCAB:
        low = per.weights
    # A per-tensor FP8 weight's transpose beside it (``weight_copy_bytes``), where the weights
    # stay whole on the device (ZeRO-1/2).
    if shard.kind is not ParamKind.VOCAB and z < 3:
        low += weight_copy_bytes(training)
    weights = shard.resident(z >= 3 and not kept) * low
    # FSDP2 under PP with an FP32 reduce dtype accumulates the unsharded gradients in FP32
    # between micro-batches (``FSDPParam.to_accumulated_grad_if_needed``).
    grad_bytes = 4.0 if kept and training.fp32_grad_reduce and per.gradients < 4 else per.gradients
    grads = shard.resident(z >= 2 and not kept) * grad_bytes
    optim = shard.resident(z >= 1) * per.optimizer
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
    shards = stage_shards(model, st, plan)
    state = [_state_bytes(shard, training, st) for shard in shards.by_group().values()]
    weights, grads, optim, offloaded = (sum(part) for part in zip(*state))

    e = training.precision.activation_bytes
    per_layer = _mean_over_layers(model, training, st, plan)
    sbh = _sbh(model, training, st)
    kept = replace(st, recompute=Recompute.NONE)
    working = 0.0
    if st.recompute in (Recompute.FULL, Recompute.OP):
        whole = max(layer_activation_bytes(model, training, kept, i) for i in plan.layer_ids)
        if st.recompute is Recompute.FULL:
            # Block recompute: the first recompute_layers of each chunk keep only their input.
            recomputed = st.recomputed_layers(plan.chunk_layers)
            per_layer = ((recomputed * per_layer + (plan.layers - recomputed) * whole)
                         / max(1, plan.layers))
        # The layer being recomputed holds its full activations during its backward.
        working = whole
    # Activation offload (pp = 1, no recompute): Transformer Engine's default schedule
    # (``cpu_offload.py``, ``OffloadSynchronizer._default_offload_sync_init``) offloads layers
    # 0..n-1, each finished before layer layers - n + i runs its forward and reloaded from
    # layer layers - n - 1 + i's backward on, so the saved activations peak at
    # (layers - n) layers' worth; the host tier holds the n others.
    moved = st.offload_activation_layers * per_layer
    extras = -moved
    if st.recompute is Recompute.MODULES and RecomputeModule.MOE in st.recompute_modules:
        # The MoE block being recomputed holds its activations during its backward.
        whole_block = replace(st, recompute_modules=tuple(
            x for x in st.recompute_modules if x is not RecomputeModule.MOE))
        extras += max((layer_activation_bytes(model, training, whole_block, i)
                       - layer_activation_bytes(model, training, st, i)
                       for i in plan.layer_ids), default=0.0)
    embed = 0.0
    if plan.has_embedding:
        embed = ((1.0 if model.dropout else 0.0) + (2 * e if model.embedding_norm else 0.0)
                 ) * sbh / st.sequence_split
    stored, loss = _head_bytes(model, training, st) if plan.has_head else (0.0, 0.0)
    if _torch_pipelined(st):
        held = _pipelined_peak(model, training, st, plan, micro, grads,
                               (per_layer, embed, stored, working, loss))
        activations, grads, pp_buffers = held.activations + extras, held.gradients, held.buffers
    else:
        gpipe = st.schedule is Schedule.GPIPE
        activations = (inflight_layer_sets(plan, st, micro) * per_layer + extras
                       + (micro if gpipe else min(st.pp, micro)) * embed
                       + (micro if gpipe else 1) * stored
                       # The loss's peak comes before any layer's backward: the larger counts.
                       + max(working, loss))
        pp_buffers = 2 * e * sbh if st.pp > 1 else 0.0    # send and receive buffers

    comm = 0.0
    communicators = sum(1 for d in (st.tp, st.pp, st.dp, st.cp, st.ep) if d > 1)
    if (st.zero >= 3 and not st.fsdp_keeps_gathered) or st.offload is Offload.PARAMS:
        comm += _gathered_bytes(st, training, shards)
    if st.sequence_parallel:
        comm += e * sbh           # all-gather output buffer
    if st.cp > 1:
        tokens = sbh / model.hidden
        comm += 2 * 2 * e * tokens * model.kv_dim / st.tp   # double-buffered K and V blocks
    comm += pp_buffers
    allocated = weights + grads + optim + activations + comm
    breakdown = MemoryBreakdown(
        weights=weights, gradients=grads, optimizer=optim, activations=activations,
        comm_buffers=comm, fragmentation=allocated * FRAGMENTATION / (1.0 - FRAGMENTATION),
        reserve=CONTEXT_RESERVE_BYTES + communicators * NCCL_BUFFER_BYTES)
    return StageMemory(stage=plan.stage, layers=plan.layers, memory=breakdown,
                       offloaded_bytes=offloaded, offloaded_activation_bytes=moved)


def _torch_pipelined(strategy: Strategy) -> bool:
    """FSDP kept gathered under PP is torchtitan's run, whose pipeline is PyTorch's own
    (``workloads/pipelining_memory.py``); its GPipe and DualPipe orders are not modelled."""
    return strategy.fsdp_keeps_gathered and strategy.schedule in (
        Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)


def _pipelined_peak(model: TransformerSpec, training: TrainingSpec, strategy: Strategy,
                    plan: StagePlan, micro: int, grads: float,
                    kept: tuple[float, float, float, float, float]) -> Held:
    """Peak of a rank under ``torch.distributed.pipelining``: each local chunk's kept
    activations (``kept``: per layer, embedding and head per micro-batch, the recomputed
    layer's and the loss's working sets), its share of the stage's unsharded gradients (by
    parameters) and of their shards, and with ``pp_microbatch_buffers`` the stage's
    per-micro-batch buffers: its input and output, the inter-stage activation on this device
    (``e s b h / sequence_split``), or on the last stage the logits (``vocab_rows`` columns);
    without, one send and one receive buffer of ``e s b h``."""
    st, e = strategy, training.precision.activation_bytes
    per_layer, embed, stored, working, loss = kept
    shards = stage_shards(model, st, plan)
    groups = shards.by_group().values()
    sharded = sum(g.params / g.ranks for g in groups) / sum(g.params for g in groups)
    sbh = _sbh(model, training, st)
    kept_buffers = training.pp_microbatch_buffers
    hidden = e * sbh / st.sequence_split if kept_buffers else 0.0
    logits = e * sbh / model.hidden * vocab_rows(model, st) if kept_buffers else 0.0
    ends = [(k == 0 and plan.has_embedding, k == len(plan.chunk_layers) - 1 and plan.has_head)
            for k in range(len(plan.chunk_layers))]
    params = [sum(s.params for i in ids for s in shards.layers[i])
              + (shards.embedding.params if first else 0.0) + (shards.head.params if last else 0.0)
              for ids, (first, last) in zip(plan.chunk_layer_ids, ends, strict=True)]
    chunks = []
    for k, (n, (first, last)) in enumerate(zip(plan.chunk_layers, ends, strict=True)):
        share = grads * params[k] / sum(params)
        chunks.append(ChunkBytes(
            activations=per_layer * n + (embed if first else 0.0) + (stored if last else 0.0),
            working=max(working, loss) if last else working,
            gradients=share, reduced=share * sharded,
            output=logits if last else hidden,
            input_buffer=0.0 if first else hidden, grad_buffer=0.0 if last else hidden))
    actions = rank_actions(st.schedule, st.pp, st.virtual_stages, micro, plan.stage)
    held = peak_held(actions, chunks, micro)
    return held if kept_buffers else replace(held, buffers=held.buffers + 2 * e * sbh)


KEPT_LOSS_BYTES = {CrossEntropy.FUSED: 4.0, CrossEntropy.TE: 2.0, CrossEntropy.COMPILED_FP32: 2.0}
"""Bytes per logit a loss keeps from forward to backward (``CrossEntropy``): the fused
kernels' gradient, the compiled loss's 16-bit logits."""


def loss_peak_bytes(model: TransformerSpec, training: TrainingSpec, strategy: Strategy) -> float:
    """The loss's own peak, one micro-batch (``CrossEntropy``): 0 for the fused kernels, whose
    kept gradient is counted as an activation; 12 bytes per logit on this device for
    torchtitan's eager FP32 cross-entropy, 16 under TP's ``loss_parallel``; 2 for the
    compiled loss, the 16-bit gradient its backward writes beside the kept logits."""
    ce = training.cross_entropy
    if ce in (CrossEntropy.FUSED, CrossEntropy.TE):
        return 0.0
    logits = _sbh(model, training, strategy) / model.hidden * vocab_rows(model, strategy)
    if ce is CrossEntropy.COMPILED_FP32:
        return 2.0 * logits
    return logits * (16.0 if strategy.tp > 1 else 12.0)


def _head_bytes(model: TransformerSpec, training: TrainingSpec, strategy: Strategy
                ) -> tuple[float, float]:
    """(kept activations, loss peak) of the head and its MTP modules, one micro-batch."""
    st, e = strategy, training.precision.activation_bytes
    sbh = _sbh(model, training, st)
    # Final-norm input, LM-head input, and (fused losses) the logits' gradient kept for the
    # backward: Megatron-Core's FP32 softmax, TE's gradient in the 16-bit logits.
    kept_loss = KEPT_LOSS_BYTES.get(training.cross_entropy, 0.0)
    head = (e * sbh / st.sequence_split + e * sbh
            + kept_loss * sbh / model.hidden * vocab_rows(model, st))
    # Each MTP module keeps a layer like the last one (never recomputed here), its input
    # projection's input (2h) and its own pass through the head.
    kept = replace(st, recompute=Recompute.NONE)
    mtp = model.mtp_layers * (layer_activation_bytes(model, training, kept, model.layers - 1)
                              + 2 * e * sbh / st.sequence_split + head)
    return head + mtp, loss_peak_bytes(model, training, st)


def _gathered_bytes(strategy: Strategy, training: TrainingSpec, shards) -> float:
    """ZeRO-3's unsharded buffers: the 16-bit parameters of the current and the prefetched
    unit (a layer, or a tensor), one unit's 16-bit gradient before its reduce-scatter and, with
    an FP32 reduce dtype, the FP32 reduce-scatter input FSDP2 copies it into
    (``foreach_reduce``). FSDP2 keeps its root unit (embedding and LM head) gathered from
    forward to backward (``FSDPState._lazy_init``: no reshard after forward for the root)."""
    st = strategy
    if st.zero3_granularity is Zero3Granularity.TENSOR:
        unit = max(t.params for tensors in shards.tensors.values() for t in tensors)
        return 3 * unit * 2.0
    unit = max(sum(s.params for s in layer) for layer in shards.layers.values())
    out = 3 * unit * 2.0 + (4.0 * unit if training.fp32_grad_reduce else 0.0)
    if shards.root is not None and st.zero >= 3 and st.offload is not Offload.PARAMS:
        out += 2.0 * shards.root.params
    return out


def memory_per_stage(model: TransformerSpec, training: TrainingSpec,
                     strategy: Strategy) -> tuple[StageMemory, ...]:
    return tuple(stage_memory(model, training, strategy, plan)
                 for plan in stage_plans(model, strategy))

"""The one home of FLOP and byte formulas: what each kernel of a transformer layer costs.

Sources:
- GEMM FLOPs 2mnk; per-layer forward 24 b s h^2 + 4 b s^2 h for GPT (Narayanan et al. SC'21,
  sec. 5.1, eq. (3)); GQA shrinks the K/V projections to 2 h kv_dim, SwiGLU has 3 GEMMs of h x f.
- Backward = 2x forward for GEMMs (a data-gradient and a weight-gradient GEMM of the same size).
- Fused attention (FlashAttention-2, Dao 2023, sec. 4): forward 4 s^2 d per head, backward 2.5x
  forward (it recomputes the scores), causal masking skips half of the blocks.
- Element-wise kernels (norms, activations, residual/dropout, rotary, cross-entropy, the Adam
  step) are memory-bound: their cost is bytes read + written from HBM.
- Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 sec. 2.1; DeepSeek-V3, arXiv
  2412.19437 sec. 2.1.1): query down/up projections through q_lora_rank, a joint key/value
  down-projection to kv_lora_rank plus one shared rotary key, the key/value up-projection, and
  attention over qk = nope + rope dimensions with values of v_head_dim. The down-projections
  are replicated over TP (Megatron-Core's MLA keeps them unsplit). Whole-model FLOPs follow
  Megatron-LM's ``num_floating_point_operations`` (MLA, routed and shared experts, dense first
  layers, MTP), tested against it.
- Mamba-2 layers of a hybrid stack: ``workloads/mamba_ops.py``.
- MoE layers: router GEMM and its FP32 softmax/top-k, permute and unpermute, grouped expert
  GEMMs whose rows are the busiest device's tokens per expert (``routing.expert_load``), issued
  as one GEMM per local expert (Transformer Engine's ``GroupedLinear``; under FP8, the copies
  that pad each expert's rows to the recipe's alignment: ``workloads/fp8.py``), shared experts
  as a dense MLP every token passes.
Kernels describe ONE device's share (after TP/CP/EP splits) for ONE micro-batch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads import eager_ops
from clustersim.workloads.dispatch import Dispatcher
from clustersim.workloads.fp8 import Fp8Casts
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.kernels import backward_of as _backward_of
from clustersim.workloads.kernels import elementwise as _elementwise
from clustersim.workloads.kernels import gemm as _gemm
from clustersim.workloads.hybrid import LayerType, mamba_in_proj_width, ssd_flops_per_token
from clustersim.workloads.mamba_ops import MambaOps
from clustersim.workloads.model import LocalAttention, Mlp, Norm, Position, TransformerSpec
from clustersim.workloads.routing import expert_load
from clustersim.workloads.shards import vocab_rows
from clustersim.workloads.strategy import Recompute, RecomputeModule, Strategy
from clustersim.workloads.training import AttentionKernel, CrossEntropy, TrainingSpec


ATTENTION_CLASS_OF = {AttentionKernel.FLASH: OpClass.ATTENTION,
                      AttentionKernel.FLASH3: OpClass.ATTENTION_FA3,
                      AttentionKernel.CUDNN_2024: OpClass.ATTENTION_CUDNN_2024}
"""The op class (hence the efficiency) of each fused attention kernel."""


class Pass(enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class LayerWork:
    """A layer's kernels split where tensor-parallel communication sits between them."""

    attention: tuple[Kernel, ...]
    mlp: tuple[Kernel, ...]


class LayerOps:
    """Kernel lists for one device's share of a layer, the embedding, the LM head, the optimizer."""

    def __init__(self, model: TransformerSpec, training: TrainingSpec, strategy: Strategy):
        self.model, self.training, self.strategy = model, training, strategy
        self.elem = training.precision.activation_bytes
        self.gemm_dtype = training.precision.gemm_dtype
        """Layer GEMMs run in FP8 under FP8 training; the LM head and attention stay 16-bit."""
        self.dtype = training.precision.compute_dtype
        s = strategy
        self.tokens = training.micro_batch * training.seq_len // s.cp
        """Tokens of one micro-batch on one device's sequence shard."""
        self.fp8 = Fp8Casts(training, strategy)
        self.mamba = MambaOps(model, strategy, self.tokens, self.elem, self.gemm_dtype)
        self.norm_tokens = self.tokens // s.sequence_split
        """Tokens element-wise work runs on (sequence parallelism splits them over TP)."""
        self.expert_tokens = (self.norm_tokens * s.expert_tp
                              if s.sequence_parallel or s.tp == 1 else self.tokens)
        """Tokens whose routed copies the ranks splitting an expert (etp of them) compute:
        each one's own sequence shard, gathered over the expert-TP group (etp = tp: the
        TP group's tokens)."""

    # --- transformer layer -------------------------------------------------------------
    def _eager(self, name: str, elements: float, op: eager_ops.EagerOp,
               op_class: OpClass = OpClass.ELEMENTWISE) -> Kernel:
        """An element-wise op as eager PyTorch runs it (16-bit activations)."""
        return _elementwise(name, elements, op.bytes_per_element, 1.0, op_class, op.launches)

    @property
    def _eager_norm(self) -> bool:
        """Norms run as torchtitan's eager RMSNorm, op by op."""
        return self.training.eager_elementwise and self.model.norm is Norm.RMSNORM

    def _norm(self, name: str, elements: float) -> Kernel:
        """A norm: one fused kernel that reads and writes, or torchtitan's eager RMSNorm."""
        if self._eager_norm:
            return self._eager(name, elements, eager_ops.RMSNORM)
        return _elementwise(name, elements, 2, self.elem)

    def _rotary(self, elements: float) -> Kernel:
        if self.training.eager_elementwise:
            return self._eager("rotary", elements, eager_ops.ROTARY)
        return _elementwise("rotary", elements, 2, self.elem)

    def _activation(self, name: str, elements: float) -> Kernel:
        """The MLP's activation: SwiGLU reads both halves and writes one (eager: silu, then
        the product), GELU reads and writes."""
        if self.model.mlp is not Mlp.SWIGLU:
            return _elementwise(name, elements, 2, self.elem, OpClass.TRANSCENDENTAL)
        if self.training.eager_elementwise:
            return self._eager(name, elements, eager_ops.SWIGLU, OpClass.TRANSCENDENTAL)
        return _elementwise(name, elements, 3, self.elem, OpClass.TRANSCENDENTAL)

    def _layer(self, layer: int | None) -> int:
        """The layer whose kind is asked for; None: the last one (a MoE layer in a MoE model)."""
        return self.model.layers - 1 if layer is None else layer

    def attention_core(self, layer: int | None = None) -> tuple[Kernel, ...]:
        m, t, s = self.model, self.training, self.strategy
        i = self._layer(layer)
        heads = m.heads // s.tp
        s_q = t.seq_len // s.cp
        b = t.micro_batch
        d, v = m.head_dim, m.value_head_dim
        if t.attention.fused:
            # Causal: the local query block attends to about half of all keys (load-balanced
            # CP), or to its window on local-attention layers.
            keys = attended_keys(m, i, t.seq_len)
            flops = 2.0 * b * s_q * keys * heads * (d + v)
            kv_heads = heads if m.is_mla else max(1, m.kv_heads // s.tp)
            traffic = (self.tokens * heads * (d + v) + self.tokens * kv_heads * (d + v)) * self.elem
            kind = ATTENTION_CLASS_OF[t.attention]
            span = t.seq_len if m.is_global_attention(i) else min(t.seq_len, round(2 * keys))
            # A sliding window's band has a lower edge as well as the causal one (key_loop).
            band = (not m.is_global_attention(i) and m.local_attention is LocalAttention.SLIDING
                    and m.local_window < t.seq_len)
            # k: the width its two matmuls run per score, (d + v) / 2 (MLA: 192 and 128).
            return (Kernel("flash_attn", kind, flops, traffic, s_q, span, (d + v) // 2,
                           b * heads, self.dtype, exps=b * s_q * keys * heads,
                           diagonals=2 if band else 1),)
        scores = float(b * heads * s_q * t.seq_len)
        mask_passes = 3.0 if m.dropout else 0.0  # write mask (1 B ~ half elem), apply: read+write
        return (
            _gemm("attn_scores", s_q, t.seq_len, d, self.elem, self.dtype, b * heads),
            _elementwise("softmax", scores, 2.0 + mask_passes, self.elem,
                         OpClass.TRANSCENDENTAL),
            _gemm("attn_values", s_q, v, t.seq_len, self.elem, self.dtype, b * heads),
        )

    def _projections(self) -> list[Kernel]:
        """Query, key and value projections up to the head-major layout attention reads."""
        m, s = self.model, self.strategy
        e, T, gd = self.elem, self.tokens, self.gemm_dtype
        if not m.is_mla:
            qkv = (m.q_dim + m.kv_dim + m.v_dim) // s.tp
            out = [_gemm("qkv", T, qkv, m.hidden, e, gd), _elementwise("qkv_layout", T * qkv, 2, e)]
            if m.qk_norm:
                out.append(_elementwise("qk_norm", T * (m.q_dim + m.kv_dim) // s.tp, 2, e))
            if m.position is Position.ROPE:
                out.append(self._rotary(T * (m.q_dim + m.kv_dim) // s.tp))
            return out
        heads, rope, q_rank, kv_rank = (m.heads // s.tp, m.qk_rope_head_dim, m.q_lora_rank,
                                        m.kv_lora_rank)
        if q_rank:
            out = [_gemm("q_down", T, q_rank, m.hidden, e, gd),
                   _elementwise("q_norm", T * q_rank, 2, e),
                   _gemm("q_up", T, heads * m.head_dim, q_rank, e, gd)]
        else:
            out = [_gemm("q_proj", T, heads * m.head_dim, m.hidden, e, gd)]
        out += [_gemm("kv_down", T, kv_rank + rope, m.hidden, e, gd),
                _elementwise("kv_norm", T * kv_rank, 2, e),
                _gemm("kv_up", T, heads * (m.qk_nope_head_dim + m.value_head_dim), kv_rank, e, gd),
                # Q, K (the shared rotary key copied to every head) and V, head-major.
                _elementwise("qkv_layout", T * heads * (2 * m.head_dim + m.value_head_dim), 2, e),
                self._rotary(T * (heads + 1) * rope)]
        return out

    def _dense_mlp(self, prefix: str, ffn: int, tokens: int) -> list[Kernel]:
        m, e, gd = self.model, self.elem, self.gemm_dtype
        f = ffn // self.strategy.tp
        up_n = 2 * f if m.mlp is Mlp.SWIGLU else f
        return [_gemm(f"{prefix}fc1", tokens, up_n, m.hidden, e, gd),
                self._activation(f"{prefix}activation", tokens * f),
                _gemm(f"{prefix}fc2", tokens, m.hidden, f, e, gd)]

    def _moe_mlp(self) -> list[Kernel]:
        """Router, permute, grouped expert GEMMs at the busiest device's rows per expert,
        unpermute; shared experts as a dense MLP over every token (named ``shared_``, they run
        before the dispatch)."""
        m, s, t = self.model, self.strategy, self.training
        e, T, gd = self.elem, self.tokens, self.gemm_dtype
        local_experts = m.num_experts // s.ep
        load = expert_load(self.expert_tokens, m.top_k, m.num_experts, s.ep, t.moe)
        rows = math.ceil(load.tokens_per_expert - 1e-9)
        f = m.expert_ffn // s.expert_tp
        up_n = 2 * f if m.mlp is Mlp.SWIGLU else f
        routed = T * m.top_k * (1.0 - load.dropped_fraction)
        out = [_gemm("router", T, m.num_experts, m.hidden, e, self.dtype),
               # FP32 scores: softmax/sigmoid (read, write), top-k selection (read).
               _elementwise("router_topk", T * m.num_experts, 3, 4.0, OpClass.TRANSCENDENTAL),
               # One copy of each token per chosen expert (read and write).
               _elementwise("permute", routed * m.hidden, 2, e)]
        for j in range(m.shared_experts):
            out += self._dense_mlp(f"shared{j}_", m.shared_ffn, T)
        received = rows * local_experts
        if s.ep > 1:  # the received rows, sorted from source-major to expert-major
            out.append(_elementwise("expert_sort", received * m.hidden, 2, e))
        pad, unpad = self.fp8.expert_padding(
            rows, local_experts, m.hidden, e, fixed_rows=t.moe.pad_to_capacity,
            dispatcher_pads=s.ep_dispatcher is not Dispatcher.ALLTOALL)
        out += pad
        # Transformer Engine's GroupedLinear: one cuBLAS GEMM per local expert.
        out.append(_gemm("expert_fc1", rows, up_n, m.hidden, e, gd, local_experts, local_experts))
        if m.activation_clamp:
            # Megatron-Core (fusions/fused_bias_geglu.py, weighted_bias_quick_geglu_impl, core
            # 0.15-0.17) clamps each half of fc1's output and concatenates them before its fused
            # activation: two clamps (read, write a half each) and a cat (read, write it all).
            out.append(_elementwise("expert_clamp", received * up_n, 4, e, launches=3))
        out += [_elementwise("expert_act", received * f, 3 if m.mlp is Mlp.SWIGLU else 2, e,
                             OpClass.TRANSCENDENTAL),
                _gemm("expert_fc2", rows, m.hidden, f, e, gd, local_experts, local_experts)]
        if m.bias:
            # fc2's bias is returned unadded (skip_bias_add) and applied by TEGroupedMLP's
            # _apply_bias (moe/experts.py, core 0.15-0.17): per local expert, bias x prob
            # (written) and its sum with the expert's rows (read both, write), then one cat
            # of all rows (read, write); fc1's bias rides in the GEMM's epilogue.
            out.append(_elementwise("expert_fc2_bias", received * m.hidden, 6, e,
                                    launches=2 * local_experts + 1))
        out += unpad
        if s.ep > 1:
            out.append(_elementwise("expert_unsort", received * m.hidden, 2, e))
        # Read every expert output and its probability, write the weighted sum per token.
        out.append(_elementwise("unpermute", routed * m.hidden + T * m.hidden, 1, e))
        return out

    def _forward_hybrid(self, i: int) -> LayerWork:
        """A layer of a hybrid stack: pre-norm, its one block, residual. Mamba and attention
        blocks run as the attention part (TP and CP around them), MLP and MoE blocks as the
        MLP part (TP, or EP's dispatch and combine); the other part is empty."""
        m, Tn, e = self.model, self.norm_tokens, self.elem
        kind = m.layer_type(i)
        norm, residual = (self._norm("norm1", Tn * m.hidden),
                          _elementwise("residual1", Tn * m.hidden, 3, e))
        if kind is LayerType.MAMBA:
            return LayerWork(tuple([norm] + self.mamba.forward() + [residual]), ())
        if kind is LayerType.ATTENTION:
            return LayerWork(self._attention_block(i), ())
        mlp = [self._norm("norm2", Tn * m.hidden)]
        mlp += self._moe_mlp() if kind is LayerType.MOE else self._dense_mlp("", m.ffn_hidden,
                                                                           self.tokens)
        mlp.append(_elementwise("residual2", Tn * m.hidden, 3, e))
        return LayerWork((), tuple(mlp))

    def _attention_block(self, i: int) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        e, T, Tn, gd = self.elem, self.tokens, self.norm_tokens, self.gemm_dtype
        attn = [self._norm("norm1", Tn * m.hidden)] + self._projections()
        attn += list(self.attention_core(i))
        attn += [
            _elementwise("attn_out_layout", T * m.attn_out_dim // s.tp, 2, e),
            _gemm("attn_proj", T, m.hidden, m.attn_out_dim // s.tp, e, gd),
            _elementwise("residual1", Tn * m.hidden, 3 + (1.5 if m.dropout else 0), e),
        ]
        return tuple(attn)

    def _forward_plain(self, layer: int | None) -> LayerWork:
        """The forward kernels before FP8 adds its casts."""
        m = self.model
        i = self._layer(layer)
        if m.is_hybrid:
            return self._forward_hybrid(i)
        e, T, Tn = self.elem, self.tokens, self.norm_tokens
        mlp = [self._norm("norm2", Tn * m.hidden)]
        mlp += self._moe_mlp() if m.is_moe_layer(i) else self._dense_mlp("", m.ffn_hidden, T)
        mlp.append(_elementwise("residual2", Tn * m.hidden, 3 + (1.5 if m.dropout else 0), e))
        return LayerWork(self._attention_block(i), tuple(mlp))

    def forward(self, layer: int | None = None) -> LayerWork:
        """One layer's forward kernels on one device for one micro-batch, FP8 casts included
        (``layer``: which layer, where layers differ; None: the last)."""
        plain = self._forward_plain(layer)
        return LayerWork(self.fp8.forward(plain.attention), self.fp8.forward(plain.mlp))

    def backward(self, layer: int | None = None) -> LayerWork:
        """Gradients of one layer: two GEMMs per forward GEMM, 2.5x for flash attention,
        1.5x the traffic for element-wise kernels, and the FP8 casts of output gradients."""
        fwd = self._forward_plain(layer)
        attention = _backward_of(fwd.attention, self.elem)
        if any(k.op_class is OpClass.SSD for k in attention):
            attention = self.mamba.backward(attention)
        return LayerWork(self.fp8.backward(attention),
                         self.fp8.backward(_backward_of(fwd.mlp, self.elem)))

    def recompute(self, layer: int | None = None) -> LayerWork:
        """Forward work redone in backward: the whole layer (full), the attention core
        (selective), every element-wise kernel and every other matmul (op), or nothing."""
        mode = self.strategy.recompute
        if mode is Recompute.FULL:
            return self.forward(layer)
        if mode is Recompute.OP:
            return self._op_recompute(layer)
        if mode is Recompute.MODULES:
            names = {n for module in self.strategy.recompute_modules
                     for n in MODULE_KERNELS[module]}
            block = {k.name for k in self.moe_recompute(layer)}   # rerun as a block of its own
            fwd = self.forward(layer)
            return LayerWork(*(tuple(k for k in part if k.name.split(".")[0] in names
                                     and k.name not in block)
                               for part in (fwd.attention, fwd.mlp)))
        if (mode is Recompute.SELECTIVE and self.training.attention is AttentionKernel.STANDARD
                and self.model.has_attention(self._layer(layer))):
            return LayerWork(self.attention_core(layer), ())
        return LayerWork((), ())

    def moe_recompute(self, layer: int | None = None) -> tuple[Kernel, ...]:
        """The MoE block's forward, rerun before its backward under ``recompute_modules:
        moe``: a MoE layer's MLP kernels but its norm and residual (empty otherwise). The
        builder runs it with its dispatch and combine, as the forward does."""
        s = self.strategy
        if (s.recompute is not Recompute.MODULES or RecomputeModule.MOE not in s.recompute_modules
                or not self.model.is_moe_layer(self._layer(layer))):
            return ()
        return tuple(k for k in self.forward(layer).mlp
                     if k.name.split(".")[0] not in MOE_BLOCK_EDGES)

    def _op_recompute(self, layer: int | None) -> LayerWork:
        """Per-op recompute: the forward's element-wise kernels, the attention core unless a
        fused kernel saved its output, and the matmuls torchtitan does not save."""
        fwd = self._forward_plain(layer)
        e, T, gd = self.elem, self.tokens, self.gemm_dtype
        redo = {name: _gemm(f"recompute_{name}", T, n, k, e, gd)
                for name, n, k in op_recomputed_matmuls(self.model)}
        attention = [k for k in fwd.attention if k.op_class is not OpClass.MATMUL
                     and not (self.training.attention.fused and k.name == "flash_attn")]
        if not self.training.attention.fused:
            attention += [k for k in self.attention_core(layer) if k.op_class is OpClass.MATMUL]
        attention += [k for name, k in redo.items() if name in ATTENTION_MATMULS]
        mlp = [k for k in fwd.mlp if k.op_class is not OpClass.MATMUL]
        mlp += [k for name, k in redo.items() if name not in ATTENTION_MATMULS]
        return LayerWork(self.fp8.forward(tuple(attention)), self.fp8.forward(tuple(mlp)))

    def mtp_input(self) -> tuple[Kernel, ...]:
        """The input of a multi-token-prediction module (DeepSeek-V3 sec. 2.2, eq. (21)): the
        next token's embedding (looked up in the shared table) and the previous depth's hidden
        state, each RMS-normed, concatenated and projected 2h -> h. Its layer, final norm and
        LM head are a layer's and the head's kernels."""
        m, s, e = self.model, self.strategy, self.elem
        return (_elementwise("mtp_embedding", self.norm_tokens * m.hidden, 2, e),
                _elementwise("mtp_norms", 2 * self.norm_tokens * m.hidden, 2, e),
                _gemm("mtp_eh_proj", self.tokens, m.hidden // s.tp, 2 * m.hidden, e,
                      self.gemm_dtype))

    def mtp_input_backward(self) -> tuple[Kernel, ...]:
        return _backward_of(self.mtp_input(), self.elem)

    # --- first and last stage ----------------------------------------------------------
    def embedding_forward(self) -> tuple[Kernel, ...]:
        m = self.model
        passes = 2 + (2 if m.embedding_norm else 0) + (1 if m.dropout else 0)
        return (_elementwise("embedding", self.norm_tokens * m.hidden, passes, self.elem),)

    def embedding_backward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        # Scatter-add of token gradients into the (vocab-parallel) table, plus zeroing it.
        table = vocab_rows(m, s) * m.hidden
        return (_elementwise("embedding.bwd", self.tokens * m.hidden, 2, self.elem),
                _elementwise("embedding.grad_table", table, 1, 4.0))

    def _loss_bytes(self) -> float:
        """Bytes per logit element of one pass of the loss (``CrossEntropy``): FP32 for
        Megatron-Core's and torchtitan's eager losses, the 16-bit logits for TE's fused kernel
        and for the compiled loss (its upcast fused into the passes)."""
        sixteen_bit = (CrossEntropy.TE, CrossEntropy.COMPILED_FP32)
        return self.elem if self.training.cross_entropy in sixteen_bit else 4.0

    def head_forward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        vocab = vocab_rows(m, s)
        return (
            self._norm("final_norm", self.norm_tokens * m.hidden),
            _gemm("lm_head", self.tokens, vocab, m.hidden, self.elem, self.dtype),
            # Three passes over the logits: FP32 cast, softmax (read, write) and loss; TE's
            # fused loss reads them twice and writes the gradient in place.
            _elementwise("cross_entropy", self.tokens * vocab, 3, self._loss_bytes(),
                         OpClass.TRANSCENDENTAL),
        )

    def head_backward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        vocab = vocab_rows(m, s)
        ce = _elementwise("cross_entropy.bwd", self.tokens * vocab, 2, self._loss_bytes(),
                          OpClass.TRANSCENDENTAL)
        norm = (_backward_of(self.head_forward()[:1], self.elem)
                if self._eager_norm else
                (_elementwise("final_norm.bwd", self.norm_tokens * m.hidden, 4, self.elem),))
        return (ce,) + _backward_of(self.head_forward()[1:2], self.elem) + norm

    # --- optimizer -----------------------------------------------------------------------
    def optimizer_step(self, local_params: float) -> tuple[Kernel, ...]:
        """Adam over the parameters this device updates. Mixed precision reads the FP32 master,
        m, v and the gradient and writes master, m, v and the 16-bit copy: 4+4+4+4 in,
        4+4+4+2 out = 30 bytes per parameter; FP32 reads 16 and writes 12."""
        per_param = 30.0 if self.training.precision.mixed else 28.0
        return (Kernel("adam", OpClass.OPTIMIZER, 12.0 * local_params, per_param * local_params,
                       dtype=Dtype.FP32),)


# --- whole-model FLOP counts (for throughput and MFU) ---------------------------------------
def attended_keys(model: TransformerSpec, layer: int, seq_len: int) -> float:
    """Mean keys a query attends to under a causal mask: s/2 for global layers (the
    block-level count flash attention's skipped blocks give), and the exact mean for a
    sliding window (min(p + 1, w) keys at position p) or chunks (its own chunk only)."""
    if model.is_global_attention(layer):
        return seq_len * 0.5
    w, s = model.local_window, seq_len
    if model.local_attention is LocalAttention.SLIDING:
        inside = min(w, s)
        return (inside * (inside + 1) / 2 + (s - inside) * inside) / s
    full, rest = divmod(s, w)
    return (full * w * (w + 1) / 2 + rest * (rest + 1) / 2) / s


def layer_gemm_params(model: TransformerSpec, layer: int) -> float:
    """Weights of the GEMMs one token of layer ``layer`` multiplies (biases and norms left
    out): attention projections, the router, shared experts and top_k routed experts (or the
    dense MLP)."""
    m = model
    h = m.hidden
    kind = m.layer_type(layer)
    if kind is LayerType.MAMBA:   # in_proj and out_proj
        d_inner = m.mamba_heads * m.mamba_head_dim
        return h * (mamba_in_proj_width(m.mamba_heads, m.mamba_head_dim, m.mamba_state,
                                        m.mamba_groups) + d_inner)
    if kind is LayerType.MOE:
        return moe_block_gemm_params(m)
    if kind is LayerType.MLP:
        return (3 if m.mlp is Mlp.SWIGLU else 2) * m.hidden * m.ffn_hidden
    if m.is_mla:
        q = (h * m.q_lora_rank + m.q_lora_rank * m.q_dim) if m.q_lora_rank else h * m.q_dim
        kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim)
              + m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.value_head_dim))
        attention = q + kv + m.attn_out_dim * h
    else:
        attention = h * (m.q_dim + m.kv_dim + m.v_dim) + m.attn_out_dim * h
    if kind is LayerType.ATTENTION:
        return attention
    if m.is_moe_layer(layer):
        return attention + moe_block_gemm_params(m)
    return attention + (3 if m.mlp is Mlp.SWIGLU else 2) * m.hidden * m.ffn_hidden


def moe_block_gemm_params(model: TransformerSpec) -> float:
    """Weights one token of a MoE block multiplies: the router, its top_k routed experts and
    the shared experts."""
    m = model
    width = m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn
    return m.hidden * m.num_experts + (3 if m.mlp is Mlp.SWIGLU else 2) * m.hidden * width


def layer_forward_flops(model: TransformerSpec, layer: int, seq_len: int) -> float:
    """Forward FLOPs per token of one layer, attention counted without the causal saving
    (twice the causal keys), as Narayanan et al. SC'21 eq. (3) and PaLM App. B count it."""
    m = model
    if m.layer_type(layer) is LayerType.MAMBA:   # the projections and the SSD scan
        return 2.0 * layer_gemm_params(m, layer) + ssd_flops_per_token(
            m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups, m.mamba_chunk)
    keys = 2.0 * attended_keys(m, layer, seq_len) if m.has_attention(layer) else 0.0
    attention = 2.0 * keys * m.heads * (m.head_dim + m.value_head_dim)
    return 2.0 * layer_gemm_params(m, layer) + attention


def model_flops_per_token(model: TransformerSpec, seq_len: int) -> float:
    """Forward + backward FLOPs per token without recompute, attention counted in full
    (non-causal) as Narayanan et al. SC'21 eq. (3) and PaLM (Chowdhery et al. 2022, App. B) do.

    For a GPT model this is 72 l h^2 (1 + s/(6h) + V/(12 l h)) per token (eq. (3) without the
    recompute forward). Multi-token-prediction modules add their layer, their 2h x h
    projection and one more LM head each (DeepSeek-V3 sec. 2.2)."""
    m = model
    forward = sum(layer_forward_flops(m, i, seq_len) for i in range(m.layers))
    head = 2.0 * m.hidden * m.vocab
    mtp = m.mtp_layers * (layer_forward_flops(m, m.layers - 1, seq_len)
                          + 2.0 * 2 * m.hidden * m.hidden + head)
    return 3.0 * (forward + head + mtp)


ATTENTION_MATMULS = frozenset(("q_proj", "k_proj", "v_proj", "o_proj"))


def torchtitan_matmuls(model: TransformerSpec) -> list[tuple[str, int, int]]:
    """A dense layer's matmuls in torchtitan's forward order, as (name, n, k) per token:
    the q, k, v and output projections, then w1, w3, w2 (gated MLP) or fc1, fc2."""
    m = model
    mlp = ([("w1", m.ffn_hidden, m.hidden), ("w3", m.ffn_hidden, m.hidden),
            ("w2", m.hidden, m.ffn_hidden)] if m.mlp is Mlp.SWIGLU
           else [("fc1", m.ffn_hidden, m.hidden), ("fc2", m.hidden, m.ffn_hidden)])
    return [("q_proj", m.q_dim, m.hidden), ("k_proj", m.kv_dim, m.hidden),
            ("v_proj", m.v_dim, m.hidden), ("o_proj", m.hidden, m.attn_out_dim)] + mlp


def op_recomputed_matmuls(model: TransformerSpec) -> list[tuple[str, int, int]]:
    """The matmuls per-op recompute runs again: every second one (torchtitan saves the
    outputs of the 1st, 3rd, ... and counts afresh in each layer)."""
    return torchtitan_matmuls(model)[1::2]


def op_saved_matmul_width(model: TransformerSpec, backward_reads_only: bool = False) -> int:
    """Elements per token of the matmul outputs per-op recompute saves.

    Eager PyTorch keeps every output its policy marks ``MUST_SAVE`` (``torch/utils/
    checkpoint.py``, ``_CachingTorchDispatchMode`` stores them as the forward runs). Under
    ``torch.compile`` (``backward_reads_only``) AOTAutograd's min-cut partitioner (``torch/
    _functorch/partitioners.py``) saves only forward values the backward's required nodes
    depend on, the tags forcing the rest to be recomputed: the last matmul, when it is a saved
    one (w2 of a gated MLP, the 7th), feeds only the residual add, whose backward reads neither
    input, so its output is not kept. torchtitan's benchmark measures the difference: Llama 3.1
    8B, 2 x 8,192 tokens, per-op recompute, 77.0 GiB compiled against 82.4 eager on 8 GPUs and
    62.0 against 67.0 on 128 (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3);
    w2's outputs are 32 x 16,384 x 4,096 x 2 bytes = 4.0 GiB, 4.7 GiB reserved."""
    matmuls = torchtitan_matmuls(model)
    saved = matmuls[0::2]
    if backward_reads_only and saved[-1] == matmuls[-1]:
        saved = saved[:-1]
    return sum(n for _, n, _ in saved)


MODULE_KERNELS = {
    RecomputeModule.LAYERNORM: ("norm1", "norm2", "q_norm", "kv_norm"),
    RecomputeModule.MLA_UP_PROJ: ("q_up", "kv_up", "qkv_layout", "rotary"),
    RecomputeModule.MLP: ("fc1", "activation", "fc2"),   # a dense layer's; shared experts are shared*_
    RecomputeModule.MOE_ACT: ("expert_clamp", "expert_act"),   # the checkpointed bias_act_func
    RecomputeModule.MOE: (),
}
"""Forward kernels each recomputed module reruns (their FP8 casts with them); the MoE block
reruns as a block of its own (``LayerOps.moe_recompute``)."""
MOE_BLOCK_EDGES = ("norm2", "residual2")
"""Kernels of a MoE layer's MLP part outside the MoE block that ``moe`` recompute reruns."""


def mla_up_proj_flops_per_token(model: TransformerSpec) -> float:
    """FLOPs per token and layer of MLA's query and key/value up-projections."""
    m = model
    q = m.q_lora_rank * m.heads * m.head_dim if m.q_lora_rank else 0
    return 2.0 * (q + m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.value_head_dim))


def recompute_flops_per_token(model: TransformerSpec, seq_len: int, recompute: Recompute,
                              attention: AttentionKernel,
                              modules: tuple[RecomputeModule, ...] = ()) -> float:
    """Extra forward FLOPs per token that recomputation adds (full: every layer's forward;
    selective with unfused attention: the QK^T and AV products; modules: the MLA
    up-projections, the MoE block's and the dense MLPs' GEMMs, the other modules being
    element-wise)."""
    m = model
    if recompute is Recompute.FULL:
        return sum(layer_forward_flops(m, i, seq_len) for i in range(m.layers))
    core = sum(2.0 * 2.0 * attended_keys(m, i, seq_len) * m.heads
               * (m.head_dim + m.value_head_dim) for i in range(m.layers) if m.has_attention(i))
    if recompute is Recompute.OP:
        gemms = m.layers * sum(2.0 * n * k for _, n, k in op_recomputed_matmuls(m))
        return gemms + (0.0 if attention.fused else core)
    if recompute is Recompute.SELECTIVE and attention is AttentionKernel.STANDARD:
        return core
    if recompute is Recompute.MODULES:
        extra = 0.0
        if RecomputeModule.MLA_UP_PROJ in modules:
            extra += m.layers * mla_up_proj_flops_per_token(m)
        if RecomputeModule.MOE in modules:
            extra += m.moe_layers * 2.0 * moe_block_gemm_params(m)
        if RecomputeModule.MLP in modules:
            dense = sum(1 for i in range(m.layers) if m.has_mlp(i) and not m.is_moe_layer(i))
            extra += dense * 2.0 * m.hidden * m.ffn_hidden * (
                3 if m.mlp is Mlp.SWIGLU else 2)
        return extra
    return 0.0

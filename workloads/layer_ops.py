"""The one home of FLOP and byte formulas: what each kernel of a transformer layer costs.

Sources:
- GEMM FLOPs 2mnk; per-layer forward 24 b s h^2 + 4 b s^2 h for GPT (Narayanan et al. SC'21,
  sec. 5.1, eq. (3)); GQA shrinks the K/V projections to 2 h kv_dim, SwiGLU has 3 GEMMs of h x f.
- Backward = 2x forward for GEMMs (a data-gradient and a weight-gradient GEMM of the same size).
- Fused attention (FlashAttention-2, Dao 2023, sec. 4): forward 4 s^2 d per head, backward 2.5x
  forward (it recomputes the scores), causal masking skips half of the blocks.
- Element-wise kernels (norms, activations, residual/dropout, rotary, cross-entropy, the Adam
  step) are memory-bound: their cost is bytes read + written from HBM.
Kernels describe ONE device's share (after TP/CP/EP splits) for ONE micro-batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.hardware_specs.efficiency import ATTENTION_CLASSES
from clustersim.workloads.model import Mlp, Position, TransformerSpec
from clustersim.workloads.strategy import Recompute, Strategy
from clustersim.workloads.training import AttentionKernel, TrainingSpec


class Pass(enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel: FLOPs, HBM bytes, and the GEMM shape (m x k by k x n, ``batch`` of them)."""

    name: str
    op_class: OpClass
    flops: float
    bytes: float
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    dtype: Dtype = Dtype.BF16
    """Arithmetic format that sets the peak rate (FP8 GEMMs under FP8 training)."""


@dataclass(frozen=True, slots=True)
class LayerWork:
    """A layer's kernels split where tensor-parallel communication sits between them."""

    attention: tuple[Kernel, ...]
    mlp: tuple[Kernel, ...]


def _gemm(name: str, m: int, n: int, k: int, elem: float, dtype: Dtype, batch: int = 1) -> Kernel:
    flops = 2.0 * m * n * k * batch
    traffic = (m * k + k * n + m * n) * elem * batch
    return Kernel(name, OpClass.MATMUL, flops, traffic, m, n, k, batch, dtype)


def _elementwise(name: str, elements: float, passes: float, elem: float,
                 op_class: OpClass = OpClass.ELEMENTWISE) -> Kernel:
    """``passes``: tensors of ``elements`` read or written (a norm reads x, writes y: 2);
    ``op_class`` TRANSCENDENTAL for exp/erf/tanh per element (activations, softmax, loss)."""
    return Kernel(name, op_class, 0.0, elements * passes * elem)


def _backward_of(kernels: tuple[Kernel, ...], elem: float) -> tuple[Kernel, ...]:
    """Gradient kernels: for Y[m,n] = X[m,k] W[k,n], dX = dY W^T (m, k, inner n) and
    dW = X^T dY (k, n, inner m); flash attention backward is 2.5x its forward (FA-2 sec. 4);
    an element-wise kernel's backward reads its saved input and the incoming gradient and
    writes the outgoing one: 1.5x the forward's traffic (3 passes for a 2-pass unary op)."""
    out: list[Kernel] = []
    for k in kernels:
        if k.op_class is OpClass.MATMUL:
            out.append(_gemm(f"{k.name}.dgrad", k.m, k.k, k.n, elem, k.dtype, k.batch))
            out.append(_gemm(f"{k.name}.wgrad", k.k, k.n, k.m, elem, k.dtype, k.batch))
        elif k.op_class in ATTENTION_CLASSES:
            out.append(Kernel(f"{k.name}.bwd", k.op_class, 2.5 * k.flops, 2.0 * k.bytes,
                              k.m, k.n, k.k, k.batch, k.dtype))
        else:
            out.append(Kernel(f"{k.name}.bwd", k.op_class, 2.0 * k.flops, 1.5 * k.bytes))
    return tuple(out)


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
        self.norm_tokens = self.tokens // (s.tp if s.sequence_parallel else 1)
        """Tokens element-wise work runs on (sequence parallelism splits them over TP)."""

    # --- transformer layer -------------------------------------------------------------
    def attention_core(self) -> tuple[Kernel, ...]:
        m, t, s = self.model, self.training, self.strategy
        heads = m.heads // s.tp
        s_q = t.seq_len // s.cp
        b = t.micro_batch
        if t.attention.fused:
            # Causal: the local query block attends to about half of all keys (load-balanced CP).
            flops = 4.0 * b * s_q * t.seq_len * m.head_dim * heads * 0.5
            traffic = (2 * self.tokens * heads * m.head_dim
                       + 2 * self.tokens * max(1, m.kv_heads // s.tp) * m.head_dim) * self.elem
            kind = (OpClass.ATTENTION_FA3 if t.attention is AttentionKernel.FLASH3
                    else OpClass.ATTENTION)
            return (Kernel("flash_attn", kind, flops, traffic, s_q, t.seq_len,
                           m.head_dim, b * heads, self.dtype),)
        scores = float(b * heads * s_q * t.seq_len)
        mask_passes = 3.0 if m.dropout else 0.0  # write mask (1 B ~ half elem), apply: read+write
        return (
            _gemm("attn_scores", s_q, t.seq_len, m.head_dim, self.elem, self.dtype, b * heads),
            _elementwise("softmax", scores, 2.0 + mask_passes, self.elem,
                         OpClass.TRANSCENDENTAL),
            _gemm("attn_values", s_q, m.head_dim, t.seq_len, self.elem, self.dtype, b * heads),
        )

    def forward(self) -> LayerWork:
        """One layer's forward kernels on one device for one micro-batch."""
        m, s = self.model, self.strategy
        e, T, Tn, gd = self.elem, self.tokens, self.norm_tokens, self.gemm_dtype
        qkv = (m.q_dim + 2 * m.kv_dim) // s.tp
        attn = [
            _elementwise("norm1", Tn * m.hidden, 2, e),
            _gemm("qkv", T, qkv, m.hidden, e, gd),
        ]
        # Q, K, V into the head-major layout the attention kernel reads, and its output back.
        attn.append(_elementwise("qkv_layout", T * qkv, 2, e))
        if m.position is Position.ROPE:
            attn.append(_elementwise("rotary", T * (m.q_dim + m.kv_dim) // s.tp, 2, e))
        attn += list(self.attention_core())
        attn += [
            _elementwise("attn_out_layout", T * m.q_dim // s.tp, 2, e),
            _gemm("attn_proj", T, m.hidden, m.q_dim // s.tp, e, gd),
            _elementwise("residual1", Tn * m.hidden, 3 + (1.5 if m.dropout else 0), e),
        ]
        mlp = [_elementwise("norm2", Tn * m.hidden, 2, e)]
        if m.is_moe:
            local_experts = m.num_experts // s.ep
            routed = T * m.top_k * s.ep // m.num_experts  # tokens per local expert, balanced
            f = m.expert_ffn // s.tp
            mlp.append(_gemm("router", T, m.num_experts, m.hidden, e, self.dtype))
            up_n = 2 * f if m.mlp is Mlp.SWIGLU else f
            mlp.append(_gemm("expert_fc1", routed, up_n, m.hidden, e, gd, local_experts))
            mlp.append(_elementwise("expert_act", routed * local_experts * f,
                                    3 if m.mlp is Mlp.SWIGLU else 2, e, OpClass.TRANSCENDENTAL))
            mlp.append(_gemm("expert_fc2", routed, m.hidden, f, e, gd, local_experts))
        else:
            f = m.ffn_hidden // s.tp
            up_n = 2 * f if m.mlp is Mlp.SWIGLU else f
            mlp += [
                _gemm("fc1", T, up_n, m.hidden, e, gd),
                _elementwise("activation", T * f, 3 if m.mlp is Mlp.SWIGLU else 2, e,
                             OpClass.TRANSCENDENTAL),
                _gemm("fc2", T, m.hidden, f, e, gd),
            ]
        mlp.append(_elementwise("residual2", Tn * m.hidden, 3 + (1.5 if m.dropout else 0), e))
        return LayerWork(self._with_fp8_casts(attn), self._with_fp8_casts(mlp))

    def _with_fp8_casts(self, kernels: list[Kernel]) -> tuple[Kernel, ...]:
        """FP8 GEMMs read FP8 operands: each GEMM input and weight is cast, and transposed for
        the backward GEMMs (Transformer Engine's cast-transpose: read 2 B, write 1 B twice)."""
        fp8 = [k for k in kernels if k.op_class is OpClass.MATMUL and k.dtype is Dtype.FP8]
        if not fp8:
            return tuple(kernels)
        elements = sum(k.batch * (k.m * k.k + k.k * k.n) for k in fp8)
        return tuple(kernels) + (Kernel("fp8_cast_transpose", OpClass.ELEMENTWISE, 0.0,
                                        4.0 * elements),)

    def backward(self) -> LayerWork:
        """Gradients of one layer: two GEMMs per forward GEMM, 2.5x for flash attention,
        1.5x the traffic for element-wise kernels."""
        fwd = self.forward()
        return LayerWork(_backward_of(fwd.attention, self.elem), _backward_of(fwd.mlp, self.elem))

    def recompute(self) -> LayerWork:
        """Forward work redone in backward: the whole layer (full), the attention core
        (selective), or nothing."""
        mode = self.strategy.recompute
        if mode is Recompute.FULL:
            return self.forward()
        if mode is Recompute.SELECTIVE and self.training.attention is AttentionKernel.STANDARD:
            return LayerWork(self.attention_core(), ())
        return LayerWork((), ())

    # --- first and last stage ----------------------------------------------------------
    def embedding_forward(self) -> tuple[Kernel, ...]:
        m = self.model
        passes = 2 + (2 if m.embedding_norm else 0) + (1 if m.dropout else 0)
        return (_elementwise("embedding", self.norm_tokens * m.hidden, passes, self.elem),)

    def embedding_backward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        # Scatter-add of token gradients into the (vocab-parallel) table, plus zeroing it.
        table = m.vocab * m.hidden // s.tp
        return (_elementwise("embedding.bwd", self.tokens * m.hidden, 2, self.elem),
                _elementwise("embedding.grad_table", table, 1, 4.0))

    def head_forward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        vocab = m.vocab // s.tp
        return (
            _elementwise("final_norm", self.norm_tokens * m.hidden, 2, self.elem),
            _gemm("lm_head", self.tokens, vocab, m.hidden, self.elem, self.dtype),
            # Cross-entropy in FP32: cast logits, softmax (read, write), loss.
            _elementwise("cross_entropy", self.tokens * vocab, 3, 4.0, OpClass.TRANSCENDENTAL),
        )

    def head_backward(self) -> tuple[Kernel, ...]:
        m, s = self.model, self.strategy
        vocab = m.vocab // s.tp
        ce = _elementwise("cross_entropy.bwd", self.tokens * vocab, 2, 4.0, OpClass.TRANSCENDENTAL)
        return (ce,) + _backward_of(self.head_forward()[1:2], self.elem) + (
            _elementwise("final_norm.bwd", self.norm_tokens * m.hidden, 4, self.elem),)

    # --- optimizer -----------------------------------------------------------------------
    def optimizer_step(self, local_params: float) -> tuple[Kernel, ...]:
        """Adam over the parameters this device updates. Mixed precision reads the FP32 master,
        m, v and the gradient and writes master, m, v and the 16-bit copy: 4+4+4+4 in,
        4+4+4+2 out = 30 bytes per parameter; FP32 reads 16 and writes 12."""
        per_param = 30.0 if self.training.precision.mixed else 28.0
        return (Kernel("adam", OpClass.OPTIMIZER, 12.0 * local_params, per_param * local_params,
                       dtype=Dtype.FP32),)


# --- whole-model FLOP counts (for throughput and MFU) ---------------------------------------
def model_flops_per_token(model: TransformerSpec, seq_len: int) -> float:
    """Forward + backward FLOPs per token without recompute, attention counted in full
    (non-causal) as Narayanan et al. SC'21 eq. (3) and PaLM (Chowdhery et al. 2022, App. B) do.

    For a GPT model this is 72 l h^2 (1 + s/(6h) + V/(12 l h)) per token (eq. (3) without the
    recompute forward)."""
    m = model
    gemm = m.hidden * (m.q_dim + 2 * m.kv_dim) + m.q_dim * m.hidden
    if m.is_moe:
        width = m.top_k * m.expert_ffn
        gemm += m.hidden * m.num_experts
    else:
        width = m.ffn_hidden
    gemm += (3 if m.mlp is Mlp.SWIGLU else 2) * m.hidden * width
    attention = 2.0 * seq_len * m.q_dim  # QK^T and AV: 2 x (2 s q_dim) / 2 per multiply-add
    forward = m.layers * (2.0 * gemm + 2.0 * attention) + 2.0 * m.hidden * m.vocab
    return 3.0 * forward


def recompute_flops_per_token(model: TransformerSpec, seq_len: int, recompute: Recompute,
                              attention: AttentionKernel) -> float:
    """Extra forward FLOPs per token that recomputation adds (full: every layer's forward;
    selective with unfused attention: the QK^T and AV products)."""
    m = model
    layer_fwd = (model_flops_per_token(m, seq_len) / 3.0 - 2.0 * m.hidden * m.vocab) / m.layers
    if recompute is Recompute.FULL:
        return m.layers * layer_fwd
    if recompute is Recompute.SELECTIVE and attention is AttentionKernel.STANDARD:
        return m.layers * 4.0 * seq_len * m.q_dim
    return 0.0

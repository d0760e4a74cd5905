"""Stored activations of one layer of a hybrid Mamba-2 / attention / MoE stack.

Each layer is one pre-norm and one block (``workloads/hybrid.py``); what each block keeps for
its backward, per micro-batch and device, follows the same rules as a transformer layer's
(``workloads/memory.py``, Korthikanti et al. 2022): the norm's input and its output feeding the
first GEMM are whole on each TP rank unless sequence parallelism splits them; the rest is split
over TP. A Mamba-2 mixer trained with Megatron-Core's memory-efficient path (``MambaMixer
._ssm_training`` -> mamba_ssm's ``MambaSplitConv1dScanCombinedFn``, which saves ``zxbcdt``,
``out_x`` and the norm's ``rstd`` and recomputes the conv and the gated norm in backward) keeps
the in_proj output (z, x, B, C, dt), the scan's output before the norm, one FP32 rstd per token
and group, and out_proj's input.
"""

from __future__ import annotations

from clustersim.workloads.hybrid import LayerType, mamba_in_proj_width
from clustersim.workloads.model import Mlp, TransformerSpec


def hybrid_layer_bytes(m: TransformerSpec, layer: int, per: float, e: float, f: float,
                       tp: int, sp: bool, lse: bool) -> tuple[float, float]:
    """(bytes kept, of which the routed experts' fc1 inputs) for layer ``layer``: ``per``
    tokens of this device's sequence shard, ``e`` bytes per 16-bit element, ``f`` per saved
    linear input, ``lse``: a fused attention kernel keeps its FP32 log-sum-exp."""
    kind = m.layer_type(layer)
    h = m.hidden
    first = e if kind is LayerType.MOE else f          # the router's input stays 16-bit
    replicated = (e + first) * per * h                 # norm input, first GEMM's input
    whole = 0.0
    if kind is LayerType.MAMBA:
        heads, p = m.mamba_heads, m.mamba_head_dim
        width = mamba_in_proj_width(heads, p, m.mamba_state, m.mamba_groups)
        split = per * (e * width + e * heads * p + f * heads * p + 4.0 * m.mamba_groups)
    elif kind is LayerType.ATTENTION:
        split = e * per * (m.q_dim + m.kv_dim + m.v_dim + m.attn_out_dim)
        if f != e:
            split += f * per * m.attn_out_dim
        split += 4.0 * per * m.heads if lse else 0.0
    else:
        moe = kind is LayerType.MOE
        ffn = (m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn) if moe else m.ffn_hidden
        split = per * ffn * ((2 * e if m.mlp is Mlp.SWIGLU else e) + f)
        if moe:   # each token's copy for each of its experts
            whole = f * per * m.top_k * h
    return replicated / (tp if sp else 1) + whole + split / tp, whole

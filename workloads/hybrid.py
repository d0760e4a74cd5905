"""Hybrid Mamba-2 / attention / MLP / MoE stacks: Megatron-Core's layer pattern and the Mamba-2
mixer's sizes and FLOPs.

Layer pattern: Megatron-Core's ``hybrid_override_pattern`` (``Symbols`` in Megatron-LM
``megatron/core/models/hybrid/hybrid_layer_allocation.py`` @ d98e8a64; other symbols there, G, D
and the rest, are not modelled and are errors here): one symbol per layer, each
layer one pre-norm and one block with a residual: ``M`` a Mamba-2 mixer, ``*`` self-attention,
``-`` a dense MLP, ``E`` a mixture of experts. Nemotron 3 Nano's is
``MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME`` (Megatron-Bridge
``src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py`` @ 067f987d).

Mamba-2 mixer (Dao & Gu 2024, arXiv 2405.21060, sec. 7.1 and Fig. 6; Megatron-LM
``megatron/core/ssm/mamba_mixer.py`` @ d98e8a64, ``MambaMixer.__init__``): with d_inner =
heads x head_dim, the input projection (fused with the layer's pre-norm) writes z, x, B, C and
dt: h -> 2 d_inner + 2 groups state + heads; a depthwise causal conv1d of ``conv`` taps with a
bias runs over x, B and C (d_inner + 2 groups state channels); dt_bias, A_log and D are one
number per head; a gated RMSNorm of d_inner; the output projection d_inner -> h. TP splits
heads and groups (column-parallel in, row-parallel out).

SSD FLOPs (arXiv 2405.21060 sec. 6, "Hardware-Efficient Algorithm"): the sequence is cut into
chunks of Q; per chunk and head, (1) the diagonal block Y = (L o C B^T) X: C B^T is a Q x Q x N
product (one per group, B and C shared by a group's heads: ``_bmm_chunk_fwd``) and (L o CB) X
a Q x Q x P one; (2) the chunk's state B^T X, N x Q x P; (3) the states passed between chunks,
N x P element-wise per chunk; (4) the off-diagonal output C h, Q x N x P. Per token: 2 Q N per
group, and 2 Q P + 2 N P + 2 N P per head, O(T N^2) in all when N = P = Q, as sec. 6 states.

SSD backward (mamba_ssm ``mamba_ssm/ops/triton/ssd_combined.py``,
``_mamba_chunk_scan_combined_bwd``, state-spaces/mamba 2.2): it first recomputes the forward's
cumsum, C B^T, chunk states and state passing (not the chunk scan), then per chunk and head:
dstates = C^T dout (N x Q x P), the state passing backward (element-wise), dx = (L o CB)^T dout
+ B dstates (Q x Q x P and Q x N x P), dB = x dstates^T (Q x P x N), dC = dout states (Q x P x
N), d(CB) = dout x^T (Q x P x Q), d(L) for dA from dout, x and CB (Q x Q x P), and per group
dB, dC from d(CB) (two Q x Q x N). Per token: 6 Q P + 10 N P per head and 6 Q N per group,
against the forward's 2 Q P + 4 N P and 2 Q N.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from clustersim.hardware_specs import SpecError

if TYPE_CHECKING:   # model.py imports this module
    from clustersim.workloads.model import TransformerSpec


class LayerType(enum.Enum):
    """A layer of a hybrid stack, by its symbol in Megatron-Core's pattern."""

    MAMBA = "M"
    ATTENTION = "*"
    MLP = "-"
    MOE = "E"


def parse_pattern(pattern: str, field: str = "model.hybrid_pattern") -> tuple[LayerType, ...]:
    """The layer types of a Megatron-Core hybrid pattern; an unknown symbol is an error that
    names it and its position (Megatron-Core's ``|`` pipeline splits and ``/`` MTP suffixes
    are not read: say the layout with ``layers_per_stage``)."""
    if not pattern:
        raise SpecError(field, "is empty; one symbol per layer: M (Mamba-2), * (attention), "
                        "- (MLP), E (mixture of experts)")
    out = []
    for i, symbol in enumerate(pattern):
        try:
            out.append(LayerType(symbol))
        except ValueError:
            raise SpecError(field, f"unknown layer symbol {symbol!r} at position {i} of "
                            f"{pattern!r}; known: M (Mamba-2), * (attention), - (MLP), "
                            "E (mixture of experts)") from None
    return tuple(out)


def check_hybrid(m: TransformerSpec, path: str) -> None:
    """A hybrid pattern names every layer, and Mamba layers need a whole mixer."""
    mamba = {"mamba_heads": m.mamba_heads, "mamba_head_dim": m.mamba_head_dim,
             "mamba_state": m.mamba_state, "mamba_groups": m.mamba_groups}
    if not m.hybrid_pattern:
        for key, value in mamba.items():
            if value:
                raise SpecError(f"{path}.{key}", f"{value} needs a hybrid_pattern with M layers")
        return
    kinds = parse_pattern(m.hybrid_pattern, f"{path}.hybrid_pattern")
    if len(kinds) != m.layers:
        raise SpecError(f"{path}.hybrid_pattern", f"has {len(kinds)} symbols for "
                        f"{path}.layers={m.layers}")
    if (LayerType.MOE in kinds) != m.is_moe:
        raise SpecError(f"{path}.hybrid_pattern", "E layers and num_experts > 1 go together")
    for key in ("first_dense_layers", "mtp_layers"):
        if getattr(m, key):
            raise SpecError(f"{path}.{key}", "a hybrid stack says its layers in hybrid_pattern")
    if m.moe_layer_step != 1 or m.local_window:
        raise SpecError(f"{path}.hybrid_pattern", "moe_layer_step and local attention are not "
                        "modelled in a hybrid stack")
    if LayerType.MAMBA in kinds:
        for key, value in mamba.items():
            if value < 1:
                raise SpecError(f"{path}.{key}", f"{value}: M layers need it at least 1")
        if m.mamba_heads % m.mamba_groups:
            raise SpecError(f"{path}.mamba_groups", f"{m.mamba_groups} does not divide "
                            f"{path}.mamba_heads={m.mamba_heads}")


def mamba_d_inner(heads: int, head_dim: int) -> int:
    return heads * head_dim


def mamba_in_proj_width(heads: int, head_dim: int, state: int, groups: int) -> int:
    """Output width of the input projection: z, x (d_inner each), B, C (groups x state each)
    and dt (one per head)."""
    return 2 * heads * head_dim + 2 * groups * state + heads


def mamba_conv_channels(heads: int, head_dim: int, state: int, groups: int) -> int:
    """Channels of the depthwise causal conv1d: x, B and C."""
    return heads * head_dim + 2 * groups * state


def mamba_tensors(hidden: int, heads: int, head_dim: int, state: int, groups: int,
                  conv: int) -> tuple[tuple[int, bool], ...]:
    """The mixer's parameter tensors (size, whether TP splits it) in module order, without the
    layer's pre-norm: in_proj, conv1d weight and bias, dt_bias, A_log, D, the gated norm's
    weight, out_proj. Megatron-Core splits every one over TP (heads and groups)."""
    d_inner = mamba_d_inner(heads, head_dim)
    channels = mamba_conv_channels(heads, head_dim, state, groups)
    sizes = (hidden * mamba_in_proj_width(heads, head_dim, state, groups), channels * conv,
             channels, heads, heads, heads, d_inner, d_inner * hidden)
    return tuple((n, True) for n in sizes)


def ssd_flops_per_token(heads: int, head_dim: int, state: int, groups: int,
                        chunk: int) -> float:
    """Forward FLOPs per token of the SSD chunked scan's four steps (module docstring):
    2 Q N per group for C B^T, and per head 2 Q P for the diagonal block's product with X,
    2 N P for the chunk state and 2 N P for the off-diagonal output; the state passing's
    N P per chunk and head is element-wise (2 N P / Q per token and head)."""
    q, n, p = chunk, state, head_dim
    return groups * 2.0 * q * n + heads * (2.0 * q * p + 4.0 * n * p + 2.0 * n * p / q)


def ssd_backward_flops_per_token(heads: int, head_dim: int, state: int, groups: int,
                                 chunk: int) -> float:
    """Backward FLOPs per token of the SSD scan with its recomputed forward steps (module
    docstring): 6 Q N per group, 6 Q P + 10 N P per head, and the recomputed and backward
    state passing's 2 N P / Q each."""
    q, n, p = chunk, state, head_dim
    return groups * 6.0 * q * n + heads * (6.0 * q * p + 10.0 * n * p + 4.0 * n * p / q)

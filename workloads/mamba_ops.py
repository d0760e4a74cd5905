"""The kernels of a Mamba-2 layer, as Megatron-Core trains it, on one device for one micro-batch.

``MambaMixer.forward`` with ``use_mem_eff_path`` (Megatron-LM ``megatron/core/ssm/
mamba_mixer.py`` @ d98e8a64): in_proj, then mamba_ssm's ``mamba_split_conv1d_scan_combined``
(the causal conv1d with SiLU, the SSD chunked scan's five Triton kernels, the gated RMSNorm),
then out_proj; TP splits heads and groups. SSD FLOPs are the Mamba-2 paper's four steps and the
backward is ``_mamba_chunk_scan_combined_bwd``'s kernels (``workloads/hybrid.py``); each SSD
kernel's bytes are its inputs and outputs: B, C, x and dout at 16 bits, dt and dA, the chunk
states and C B^T in FP32. ``MambaSplitConv1dScanCombinedFn`` saves the in_proj output, not the
conv's, so the backward reruns the conv first.
"""

from __future__ import annotations

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads.hybrid import mamba_conv_channels, mamba_in_proj_width
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.kernels import elementwise as _elementwise
from clustersim.workloads.kernels import gemm as _gemm
from clustersim.workloads.model import TransformerSpec
from clustersim.workloads.strategy import Strategy


class MambaOps:
    """A Mamba-2 mixer's forward and backward kernels on ``tokens`` of one device."""

    def __init__(self, model: TransformerSpec, strategy: Strategy, tokens: int, elem: float,
                 gemm_dtype: Dtype):
        m, s = model, strategy
        self.model, self.tokens, self.elem, self.gemm_dtype = m, tokens, elem, gemm_dtype
        self.heads, self.groups = m.mamba_heads // s.tp, m.mamba_groups // s.tp
        T, e = tokens, elem
        self.bc = T * self.groups * m.mamba_state * e           # B (or C)
        self.x = T * self.heads * m.mamba_head_dim * e           # x, y or dout
        self.dt = T * self.heads * 4.0                           # dt or dA, FP32
        self.states = (T / m.mamba_chunk * self.heads * m.mamba_state * m.mamba_head_dim
                       * 4.0)                                    # one FP32 state per chunk
        self.cb = T * self.groups * m.mamba_chunk * 4.0          # C B^T, FP32

    @property
    def conv_channels(self) -> int:
        m = self.model
        return mamba_conv_channels(self.heads, m.mamba_head_dim, m.mamba_state, self.groups)

    def forward(self) -> list[Kernel]:
        m, e, T, gd = self.model, self.elem, self.tokens, self.gemm_dtype
        d_inner = self.heads * m.mamba_head_dim
        width = mamba_in_proj_width(self.heads, m.mamba_head_dim, m.mamba_state, self.groups)
        return [
            _gemm("in_proj", T, width, m.hidden, e, gd),
            # causal_conv1d_fn over x, B, C with SiLU: read them and the taps, write them.
            _elementwise("conv1d", T * self.conv_channels, 2, e),
            *self.ssd_forward(),
            # RMSNormGated: read y and z, write the normed, gated output.
            _elementwise("mamba_norm", T * d_inner, 3, e),
            _gemm("out_proj", T, m.hidden, d_inner, e, gd),
        ]

    def ssd_forward(self) -> list[Kernel]:
        """The scan's five forward kernels; their FLOPs add up to ``ssd_flops_per_token``
        (and chunk_cumsum's two per token and head)."""
        m, T, ssd = self.model, self.tokens, OpClass.SSD
        h, g, p, n, q = self.heads, self.groups, m.mamba_head_dim, m.mamba_state, m.mamba_chunk
        bc, x, dt, st, cb = self.bc, self.x, self.dt, self.states, self.cb
        return [
            Kernel("ssd_chunk_cumsum", ssd, T * h * 2.0, dt / 2 + 2 * dt),
            Kernel("ssd_chunk_state", ssd, T * h * 2.0 * n * p, bc + x + 2 * dt + st),
            Kernel("ssd_state_passing", ssd, T * h * 2.0 * n * p / q, 2 * st + dt),
            Kernel("ssd_bmm_chunk", ssd, T * g * 2.0 * q * n, 2 * bc + cb),
            Kernel("ssd_chunk_scan", ssd, T * h * (2.0 * q * p + 2.0 * n * p),
                   cb + bc + 2 * x + st + 2 * dt),
        ]

    def ssd_backward(self) -> list[Kernel]:
        """``_mamba_chunk_scan_combined_bwd``: the recomputed forward steps (all but the chunk
        scan), then the backward kernels; FLOPs add up to ``ssd_backward_flops_per_token``
        (and the two cumsums' two per token and head each)."""
        m, T, ssd = self.model, self.tokens, OpClass.SSD
        h, g, p, n, q = self.heads, self.groups, m.mamba_head_dim, m.mamba_state, m.mamba_chunk
        bc, x, dt, st, cb = self.bc, self.x, self.dt, self.states, self.cb
        redo = [Kernel(f"{k.name}.recompute", ssd, k.flops, k.bytes)
                for k in self.ssd_forward() if k.name != "ssd_chunk_scan"]
        return redo + [
            Kernel("ssd_chunk_scan_bwd_dstates", ssd, T * h * 2.0 * n * p, bc + x + st),
            Kernel("ssd_state_passing_bwd", ssd, T * h * 2.0 * n * p / q, 3 * st + dt),
            Kernel("ssd_chunk_scan_chunk_state_bwd_dx", ssd, T * h * (2.0 * q * p + 2.0 * n * p),
                   3 * x + cb + bc + st + 2 * dt),
            Kernel("ssd_chunk_state_bwd_db", ssd, T * h * 2.0 * n * p, x + st + 2 * bc + dt),
            Kernel("ssd_chunk_scan_bwd_dC", ssd, T * h * 2.0 * n * p, st + x + 2 * bc + dt),
            Kernel("ssd_chunk_scan_bwd_dcb", ssd, T * h * 2.0 * q * p, 2 * x + cb + dt),
            Kernel("ssd_bmm_chunk_bwd", ssd, T * g * 4.0 * q * n, 2 * (2 * bc + cb)),
            Kernel("ssd_chunk_scan_bwd_ddAcs_stable", ssd, T * h * 2.0 * q * p,
                   2 * x + cb + 2 * dt),
            Kernel("ssd_chunk_cumsum_bwd", ssd, T * h * 2.0, 3 * dt),
        ]

    def backward(self, generic: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """A Mamba block's gradients from the generic rule's (``kernels.backward_of``): the
        scan's own backward kernels in place of the generic ones, after the conv1d's rerun."""
        scan = [j for j, k in enumerate(generic) if k.op_class is OpClass.SSD]
        before, after = generic[:scan[0]], generic[scan[-1] + 1:]
        redo = (_elementwise("conv1d.recompute", self.tokens * self.conv_channels, 2, self.elem),)
        return before + redo + tuple(self.ssd_backward()) + after

"""Element-wise work as eager PyTorch runs torchtitan's Llama blocks: one kernel per op.

torchtitan writes RMSNorm, the rotary embedding and SwiGLU as sequences of PyTorch ops
(``torchtitan/models/norms.py`` ``RMSNorm`` and ``models/llama/model.py`` ``apply_rotary_emb``
and ``FeedForward`` at 9dec370, the same through 2025). Without ``torch.compile`` each op is
its own kernel that reads and writes whole tensors, in FP32 where the code upcasts; fused
kernels (Transformer Engine, Apex, torch.compile's Inductor) read the input and write the
output once. Bytes per element, forward, 16-bit activations (the backward costs 1.5x, op by op,
as any element-wise op: ``kernels.backward_of``):

- RMSNorm ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``:
  ``float`` 2+4, ``pow`` 4+4, ``mean`` 4, ``x * rsqrt`` 4+4, ``type_as`` 4+2, ``* weight`` 2+2 =
  36 bytes in 6 kernels (the per-row ``+ eps`` and ``rsqrt`` move next to nothing); fused: 4.
- Rotary ``view_as_real(view_as_complex(x.float()) * freqs_cis).type_as(x)`` over Q and K:
  ``float`` 2+4, the complex multiply 4+4, ``type_as`` 4+2 = 20 bytes in 3 kernels; fused: 4.
- SwiGLU ``silu(w1(x)) * w3(x)`` per FFN element: ``silu`` 2+2, the multiply 2+2+2 = 10 bytes
  in 2 kernels; fused: 6.
GELU (``F.gelu``), LayerNorm (``F.layer_norm``) and the residual adds are single kernels either way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EagerOp:
    """An element-wise op as eager PyTorch runs it: bytes per element moved, kernels launched."""

    bytes_per_element: float
    launches: int


RMSNORM = EagerOp(2 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 2 + 2 + 2, 6)
ROTARY = EagerOp(2 + 4 + 4 + 4 + 4 + 2, 3)
SWIGLU = EagerOp(2 + 2 + 2 + 2 + 2, 2)

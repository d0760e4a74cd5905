"""The element-wise work FP8 training adds around its GEMMs, as the frameworks run it.

Only the linear layers' GEMMs run in FP8 (Transformer Engine's ``Linear`` family, torchao's
``Float8Linear``); attention, the LM head, norms and the optimizer stay in 16/32 bits. Every FP8
GEMM operand is quantized from BF16 by a memory-bound kernel:

- Forward, the activation input X: read 2 bytes, write the FP8 copy and, for the weight-gradient
  GEMM, its transpose (Hopper's FP8 tensor cores take only the "TN" layout; MXFP8 on Blackwell
  writes a column-wise scaled copy instead): 2 + 1 + 1 = 4 bytes per element (TE's
  ``cast_transpose``). Under delayed scaling or MXFP8 the norm before the QKV and fc1 GEMMs
  writes FP8 itself (TE ``LayerNormLinear``/``LayerNormMLP``): it writes 1 byte instead of 2
  and a transpose reads and writes 1 byte each, 1 byte more than a BF16 norm.
- Backward, the output gradient dY of every FP8 GEMM: the same 4-byte cast-transpose.
- Weights: cast once per step and reused by every micro-batch (TE's ``is_first_microbatch``
  cache; torchao casts per forward, and torchtitan runs one micro-batch per step); FP8 weights
  (``fp8_param_gather``) need only the transpose, 2 bytes. ZeRO-3 gathers weights each micro-
  batch, and the cast follows each gather (on the local shard before it, with FP8 gathers).
- Current (tensor-wise) scaling reads each tensor once more for its amax before casting
  (2 bytes per element) and cannot fuse the cast into the norm; MXFP8 adds one scale byte
  per 32 elements to each of the two copies.
"""

from __future__ import annotations

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.strategy import Strategy, micro_batches
from clustersim.workloads.training import Fp8Recipe, TrainingSpec

CAST_TRANSPOSE_BYTES = 4.0
"""Read a BF16 element, write it in FP8 twice (row-wise and transposed / column-wise)."""
FUSED_CAST_BYTES = 1.0
"""Extra traffic when the producing norm writes FP8: 1 byte less written, a 1 + 1 byte
transpose more."""
TRANSPOSE_BYTES = 2.0
"""Read and write an FP8 element (FP8 weights still need their transpose on Hopper)."""
AMAX_BYTES = 2.0
"""Current scaling's extra read of the BF16 tensor for its absolute maximum."""
MX_SCALE_BYTES = 2.0 / 32
"""MXFP8: an 8-bit scale per block of 32 elements, for the row-wise and column-wise copies."""
NORM_FED = frozenset(("qkv", "fc1"))
"""GEMMs whose input comes straight from a norm, where delayed scaling fuses the cast."""


class Fp8Casts:
    """Inserts the quantization kernels of one device's FP8 GEMMs, for one micro-batch."""

    def __init__(self, training: TrainingSpec, strategy: Strategy):
        self.recipe = training.fp8_recipe
        self.fp8_params = training.fp8_param_gather
        self.micro = max(1, micro_batches(training, strategy))
        self.zero3 = strategy.zero >= 3
        self.shard = strategy.dp * strategy.cp

    def _per_element(self, fused: bool = False) -> float:
        if self.recipe is Fp8Recipe.TENSORWISE:
            return AMAX_BYTES + CAST_TRANSPOSE_BYTES
        extra = MX_SCALE_BYTES if self.recipe is Fp8Recipe.MXFP8 else 0.0
        return (FUSED_CAST_BYTES if fused else CAST_TRANSPOSE_BYTES) + extra

    def weight_bytes_per_element(self) -> float:
        """Cast traffic per weight element in one micro-batch's forward."""
        if self.zero3:
            # Cast after every gather (forward and backward); with FP8 gathers, on the shard.
            if self.fp8_params:
                return 2 * self._per_element() / self.shard
            return self._per_element()
        per_step = TRANSPOSE_BYTES if self.fp8_params else self._per_element()
        return per_step / self.micro

    def forward(self, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """``kernels`` with a quantization kernel before each FP8 GEMM (its input and weight)."""
        out: list[Kernel] = []
        for k in kernels:
            if _is_fp8_gemm(k):
                inputs = k.batch * k.m * k.k
                weights = k.batch * k.k * k.n
                traffic = (inputs * self._per_element(fused=self._fusable(k))
                           + weights * self.weight_bytes_per_element())
                out.append(Kernel(f"{k.name}.fp8_quantize", OpClass.ELEMENTWISE, 0.0, traffic))
            out.append(k)
        return tuple(out)

    def backward(self, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """``kernels`` (gradient GEMMs from ``backward_of``) with the output gradient's
        quantization before each FP8 data-gradient GEMM (dY[m,n] feeds dgrad and wgrad)."""
        out: list[Kernel] = []
        for k in kernels:
            if _is_fp8_gemm(k) and k.name.endswith(".dgrad"):
                grads = k.batch * k.m * k.k      # dgrad: dY[m, n_fwd] is its m x k operand
                out.append(Kernel(f"{k.name[:-6]}.fp8_quantize_grad", OpClass.ELEMENTWISE, 0.0,
                                  grads * self._per_element()))
            out.append(k)
        return tuple(out)

    def _fusable(self, k: Kernel) -> bool:
        return self.recipe is not Fp8Recipe.TENSORWISE and k.name in NORM_FED


def _is_fp8_gemm(k: Kernel) -> bool:
    return k.op_class is OpClass.MATMUL and k.dtype is Dtype.FP8

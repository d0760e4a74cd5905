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
  cache; torchao casts per forward, and torchtitan runs one micro-batch per step); per-tensor
  FP8 weights (``fp8_param_gather``) need only the transpose, 2 bytes. ZeRO-3 gathers weights
  each micro-batch, and the cast follows each gather (on the local shard before it, with FP8
  gathers).
- MXFP8 weights (``fp8_param_gather`` with ``fp8_recipe: mxfp8``) under Megatron-Core's
  distributed optimizer (ZeRO-1/2) are not gathered in FP8. Megatron-Bridge's MXFP8 preset
  pairs ``fp8_param_gather`` with ``reuse_grad_buf_for_mxfp8_param_ag`` (``bf16_with_mxfp8_
  mixed`` in ``training/mixed_precision.py``, r0.1.0 to v0.6.0; the training config asserts
  the pair whenever Megatron-FSDP is off);
  Megatron-Core (``distributed/param_and_grad_buffer.py``, core_v0.14.0 to core_v0.19.0) then
  gives MXFP8 parameters no parameter buffer of their own: the optimizer writes the updated
  BF16 weights into the gradient buffer (``_copy_main_params_to_param_buffer``), the
  all-gather moves them in BF16 there, and ``_post_param_sync`` copies each gathered slice into
  the ``MXFP8Tensor`` (a full row-wise and column-wise quantisation, once per step; the
  column-wise copy has its own 32-element scale blocks along the other axis, so it cannot be a
  transpose of the row-wise one) and zeroes the buffer for the gradients. The weight is held
  as both MXFP8 copies with their scales (``MXFP8_PARAM_BYTES``) and no 16-bit copy.
- Where FP8 GEMMs take any operand layout (Blackwell's sm_100 and sm_103,
  ``DeviceSpec.fp8_any_layout``), a per-tensor FP8 tensor has no transposed copy: the backward
  reads the row-wise one (TE ``csrc/quantizer.cpp``, v2.8: ``with_transpose = columnwise_usage
  && !nvte_is_non_tn_fp8_gemm_supported()``). Its cast writes 1 byte, not 2; FP8 weights need
  no transpose at all; a norm that writes FP8 leaves nothing to cast. MXFP8's column-wise copy
  is scaled along the other axis and is made on every device.
- Current (tensor-wise) scaling reads each tensor once more for its amax before casting
  (2 bytes per element) and cannot fuse the cast into the norm; MXFP8 adds one scale byte
  per 32 elements to each of the two copies.
- Under sequence parallelism an operand that TP all-gathers (the norm output feeding the QKV
  and fc1 GEMMs; in backward the output gradient of the attention projection and fc2, the
  row-parallel layers) is quantised on the device's own sequence shard and gathered in FP8.
  Per-tensor FP8 gathers only the row-wise copy (Transformer Engine's ``Float8Quantizer`` and
  ``Float8CurrentScalingQuantizer``: ``supports_only_rowwise_all_gather``): the amax and the
  cast run on 1/tp of the elements and the weight gradient's transposed copy is made from the
  gathered FP8 tensor (``update_usage(columnwise_usage=True)``, 1 + 1 bytes per gathered
  element); MXFP8 quantises both copies on the shard and gathers each (TE
  ``layernorm_linear.py`` forward and ``grad_output_preprocess`` in ``module/base.py``).

Grouped expert GEMMs (Transformer Engine's ``GroupedLinear``; read at TE 2.3, 2.9 (the 25.11
containers' release) and 2.13) quantise their input and output gradient one expert slice at a
time (``tex.fused_multi_quantize`` up to 2.4, ``tex.split_quantize`` from 2.5, whose
``multi_tensor_quantize_impl`` in ``pytorch/csrc/extensions/cast.cpp`` runs one fused
``nvte_multi_cast_transpose`` for all experts only under delayed scaling and "quantize kernels
individually" otherwise). One cast is
``nvte_quantize_v2`` under MXFP8; under current scaling
(``Float8CurrentScalingQuantizer::quantize_impl`` in ``pytorch/csrc/quantizer.cpp``) four:
``nvte_compute_amax`` zeroes the amax before its atomic-max reduction (a ``cudaMemsetAsync`` in
``launch_amax_kernel``, ``common/recipe/current_scaling.cu``, TE 2.3-2.7; a one-thread
``zero_amax_kernel`` there from TE 2.8 to 2.18) and then reduces it, then
``nvte_compute_scale_from_amax`` (one thread) and ``nvte_quantize_v2``.
MXFP8 is still cast slice by slice at TE 2.18 (2026-08); NVFP4 has a grouped cast kernel from
TE 2.14 (``QuantizationMethod::FUSED_NVFP4``) and takes one launch here (earlier releases
cast NVFP4 slice by slice as well). Each MXFP8 grouped GEMM first swizzles the scales of both
operands for cuBLAS, one multi-tensor kernel each (``multi_tensor_swizzle_scaling_factors`` in
``te_general_grouped_gemm``). The traffic is the same as one cast of the whole tensor; the
launches are what the split adds. Dense GEMMs keep one launch per cast.

Each expert's rows must be a multiple of the recipe's alignment for the FP8 GEMMs (Megatron-Core
``get_align_size_for_quantization``: 16 for per-tensor FP8, 32 for MXFP8, 128 for NVFP4, in
``fp8_utils.py``/``fp4_utils.py``, core 0.13-0.18). Megatron-Core's ``TEGroupedMLP.forward``
(``transformer/moe/experts.py``, core 0.13-0.18; FP4 as well from 0.17) pads them with TE's
``Fp8Padding`` before fc1 (the permuted tokens and, separately, their probabilities) and
``Fp8Unpadding`` after fc2, each one ``multi_padding`` kernel for all experts
(``common/util/padding.cu``) that copies every row into a fresh buffer; backward runs the
inverse copies. Nothing is copied where every count is already aligned (``Fp8Padding.forward``
returns early): HybridEP pads inside its permute (``pad_multiple``; core 0.18's
``skip_routed_expert_padding`` skips the modules for it and for
``moe_router_padding_for_quantization``, which no Megatron-Bridge Qwen3 or DeepSeek-V3 recipe
of v0.2.0-v0.5.0 sets), and a capacity padded to a multiple of the alignment needs nothing. The
copies are charged to the ``alltoall`` dispatcher only: the ``deepep`` rows here also stand for
HybridEP, which does not copy.

NVFP4 (``precision: nvfp4``; TE ``NVFP4BlockScaling``, NVIDIA arXiv 2509.25149 sec. 4 and TE's
NVFP4 documentation) quantises the same operands of the same GEMMs (fprop, dgrad and wgrad all
run in FP4; Megatron-Bridge's performance recipes keep no layer in BF16,
``first_last_layers_bf16`` False) into E2M1 elements with one E4M3 scale per 16 (0.5 + 1/16
bytes, ``Dtype.NVFP4``) under one FP32 scale per tensor. The per-tensor scale needs the
tensor's amax first (one read, as current scaling; the amax of the Hadamard-transformed copy is
taken in the same pass), then one kernel reads BF16 and writes the row-wise copy and the
column-wise copy for wgrad, the latter after a 16 x 16 random Hadamard transform (applied to
wgrad's operands only), gradients with stochastic rounding: 2 + 2 + 2 x 0.5625 bytes per
element. The transform and the random bits are arithmetic inside that memory-bound pass, not
traffic, and are not costed. Weights use 16 x 16 blocks (one quantisation serves both
layouts) and, with ``fp4_param_gather`` (``fp8_param_gather`` here), need only the transpose.
"""

from __future__ import annotations

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.strategy import Strategy, micro_batches
from clustersim.workloads.training import Fp8Recipe, TrainingSpec

CAST_TRANSPOSE_BYTES = 4.0
"""Read a BF16 element, write it in FP8 twice (row-wise and transposed / column-wise)."""
CAST_BYTES = 3.0
"""Read a BF16 element, write it in FP8 once: a per-tensor cast where FP8 GEMMs take any
layout (``DeviceSpec.fp8_any_layout``), whose backward reads the row-wise copy transposed."""
FUSED_CAST_BYTES = 1.0
"""Extra traffic when the producing norm writes FP8: 1 byte less written, a 1 + 1 byte
transpose more."""
TRANSPOSE_BYTES = 2.0
"""Read and write an FP8 element (FP8 weights still need their transpose on Hopper)."""
AMAX_BYTES = 2.0
"""Current scaling's extra read of the BF16 tensor for its absolute maximum."""
MX_SCALE_BYTES = 2.0 / 32
"""MXFP8: an 8-bit scale per block of 32 elements, for the row-wise and column-wise copies."""
MXFP8_PARAM_BYTES = 2 * Dtype.FP8.bytes + MX_SCALE_BYTES
"""An MXFP8 weight as Transformer Engine keeps it: row-wise and column-wise FP8 copies, each
with one E8M0 scale per 32 elements (see the module docstring)."""
NVFP4_QUANTIZE_BYTES = AMAX_BYTES + 2.0 + 2 * Dtype.NVFP4.bytes
"""NVFP4: the amax read, then read BF16 and write the row-wise and (Hadamard-transformed)
column-wise copies with their E4M3 block scales."""
NVFP4_QUANTIZE_SPEED = 0.70
"""NVFP4 quantisation moves its bytes at 0.70 of the element-wise streaming rate: the Hadamard
transform's 16-point products and the stochastic rounding's random bits cost arithmetic inside
the pass. Transformer Engine's GEMM profiling tutorial (docs/examples/gemm_profiling), B300, a
hidden-4096 layer's 12 GEMMs at 15,872 tokens: autocast minus pre-quantised NVFP4 is
6.453 - 3.764 = 2.689 ms per layer, where NVFP4_QUANTIZE_BYTES over B300's streaming bandwidth
(8 TB/s x 0.84) take 1.894 ms (tests/test_nvfp4.py recomputes it)."""
NVFP4_TRANSPOSE_BYTES = 2 * Dtype.NVFP4.bytes
"""Read and write an NVFP4 weight element with its scales (16 x 16 blocks transpose as they are)."""
NORM_FED = frozenset(("qkv", "fc1", "in_proj"))
"""GEMMs whose input comes straight from a norm, where delayed scaling fuses the cast (a Mamba
layer's in_proj is Transformer Engine's LayerNormColumnParallelLinear, as qkv and fc1 are)."""
SEQUENCE_GATHERED_INPUTS = NORM_FED
"""Column-parallel GEMMs whose input sequence parallelism all-gathers over TP."""
SEQUENCE_GATHERED_GRADS = frozenset(("attn_proj", "fc2", "out_proj"))
"""Row-parallel GEMMs whose output gradient sequence parallelism all-gathers in backward."""
COLUMN_COPY_BYTES = 1.0
"""The transposed FP8 copy a cast-transpose kernel writes (1 byte per element)."""
EXPERT_CAST_KERNELS = {Fp8Recipe.TENSORWISE: 4, Fp8Recipe.MXFP8: 1}
"""Kernels of one expert slice's cast in ``GroupedLinear`` (see the module docstring): the amax
zeroing, the amax, the scale and the cast under current scaling; the cast alone under MXFP8.
Delayed scaling casts every expert in one kernel."""
EXPERT_ROW_ALIGNMENT = {Fp8Recipe.DELAYED: 16, Fp8Recipe.TENSORWISE: 16, Fp8Recipe.MXFP8: 32}
"""Rows each expert's FP8 GEMM needs a multiple of (Megatron-Core ``get_fp8_align_size``)."""
NVFP4_EXPERT_ROW_ALIGNMENT = 128
"""Megatron-Core ``get_fp4_align_size`` (fp4_utils.py, core 0.17): 128."""
MXFP8_SWIZZLES_PER_GEMM = 2
"""One scale-swizzle kernel per operand of an MXFP8 grouped GEMM."""


class Fp8Casts:
    """Inserts the quantization kernels of one device's FP8 GEMMs, for one micro-batch."""

    def __init__(self, training: TrainingSpec, strategy: Strategy):
        self.recipe = training.fp8_recipe
        self.quantized = training.precision.gemm_dtype in QUANTIZED_GEMM_DTYPES
        self.nvfp4 = training.precision.gemm_dtype is Dtype.NVFP4
        self.fp8_params = training.fp8_param_gather
        self.transposes = training.fp8_transposed_copies
        """Per-tensor FP8 tensors get a transposed copy (TN-only FP8 GEMMs, Hopper)."""
        self.mx_params = mxfp8_params(training)
        """MXFP8 weights are quantised in full from 16 bits each step (module docstring)."""
        self.micro = max(1, micro_batches(training, strategy))
        self.zero3 = strategy.zero >= 3
        self.shard = strategy.dp * strategy.cp
        self.sequence_split = strategy.sequence_split if training.fp8_saved_inputs else 1
        """Transformer Engine's shard-then-gather placement (see the module docstring);
        torchao's float8 (``fp8_saved_inputs: false``) keeps its casts on the gathered tensor,
        its own placement not having been checked against its source."""

    def _per_element(self, fused: bool = False) -> float:
        if self.nvfp4:
            return NVFP4_QUANTIZE_BYTES / NVFP4_QUANTIZE_SPEED
        if self.recipe is Fp8Recipe.MXFP8:
            return (FUSED_CAST_BYTES if fused else CAST_TRANSPOSE_BYTES) + MX_SCALE_BYTES
        cast = CAST_TRANSPOSE_BYTES if self.transposes else CAST_BYTES
        if self.recipe is Fp8Recipe.TENSORWISE:
            return AMAX_BYTES + cast
        if fused:   # the norm writes FP8; only the transpose remains, where one is kept
            return FUSED_CAST_BYTES if self.transposes else 0.0
        return cast

    def weight_bytes_per_element(self) -> float:
        """Cast traffic per weight element in one micro-batch's forward."""
        if self.zero3:
            # Cast after every gather (forward and backward); with FP8 gathers, on the shard.
            if self.fp8_params:
                return 2 * self._per_element() / self.shard
            return self._per_element()
        if self.nvfp4:
            transpose = NVFP4_TRANSPOSE_BYTES
        else:
            transpose = TRANSPOSE_BYTES if self.transposes else 0.0
        quantized_copy = self.fp8_params and not self.mx_params
        per_step = transpose if quantized_copy else self._per_element()
        return per_step / self.micro

    def forward(self, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """``kernels`` with a quantization kernel before each FP8 GEMM (its input and weight)."""
        out: list[Kernel] = []
        for k in kernels:
            if _is_quantized_gemm(k):
                inputs = k.batch * k.m * k.k
                weights = k.batch * k.k * k.n
                per_input = self._per_element(fused=self._fusable(k))
                if k.name in SEQUENCE_GATHERED_INPUTS:
                    per_input = self._gathered(per_input, fused=self._fusable(k))
                traffic = inputs * per_input + weights * self.weight_bytes_per_element()
                out.append(Kernel(f"{k.name}.fp8_quantize", OpClass.ELEMENTWISE, 0.0, traffic,
                                  launches=self.cast_launches(k, gemms=1)))
            out.append(k)
        return tuple(out)

    def backward(self, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """``kernels`` (gradient GEMMs from ``backward_of``) with the output gradient's
        quantization before each FP8 data-gradient GEMM (dY[m,n] feeds dgrad and wgrad)."""
        out: list[Kernel] = []
        for k in kernels:
            if _is_quantized_gemm(k) and k.name.endswith(".dgrad"):
                grads = k.batch * k.m * k.k      # dgrad: dY[m, n_fwd] is its m x k operand
                layer = k.name[:-6]
                per_grad = self._per_element()
                if layer in SEQUENCE_GATHERED_GRADS:
                    per_grad = self._gathered(per_grad, fused=False)
                out.append(Kernel(f"{layer}.fp8_quantize_grad", OpClass.ELEMENTWISE, 0.0,
                                  grads * per_grad, launches=self.cast_launches(k, gemms=2)))
            out.append(k)
        return tuple(out)

    def cast_launches(self, k: Kernel, gemms: int) -> int:
        """Kernels that quantise one operand of ``k`` and prepare the ``gemms`` grouped GEMMs
        that use it (forward: fprop; backward: dgrad and wgrad): one for a dense GEMM (or all
        experts at once under delayed scaling or NVFP4), else each expert's cast kernels and,
        under MXFP8, the scale swizzles (see the module docstring)."""
        per_cast = 0 if self.nvfp4 else EXPERT_CAST_KERNELS.get(self.recipe, 0)
        if k.launches == 1 or not per_cast:
            return 1
        swizzles = MXFP8_SWIZZLES_PER_GEMM * gemms if self.recipe is Fp8Recipe.MXFP8 else 0
        return k.launches * per_cast + swizzles

    def row_alignment(self) -> int:
        """Rows each expert's quantised GEMM needs a multiple of (see the module docstring)."""
        if self.nvfp4:
            return NVFP4_EXPERT_ROW_ALIGNMENT
        return EXPERT_ROW_ALIGNMENT[self.recipe]

    def expert_padding(self, rows: int, experts: int, hidden: int, elem: float, *,
                       fixed_rows: bool, dispatcher_pads: bool
                       ) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
        """``TEGroupedMLP``'s padding before fc1 and unpadding after fc2 of ``experts`` local
        experts' ``rows`` each (see the module docstring): each copies every row of ``hidden``
        (read and write); the padding copies the probabilities as well, in a kernel of its own
        whose one value per row is not counted as traffic. Nothing where the dispatcher pads,
        or where every expert computes a fixed number of rows (a padded capacity) that is a
        multiple of the alignment; dropless counts are whatever routing gives."""
        if (not self.quantized or dispatcher_pads
                or (fixed_rows and rows % self.row_alignment() == 0)):
            return (), ()
        received = rows * experts
        pad = Kernel("expert_fp8_pad", OpClass.ELEMENTWISE, 0.0, 2 * received * hidden * elem,
                     launches=2)
        unpad = Kernel("expert_fp8_unpad", OpClass.ELEMENTWISE, 0.0, 2 * received * hidden * elem)
        return (pad,), (unpad,)

    def _gathered(self, per_element: float, fused: bool) -> float:
        """Cast traffic per gathered element of an operand that sequence parallelism
        all-gathers over TP (see the module docstring): unchanged without sequence parallelism
        and for NVFP4, whose gather this model does not follow."""
        split = self.sequence_split
        if split == 1 or self.nvfp4:
            return per_element
        if self.recipe is Fp8Recipe.MXFP8 or not self.transposes:
            return per_element / split
        # The fused norm's copy is a separate 1 + 1 byte transpose; a cast-transpose writes
        # its transposed copy in the same pass (1 byte). Either is made after the gather.
        column = TRANSPOSE_BYTES if fused else COLUMN_COPY_BYTES
        return (per_element - column) / split + TRANSPOSE_BYTES

    def _fusable(self, k: Kernel) -> bool:
        return (not self.nvfp4 and self.recipe is not Fp8Recipe.TENSORWISE
                and k.name in NORM_FED)


QUANTIZED_GEMM_DTYPES = frozenset((Dtype.FP8, Dtype.NVFP4))


def mxfp8_params(training: TrainingSpec) -> bool:
    """Weights kept as MXFP8 tensors (``fp8_param_gather`` under the MXFP8 recipe)."""
    return (training.fp8_param_gather and training.precision.gemm_dtype is Dtype.FP8
            and training.fp8_recipe is Fp8Recipe.MXFP8)


def stored_weight_bytes(training: TrainingSpec) -> float | None:
    """Bytes per element of a weight kept in the GEMM format (``fp8_param_gather``), or None
    for 16-bit weights: MXFP8's two scaled copies, else one FP8 or NVFP4 copy."""
    if not training.fp8_param_gather:
        return None
    return MXFP8_PARAM_BYTES if mxfp8_params(training) else training.precision.gemm_dtype.bytes


def weight_copy_bytes(training: TrainingSpec) -> float:
    """Bytes per GEMM-weight element that a per-tensor FP8 weight (``fp8_param_gather``) keeps
    beside it: its transpose, where FP8 GEMMs are TN only (Transformer Engine's
    ``Float8TensorBase.update_usage`` keeps ``_transpose`` for the backward's data-gradient GEMM
    unless ``is_non_tn_fp8_gemm_supported()``; ``tensor/_internal/float8_tensor_base.py``,
    v2.8). MXFP8 weights already hold both copies (``MXFP8_PARAM_BYTES``); NVFP4 weights keep a
    column-wise copy of their own size. Not counted: the quantised copy that a module with
    16-bit weights caches from the first micro-batch on (``get_weight_workspace`` with
    ``cache_name="weight"``): whether it stays resident under the frameworks' settings is not
    established (NeMo 24.07's Nemotron-4 340B H100 row ran in 80 GB, where it would put the
    model at 87 GiB)."""
    if not (training.precision.quantized and training.fp8_param_gather):
        return 0.0
    if training.precision.gemm_dtype is Dtype.NVFP4:
        return Dtype.NVFP4.bytes
    if mxfp8_params(training) or not training.fp8_transposed_copies:
        return 0.0
    return Dtype.FP8.bytes


def gathered_weight_bytes(training: TrainingSpec, strategy: Strategy) -> float | None:
    """Bytes per element of a weight all-gathered in the GEMM format, or None where weights
    are gathered in 16 bits: MXFP8 weights under the distributed optimizer (ZeRO-1/2) travel
    in BF16 through the gradient buffer (see the module docstring)."""
    if not training.fp8_param_gather or (mxfp8_params(training) and 1 <= strategy.zero <= 2):
        return None
    return training.precision.gemm_dtype.bytes


def _is_quantized_gemm(k: Kernel) -> bool:
    return k.op_class is OpClass.MATMUL and k.dtype in QUANTIZED_GEMM_DTYPES

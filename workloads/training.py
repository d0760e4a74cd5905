"""What one optimizer step processes, and in which arithmetic."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.hardware_specs import Dtype, SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.workloads.routing import MoeRouting, RouterBalance


class Precision(enum.Enum):
    """Training precision: FP8 and NVFP4 run the linear layers' GEMMs in that format
    (Transformer Engine) and the rest in BF16."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    """Blackwell's FP4 training recipe (TE ``NVFP4BlockScaling``; Megatron ``--fp4-format e2m1
    --fp4-recipe nvfp4``; NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv
    2509.25149): fprop, dgrad and wgrad of every linear layer in NVFP4 (``workloads/fp8.py``
    has its quantisation kernels); attention, the LM head, norms and the optimizer in BF16/FP32."""

    @property
    def gemm_dtype(self) -> Dtype:
        return {Precision.FP32: Dtype.FP32, Precision.FP16: Dtype.FP16,
                Precision.BF16: Dtype.BF16, Precision.FP8: Dtype.FP8,
                Precision.NVFP4: Dtype.NVFP4}[self]

    @property
    def quantized(self) -> bool:
        """GEMM operands quantised from BF16 by extra kernels (FP8, NVFP4)."""
        return self in (Precision.FP8, Precision.NVFP4)

    @property
    def compute_dtype(self) -> Dtype:
        """Arithmetic of non-GEMM work (attention, norms)."""
        return Dtype.FP32 if self is Precision.FP32 else (
            Dtype.FP16 if self is Precision.FP16 else Dtype.BF16)

    @property
    def activation_bytes(self) -> float:
        """Bytes of one stored activation or communicated element."""
        return 4.0 if self is Precision.FP32 else 2.0

    @property
    def mixed(self) -> bool:
        """Low-precision weights with an FP32 master copy (ZeRO's 2 + 2 + 12 bytes)."""
        return self is not Precision.FP32


class Fp8Recipe(enum.Enum):
    """How FP8 GEMM operands get their scales: what extra element-wise work each cast costs.

    Sources: Transformer Engine's recipes (``DelayedScaling``, ``Float8CurrentScaling``,
    ``MXFP8BlockScaling``, TE 2.x ``transformer_engine.common.recipe``), torchao's float8
    ``tensorwise`` scaling (torchtitan ``--float8``)."""

    DELAYED = "delayed"
    """Per-tensor scale from the amax history of earlier steps: the casting kernel records the
    amax as it writes, so a norm can write its output in FP8 directly (TE ``LayerNormLinear``)."""
    TENSORWISE = "tensorwise"
    """Per-tensor current scaling (TE ``Float8CurrentScaling``, torchao tensorwise): the scale
    needs the amax of the whole tensor first, one extra read of every tensor cast."""
    MXFP8 = "mxfp8"
    """Blackwell block scaling: one power-of-two scale per 32 elements, computed in the casting
    pass; each operand is written row-wise and column-wise with its scales (OCP MX v1.0)."""


class CrossEntropy(enum.Enum):
    """How the loss turns the LM head's logits into a loss: what it holds at its peak."""

    FUSED = "fused"
    """Megatron-Core's vocabulary-parallel cross-entropy: one FP32 copy of the logits, turned
    into the softmax in place and kept for the backward (4 bytes per logit)."""
    TE = "te"
    """Transformer Engine's fused parallel cross-entropy (``cross_entropy_fusion_impl: te``,
    the Megatron-Bridge performance recipes; TE's Triton kernels, ``pytorch/triton/
    cross_entropy.py`` at v2.8): an online-softmax pass reads the 16-bit logits, a second pass
    reads them again and writes the gradient in place, kept in the 16-bit logits buffer for the
    backward (2 bytes per logit), which scales it in place (TE wrote the gradient in FP32 only
    from July 2026, PR #3193)."""
    EAGER_FP32 = "eager_fp32"
    """torchtitan's ``cross_entropy(logits.float(), labels)`` in eager PyTorch (its loss is not
    compiled, torchtitan 9dec370 ``train.py``): the log-probabilities, the gradient nll_loss's
    backward writes and log_softmax's input gradient, three FP32 tensors at once (12 bytes per
    logit); under TP, ``loss_parallel``'s DTensor backward adds ``exp(x)`` and the sum before
    its product (four, 16 bytes; torch/distributed/tensor/parallel/loss.py)."""
    COMPILED_FP32 = "compiled_fp32"
    """The same loss under ``torch.compile``, as torchtitan runs it with ``--training.compile``
    (#642, October 2024, turned off by e8977b0 in December 2024 and on again by #1033,
    bbb1b616e, 2025-04-02: ``components/loss.py``). #642 moved the FP32 upcast into the loss
    "so that forward and backward casts can be fused with the loss forward and backward"
    (``docs/composability.md``), and #1033 measured less memory. AOTAutograd's min-cut
    partitioner (``torch/_functorch/partitioners.py``) saves the cheapest cut, the 16-bit
    input (2 bytes per logit, kept) rather than the FP32 log-probabilities, and recomputes the
    element-wise upcast and softmax inside the backward's fused kernel, which writes the 16-bit
    gradient beside them (the peak, 2 more). Without TP only: ``loss_parallel``'s DTensor loss
    under compile is not modelled."""


class Optimizer(enum.Enum):
    ADAM = "adam"


class AttentionKernel(enum.Enum):
    FLASH = "flash"
    """Fused attention (FlashAttention): no s x s matrix in memory, causal blocks skipped."""
    STANDARD = "standard"
    """Unfused softmax(QK^T)V: stores the score matrix (Korthikanti's 5as/h term)."""
    FLASH3 = "flash3"
    """FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608) or Transformer Engine's cuDNN fused
    attention on Hopper: FlashAttention's memory, a faster kernel where the device has one."""
    CUDNN_2024 = "cudnn_2024"
    """Transformer Engine 1.x's cuDNN fused attention as cuDNN 9.0 ran it on Hopper (early 2024,
    before FlashAttention-3): FlashAttention's memory, FlashAttention-2's kernel sped up by what
    Transformer Engine measured between the two; elsewhere Transformer Engine picked
    FlashAttention-2."""

    @property
    def fused(self) -> bool:
        return self is not AttentionKernel.STANDARD


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSpec:
    seq_len: int
    global_batch: int
    """Sequences per optimizer step."""
    micro_batch: int = 1
    """Sequences per forward/backward pass of one pipeline (one DP replica)."""
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAM
    attention: AttentionKernel = AttentionKernel.FLASH
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """Scaling of FP8 GEMM operands (with ``precision: fp8`` only)."""
    fp8_param_gather: bool = False
    """Weights kept and all-gathered in the GEMM format (Megatron ``--fp8-param-gather`` and,
    under NVFP4, ``fp4_param_gather``; FSDP2's float8 all-gather in torchtitan): no per-step
    weight cast, fewer gathered bytes."""
    fp8_saved_inputs: bool = True
    """Linear layers keep their FP8-cast inputs for the backward pass (Transformer Engine,
    Megatron-Core, NeMo); false for torchao's float8 (torchtitan), which keeps the 16-bit
    inputs and casts them again in the backward."""
    fp8_transposed_copies: bool = True
    """FP8 tensors that a backward GEMM reads transposed are also kept transposed, as on Hopper,
    whose FP8 tensor cores take only the "TN" layout; false where every device's FP8 GEMMs take
    any layout. Not a config field: read from the cluster's devices (``fp8_any_layout``) when a
    config is loaded (``analysis/config.with_fp8_layouts``)."""
    cross_entropy: CrossEntropy = CrossEntropy.FUSED
    """The loss kernel (its memory at the head's peak)."""
    compiled: bool = False
    """Transformer blocks under ``torch.compile`` (torchtitan's ``--training.compile``, each
    block compiled after activation checkpointing wraps it): AOTAutograd's partitioner saves,
    of what per-op recompute marks to keep, only what the backward reads (``layer_ops.
    op_saved_matmul_width``). Memory only: step times do not change with it."""
    eager_elementwise: bool = False
    """RMSNorm, the rotary embedding and SwiGLU run as torchtitan's model code writes them, one
    eager PyTorch kernel per op (``workloads/eager_ops.py``): torchtitan without
    ``torch.compile``. False: fused kernels (Transformer Engine, Apex, torch.compile)."""
    fp32_grad_reduce: bool = False
    """Gradients reduced and accumulated in FP32 (torchtitan's FSDP2 ``MixedPrecisionPolicy``
    with ``reduce_dtype=float32``, its ``mixed_precision_reduce`` default): FP32 reduce-scatter
    inputs, 4 bytes per element on the wire, FP32 unsharded gradient accumulation under PP."""
    pp_microbatch_buffers: bool = False
    """PyTorch's pipelining as torch 2.6 (December 2024) ran it under torchtitan: a receive
    buffer per micro-batch for a stage's input and for its output's gradient, each input
    gradient and every output kept until the step ends (``workloads/pipelining_memory.py``;
    pytorch/pytorch#153383, May 2025, kept the last stage's outputs only, torchtitan #1922,
    October 2025, stopped keeping those). False: one send and one receive buffer."""
    moe: MoeRouting = MoeRouting()
    """How a mixture of experts routes: capacity factor (dropless by default), expert skew or
    the balance that sets it."""

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "global_batch": self.global_batch,
                "micro_batch": self.micro_batch, "precision": self.precision.value,
                "optimizer": self.optimizer.value, "attention": self.attention.value,
                "fp8_recipe": self.fp8_recipe.value, "fp8_param_gather": self.fp8_param_gather,
                "fp8_saved_inputs": self.fp8_saved_inputs,
                "cross_entropy": self.cross_entropy.value, "compiled": self.compiled,
                "eager_elementwise": self.eager_elementwise,
                "fp32_grad_reduce": self.fp32_grad_reduce,
                "pp_microbatch_buffers": self.pp_microbatch_buffers,
                "moe": {"capacity_factor": self.moe.capacity_factor,
                        "pad_to_capacity": self.moe.pad_to_capacity,
                        "expert_skew": self.moe.expert_skew,
                        "balance": self.moe.balance.value}}


DEVICE_RESOLVED = frozenset(("fp8_transposed_copies",))
"""TrainingSpec fields set from the cluster's devices, not read from a config."""


def training_from_mapping(data: Mapping, path: str = "training") -> TrainingSpec:
    f = Fields(data, path).only(set(TrainingSpec.__dataclass_fields__) - DEVICE_RESOLVED)
    spec = TrainingSpec(
        seq_len=f.integer("seq_len", minimum=1),
        global_batch=f.integer("global_batch", minimum=1),
        micro_batch=f.integer("micro_batch", 1, minimum=1),
        precision=f.choice("precision", Precision, Precision.BF16),
        optimizer=f.choice("optimizer", Optimizer, Optimizer.ADAM),
        attention=f.choice("attention", AttentionKernel, AttentionKernel.FLASH),
        fp8_recipe=f.choice("fp8_recipe", Fp8Recipe, Fp8Recipe.DELAYED),
        fp8_param_gather=f.boolean("fp8_param_gather", False),
        fp8_saved_inputs=f.boolean("fp8_saved_inputs", True),
        cross_entropy=f.choice("cross_entropy", CrossEntropy, CrossEntropy.FUSED),
        compiled=f.boolean("compiled", False),
        eager_elementwise=f.boolean("eager_elementwise", False),
        fp32_grad_reduce=f.boolean("fp32_grad_reduce", False),
        pp_microbatch_buffers=f.boolean("pp_microbatch_buffers", False),
        moe=_routing(f.sub("moe")),
    )
    f.done()
    if f.has("fp8_recipe") and spec.precision is not Precision.FP8:
        raise SpecError(f"{path}.fp8_recipe", f"needs precision: fp8, got "
                        f"{spec.precision.value}")
    quantized_only = [k for k in ("fp8_param_gather", "fp8_saved_inputs") if f.has(k)]
    if quantized_only and not spec.precision.quantized:
        raise SpecError(f"{path}.{quantized_only[0]}", f"needs precision: fp8 or nvfp4, got "
                        f"{spec.precision.value}")
    if spec.micro_batch > spec.global_batch:
        raise SpecError(f"{path}.micro_batch", f"{spec.micro_batch} exceeds "
                        f"{path}.global_batch={spec.global_batch}")
    return spec


def _routing(f: Fields) -> MoeRouting:
    routing = MoeRouting(capacity_factor=f.number("capacity_factor", 0.0, minimum=0.0),
                         pad_to_capacity=f.boolean("pad_to_capacity", False),
                         expert_skew=f.number("expert_skew", 0.0, minimum=0.0),
                         balance=f.choice("balance", RouterBalance, RouterBalance.UNIFORM))
    f.done()
    return routing.check(f.path)

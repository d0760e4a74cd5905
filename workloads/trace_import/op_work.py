"""What an operator recorded by a profiler computes: its op class and the work of its kernels,
from the operator's name and the input shapes the profiler keeps (``record_shapes``).

The work is what the simulator needs to re-time a measured op on another device (the ratio of
the two devices' modelled times for these kernels); the measured duration stays the op's time
on the device that recorded it.
- GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``): 2 m n k FLOPs, operands and result read or
  written once.
- Fused attention (PyTorch's ``_scaled_dot_product_*_attention`` kernels): 4 b h s_q s_k d
  FLOPs forward (scores and values, 2 FLOPs per multiply-add), half of it under a causal mask,
  2.5x forward for the backward (FlashAttention-2, Dao 2023, sec. 4, as ``layer_ops`` counts).
- Everything else is memory-bound: the bytes of its tensor inputs read plus its first input
  written; ``exp``/``erf``/``tanh``-class math (activations, softmax, losses) is transcendental,
  fused optimizer steps (``_fused_adam``...) are optimizer work.
Shape-only operators (views, ``empty``, ``t``...) do no work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads.layer_ops import Kernel

ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1, "c10::complex<float>": 8,
    # NCCL's record_param_comms ``dtype`` spelling
    "float32": 4, "float64": 8, "half": 2, "bfloat16": 2, "long": 8, "int32": 4, "int64": 8,
    "byte": 1, "char": 1, "float16": 2,
}
"""Bytes per element by the type names torch.profiler writes (``Input type``, ``dtype``)."""

DTYPE_OF = {"c10::half": Dtype.FP16, "c10::bfloat16": Dtype.BF16, "half": Dtype.FP16,
            "bfloat16": Dtype.BF16, "float16": Dtype.FP16, "c10::float8_e4m3fn": Dtype.FP8,
            "c10::float8_e5m2": Dtype.FP8}
"""Arithmetic format of a GEMM by its input type; anything else runs at FP32 rates."""

_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
"""GEMM operator -> positions of its two operands among the inputs."""
_ATTENTION = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient",
              "aten::_scaled_dot_product_cudnn", "aten::_flash_attention")
_TRANSCENDENTAL = ("gelu", "softmax", "exp", "log", "tanh", "erf", "silu", "sigmoid",
                   "cross_entropy", "nll_loss", "pow", "rsqrt", "sqrt")
_OPTIMIZER = ("_fused_adam", "_fused_adamw", "_fused_sgd", "_foreach_")
SHAPE_ONLY = frozenset((
    "aten::view", "aten::as_strided", "aten::transpose", "aten::t", "aten::reshape",
    "aten::permute", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::detach",
    "detach", "aten::expand", "aten::select", "aten::slice", "aten::unsqueeze", "aten::squeeze",
    "aten::alias", "aten::resolve_conj", "aten::resolve_neg", "aten::_unsafe_view", "aten::unbind",
    "aten::split", "aten::chunk", "aten::narrow", "aten::lift_fresh", "aten::_reshape_alias",
    "aten::resize_", "aten::set_", "aten::result_type", "aten::is_nonzero", "aten::item",
    "aten::_local_scalar_dense", "aten::contiguous", "aten::to", "aten::expand_as",
    "aten::view_as", "aten::zeros_like",
))


def element_bytes(type_name: str) -> int:
    """Bytes of one element of ``type_name`` (unknown names count as 4, a float)."""
    return ELEMENT_BYTES.get(type_name.strip().lower(), 4)


def _tensor_dims(dims: Sequence, types: Sequence[str]) -> list[tuple[list[int], str]]:
    """The tensor inputs among an op's inputs: (shape, type); tensor lists are flattened."""
    out = []
    for d, t in zip(dims, types):
        if t in ("", "Scalar", "ScalarList", "None", "GenericList", "Device", "String"):
            continue
        if t == "TensorList":
            out += [(list(x), "float") for x in d if isinstance(x, list)]
        elif isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append((list(d), t))
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def tensor_bytes(dims: Sequence, types: Sequence[str]) -> float:
    """Bytes of all tensor inputs of an op."""
    return float(sum(_numel(s) * element_bytes(t) for s, t in _tensor_dims(dims, types)))


def op_class(name: str) -> OpClass:
    low = name.lower()
    if name in _GEMMS:
        return OpClass.MATMUL
    if name.startswith(_ATTENTION):
        return OpClass.ATTENTION
    if any(k in low for k in _OPTIMIZER):
        return OpClass.OPTIMIZER
    if any(k in low for k in _TRANSCENDENTAL):
        return OpClass.TRANSCENDENTAL
    return OpClass.ELEMENTWISE


def _gemm(name: str, dims: Sequence, types: Sequence[str]) -> Kernel | None:
    a, b = _GEMMS[name]
    if len(dims) <= b or len(types) <= b:
        return None
    x, y = dims[a], dims[b]
    if not (isinstance(x, list) and isinstance(y, list) and len(x) == len(y) and len(x) in (2, 3)):
        return None
    batch = x[0] if len(x) == 3 else 1
    m, k, n = x[-2], x[-1], y[-1]
    e = element_bytes(types[a])
    return Kernel(name, OpClass.MATMUL, 2.0 * m * n * k * batch,
                  float((m * k + k * n + m * n) * e * batch), m, n, k, batch,
                  DTYPE_OF.get(types[a].strip().lower(), Dtype.FP32))


def _attention(name: str, dims: Sequence, types: Sequence[str], concrete: Sequence) -> Kernel | None:
    backward = name.endswith("_backward")
    q_at = 1 if backward else 0
    if len(dims) < q_at + 2:
        return None
    q, k = dims[q_at], dims[q_at + 1]
    if not (isinstance(q, list) and isinstance(k, list) and len(q) == 4 and len(k) == 4):
        return None
    b, h, s_q, d = q
    s_k = k[2]
    causal = any(str(c) == "True" for c in concrete)
    flops = 4.0 * b * h * s_q * s_k * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    e = element_bytes(types[q_at])
    traffic = 4.0 * b * h * s_q * d * e * (2.0 if backward else 1.0)
    return Kernel(name, OpClass.ATTENTION, flops, traffic, s_q, s_k, d, b * h,
                  DTYPE_OF.get(types[q_at].strip().lower(), Dtype.FP32))


def kernel_of(name: str, dims: Sequence, types: Sequence[str],
              concrete: Sequence = ()) -> Kernel | None:
    """The kernel an operator runs, or None for shape-only operators and unknown shapes."""
    if name in SHAPE_ONLY:
        return None
    if name in _GEMMS:
        return _gemm(name, dims, types)
    if name.startswith(_ATTENTION):
        return _attention(name, dims, types, concrete)
    tensors = _tensor_dims(dims, types)
    if not tensors:
        return None
    first, t = tensors[0]
    traffic = tensor_bytes(dims, types) + _numel(first) * element_bytes(t)
    return Kernel(name, op_class(name), 0.0, traffic)


def is_work(name: str) -> bool:
    """GEMMs and fused attention count as one kernel even when the profiler shows their
    internals (their children are not counted again)."""
    return name in _GEMMS or name.startswith(_ATTENTION)

"""One kernel's cost record, and the constructors every formula module uses.

A GEMM Y[m,n] = X[m,k] W[k,n] costs 2mnk FLOPs and reads/writes its three operands once;
an element-wise kernel costs its HBM traffic only; backward formulas in ``backward_of``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.hardware_specs.efficiency import ATTENTION_CLASSES


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
    launches: int = 1
    """Kernels this record stands for, issued one after another: Transformer Engine's grouped
    GEMM (``GroupedLinear``) issues one cuBLAS GEMM per local expert over four streams
    (``multi_stream_cublas_gemm``), each paying its own fixed cost; an element-wise record
    may stand for a loop of small kernels (Megatron-Core's per-expert bias), each paying a
    launch gap."""
    exps: float = 0.0
    """Exponentials it evaluates on the special-function units: fused attention's one per score,
    in the forward and again in the backward (which rebuilds the probabilities)."""
    diagonals: int = 1
    """Fused attention: diagonal edges of its mask that cut through the key blocks each query
    tile computes, each leaving part of a block computed but masked: one for a causal mask,
    two for a sliding window narrower than the sequence (the window's lower edge as well)."""


def gemm(name: str, m: int, n: int, k: int, elem: float, dtype: Dtype, batch: int = 1,
         launches: int = 1) -> Kernel:
    """``batch`` GEMMs of one shape; ``launches``: how many separate kernels run them (one for
    a batched or grouped kernel, ``batch`` for a loop of GEMMs)."""
    flops = 2.0 * m * n * k * batch
    traffic = (m * k + k * n + m * n) * elem * batch
    return Kernel(name, OpClass.MATMUL, flops, traffic, m, n, k, batch, dtype, launches)


def elementwise(name: str, elements: float, passes: float, elem: float,
                op_class: OpClass = OpClass.ELEMENTWISE, launches: int = 1) -> Kernel:
    """``passes``: tensors of ``elements`` read or written (a norm reads x, writes y: 2);
    ``op_class`` TRANSCENDENTAL for exp/erf/tanh per element (activations, softmax, loss);
    ``launches``: the separate kernels that move those bytes between them."""
    return Kernel(name, op_class, 0.0, elements * passes * elem, launches=launches)


def backward_of(kernels: tuple[Kernel, ...], elem: float) -> tuple[Kernel, ...]:
    """Gradient kernels: for Y[m,n] = X[m,k] W[k,n], dX = dY W^T (m, k, inner n) and
    dW = X^T dY (k, n, inner m); flash attention backward is 2.5x its forward (FA-2 sec. 4);
    an element-wise kernel's backward reads its saved input and the incoming gradient and
    writes the outgoing one: 1.5x the forward's traffic (3 passes for a 2-pass unary op)."""
    out: list[Kernel] = []
    for k in kernels:
        if k.op_class is OpClass.MATMUL:
            out.append(gemm(f"{k.name}.dgrad", k.m, k.k, k.n, elem, k.dtype, k.batch, k.launches))
            out.append(gemm(f"{k.name}.wgrad", k.k, k.n, k.m, elem, k.dtype, k.batch, k.launches))
        elif k.op_class in ATTENTION_CLASSES:
            out.append(Kernel(f"{k.name}.bwd", k.op_class, 2.5 * k.flops, 2.0 * k.bytes,
                              k.m, k.n, k.k, k.batch, k.dtype, exps=k.exps,
                              diagonals=k.diagonals))
        else:
            out.append(Kernel(f"{k.name}.bwd", k.op_class, 2.0 * k.flops, 1.5 * k.bytes,
                              launches=k.launches))
    return tuple(out)

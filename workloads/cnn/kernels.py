"""One rank's kernels for a 3D CNN layer on its spatial block of ``samples`` samples.

Convolutions run as implicit GEMMs (cuDNN's implicit-GEMM algorithms; Chetlur et al. 2014,
arXiv 1410.0759, sec. 3): forward ``M = output voxels x samples``, ``N = out channels``,
``K = in channels x k^3``; the input gradient (``dgrad``) and the weight gradient (``wgrad``)
cost as many FLOPs each, with their own GEMM shapes. Unlike an explicit GEMM, the unrolled
input is never written to memory: HBM traffic is the input block (with its halo), the weights
and the output once. Batch norm, activations and pools are memory-bound element-wise passes.
"""

from __future__ import annotations

from clustersim.hardware_specs import Dtype, OpClass
from clustersim.workloads.cnn.layers import LayerKind, Volume
from clustersim.workloads.cnn.network import LayerShape
from clustersim.workloads.kernels import Kernel, backward_of, elementwise

BATCH_NORM_PASSES = 3.0
"""Training batch norm reads its input twice (statistics, then normalization) and writes once."""
ACTIVATION_PASSES = 2.0
POOL_PASSES_PER_OUTPUT = 1.0
"""A pool reads its input once and writes an output ``k^3`` times smaller."""


SPLIT_K_TILE = 128
"""Output tile edge the split-K rule counts tiles with."""
SPLIT_K_MIN_DEPTH = 2048
"""Shortest K slice split-K leaves per tile (the depth max-achievable matmul rates use)."""
SPLIT_K_TARGET_TILES = 2 * 132
"""Tiles split-K aims for: two waves of the largest GPU's SMs."""


def split_k(m: int, n: int, k: int) -> int:
    """Slices of the K loop a GEMM library runs in parallel when the output has too few tiles
    to fill the GPU (cuBLAS/CUTLASS split-K and cuDNN's weight-gradient kernels: the voxel
    dimension is the reduction, the output a few channels square): enough slices for
    :data:`SPLIT_K_TARGET_TILES` tiles, none shorter than :data:`SPLIT_K_MIN_DEPTH`."""
    tiles = -(-m // SPLIT_K_TILE) * -(-n // SPLIT_K_TILE)
    return max(1, min(SPLIT_K_TARGET_TILES // tiles, k // SPLIT_K_MIN_DEPTH))


def _implicit_gemm(name: str, m: int, n: int, k: int, traffic_elems: float, elem: float,
                   dtype: Dtype) -> Kernel:
    """A GEMM kernel of the shape, run as ``split_k`` batched slices of the K loop (the
    partial sums' reduction is small beside the slices and left out)."""
    slices = split_k(m, n, k)
    return Kernel(name, OpClass.MATMUL, 2.0 * m * n * k, traffic_elems * elem, m, n,
                  -(-k // slices), slices, dtype)


def forward_kernels(s: LayerShape, x: Volume, y: Volume, halo_elems: int, samples: int,
                    elem: float, dtype: Dtype) -> tuple[Kernel, ...]:
    """Forward kernels of layer ``s`` on one rank's input block ``x`` and output block ``y``
    (``halo_elems`` input elements received from neighbours are read too)."""
    layer, out = s.layer, []
    name = layer.name
    if layer.kind is LayerKind.DENSE:
        out.append(_implicit_gemm(name, samples, layer.out_channels, layer.in_channels,
                                  samples * (layer.in_channels + layer.out_channels)
                                  + layer.weights, elem, dtype))
    elif layer.kind is LayerKind.CONV:
        k3 = layer.kernel ** 3
        out.append(_implicit_gemm(name, y.voxels * samples, layer.out_channels,
                                  layer.in_channels * k3,
                                  (x.elements + halo_elems + y.elements) * samples
                                  + layer.weights, elem, dtype))
    elif layer.kind is LayerKind.UPCONV:
        k3 = layer.kernel ** 3
        out.append(_implicit_gemm(name, x.voxels * samples, layer.out_channels * k3,
                                  layer.in_channels,
                                  (x.elements + y.elements) * samples + layer.weights, elem,
                                  dtype))
    else:
        out.append(elementwise(name, x.elements * samples, POOL_PASSES_PER_OUTPUT
                               + y.elements / x.elements, elem))
    if layer.batch_norm:
        out.append(elementwise(f"{name}.batch_norm", y.elements * samples, BATCH_NORM_PASSES,
                               elem))
    if layer.activation:
        out.append(elementwise(f"{name}.activation", y.elements * samples, ACTIVATION_PASSES,
                               elem))
    return tuple(out)


def backward_kernels(forward: tuple[Kernel, ...], s: LayerShape, x: Volume, y: Volume,
                     samples: int, elem: float, first: bool) -> tuple[Kernel, ...]:
    """Gradient kernels: element-wise passes as :func:`backward_of` prices them; a
    convolution's ``dgrad`` (skipped for the first layer, whose input needs no gradient) and
    ``wgrad`` as implicit GEMMs of the forward's FLOPs."""
    layer = s.layer
    conv = [k for k in forward if k.op_class is OpClass.MATMUL]
    rest = backward_of(tuple(k for k in forward if k.op_class is not OpClass.MATMUL), elem)
    out = list(reversed(rest))
    if not conv:
        return tuple(out)
    k = conv[0]
    rows = samples if layer.kind is LayerKind.DENSE else (
        x.voxels if layer.kind is LayerKind.UPCONV else y.voxels) * samples
    traffic = (x.elements + y.elements) * samples + layer.weights
    if not first:     # dX = dY W^T: one row per input position
        out.append(_implicit_gemm(f"{k.name}.dgrad", rows, k.k * k.batch, k.n, traffic,
                                  elem, k.dtype))
    # dW = X^T dY: the voxels (or samples) are the reduction
    out.append(_implicit_gemm(f"{k.name}.wgrad", k.k * k.batch, k.n, rows, traffic, elem,
                              k.dtype))
    return tuple(out)


def scaled(kernels: tuple[Kernel, ...], share: float, suffix: str) -> tuple[Kernel, ...]:
    """The ``share`` of each kernel's work (a block's interior or boundary voxels): FLOPs,
    bytes and the voxel dimension scale together (the reduction of a weight gradient, the
    rows of the others)."""
    out = []
    for k in kernels:
        name = f"{k.name}.{suffix}"
        if k.op_class is not OpClass.MATMUL:
            out.append(Kernel(name, k.op_class, k.flops * share, k.bytes * share))
        elif k.name.endswith(".wgrad"):
            depth = max(int(round(k.k * k.batch * share)), 1)
            out.append(_implicit_gemm(name, k.m, k.n, depth, k.bytes * share, 1.0, k.dtype))
        else:
            rows = max(int(round(k.m * share)), 1)
            out.append(_implicit_gemm(name, rows, k.n, k.k * k.batch, k.bytes * share, 1.0,
                                      k.dtype))
    return tuple(out)

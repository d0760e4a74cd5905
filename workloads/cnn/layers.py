"""3D CNN layers: shapes, parameters and FLOPs, each derived from the layer's own fields.

Conventions (those of the frameworks the published models were written in):
- a volume is ``(channels, depth, height, width)``;
- a convolution's output extent per dimension is ``floor((n + pad_lo + pad_hi - k) / s) + 1``;
  ``padding: same`` pads ``k - 1`` per dimension at stride 1, ``floor`` of half before and the
  rest after (TensorFlow's rule, which the MLPerf CosmoFlow reference uses), ``valid`` none;
- a convolution costs one multiply-add (2 FLOPs) per output voxel, output channel and
  ``in_channels x k^3`` weight (Çiçek et al. 2016 and CosmoFlow count weights the same way);
- an up-convolution (transposed convolution) of kernel ``k`` and stride ``k`` maps every input
  voxel to a ``k^3`` block: ``in_channels x out_channels x k^3`` multiply-adds per input voxel;
- a dense layer on a volume flattens it first (Keras ``Flatten``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class LayerKind(enum.Enum):
    CONV = "conv3d"
    UPCONV = "upconv3d"
    """Transposed convolution with stride equal to its kernel (U-Net's up-convolution)."""
    MAXPOOL = "maxpool3d"
    AVGPOOL = "avgpool3d"
    DENSE = "dense"


class Padding(enum.Enum):
    SAME = "same"
    VALID = "valid"


@dataclass(frozen=True, slots=True)
class Volume:
    """A sample's activation: channels and the three spatial extents."""

    channels: int
    extent: tuple[int, int, int]

    @property
    def voxels(self) -> int:
        return math.prod(self.extent)

    @property
    def elements(self) -> int:
        return self.channels * self.voxels


@dataclass(frozen=True, kw_only=True, slots=True)
class Layer:
    """One layer of a 3D CNN. Convolutions and pools read ``kernel``/``stride``/``padding``;
    dense layers read only the channel counts (``in_channels`` is the flattened input)."""

    name: str
    kind: LayerKind
    in_channels: int
    out_channels: int
    kernel: int = 1
    stride: int = 1
    padding: Padding = Padding.VALID
    bias: bool = True
    batch_norm: bool = False
    """Batch normalization after the layer (its work and memory; scale/shift are not in the
    published parameter totals this module is tested against)."""
    activation: bool = True
    """An element-wise activation (ReLU, LeakyReLU) after the layer."""
    concat: str | None = None
    """Name of an earlier layer whose output (centre-cropped to this input's extent) is
    concatenated to this layer's input along channels (U-Net's skip connections)."""

    @property
    def is_conv(self) -> bool:
        return self.kind in (LayerKind.CONV, LayerKind.UPCONV)

    @property
    def is_pool(self) -> bool:
        return self.kind in (LayerKind.MAXPOOL, LayerKind.AVGPOOL)

    def pads(self) -> tuple[int, int]:
        """Padding before and after, per dimension."""
        if self.padding is Padding.VALID or self.kind is LayerKind.UPCONV:
            return 0, 0
        total = max(self.kernel - self.stride, 0)   # extents divisible by the stride
        return total // 2, total - total // 2

    def output(self, x: Volume) -> Volume:
        if self.kind is LayerKind.DENSE:
            return Volume(self.out_channels, (1, 1, 1))
        if self.kind is LayerKind.UPCONV:
            return Volume(self.out_channels, tuple(n * self.stride for n in x.extent))
        lo, hi = self.pads()
        extent = tuple((n + lo + hi - self.kernel) // self.stride + 1 for n in x.extent)
        return Volume(self.out_channels if self.is_conv else x.channels, extent)

    @property
    def weights(self) -> int:
        if self.kind is LayerKind.DENSE:
            return self.in_channels * self.out_channels
        if self.is_conv:
            return self.in_channels * self.out_channels * self.kernel ** 3
        return 0

    @property
    def parameters(self) -> int:
        return self.weights + (self.out_channels if self.bias and not self.is_pool else 0)

    def forward_macs(self, x: Volume, y: Volume) -> int:
        """Multiply-adds of one sample's forward pass (input ``x``, output ``y``)."""
        if self.kind is LayerKind.DENSE:
            return self.weights
        if self.kind is LayerKind.UPCONV:
            return x.voxels * self.weights
        if self.kind is LayerKind.CONV:
            return y.voxels * self.weights
        return 0

    def halo(self) -> tuple[int, int]:
        """Input planes a rank needs from its neighbours along a split dimension, before and
        after its block, so that its output block is computed from local data: the padding's
        split of the window overlap ``k - s`` (none for pools and up-convolutions whose kernel
        equals their stride, whose windows never straddle a block boundary)."""
        if self.kind is LayerKind.DENSE or self.kind is LayerKind.UPCONV:
            return 0, 0
        overlap = max(self.kernel - self.stride, 0)
        lo = min(self.pads()[0], overlap)
        return lo, overlap - lo

"""Published 3D CNNs as layer lists, each built from its source's own hyper-parameters."""

from __future__ import annotations

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import did_you_mean
from clustersim.workloads.cnn.layers import Layer, LayerKind, Padding, Volume
from clustersim.workloads.cnn.network import CnnSpec


def cosmoflow(extent: int = 128, conv_size: int = 32, conv_layers: int = 5) -> CnnSpec:
    """The MLPerf HPC CosmoFlow reference model (mlcommons/hpc ``cosmoflow/models/
    cosmoflow.py`` with ``configs/cosmo.yaml``): a 128^3 x 4 input; ``n_conv_layers = 5``
    convolutions of kernel 2, ``padding='same'``, ``conv_size * 2**i`` filters, each followed
    by LeakyReLU and a 2^3 max pool; then Flatten, Dense 128, Dense 64 and Dense 4 (tanh)."""
    layers: list[Layer] = []
    channels = 4
    for i in range(conv_layers):
        out = conv_size * 2 ** i
        layers.append(Layer(name=f"conv{i + 1}", kind=LayerKind.CONV, in_channels=channels,
                            out_channels=out, kernel=2, padding=Padding.SAME))
        layers.append(Layer(name=f"pool{i + 1}", kind=LayerKind.MAXPOOL, in_channels=0,
                            out_channels=0, kernel=2, stride=2, bias=False, activation=False))
        channels = out
    side = extent // 2 ** conv_layers
    flat = channels * side ** 3
    for name, n_in, n_out in (("fc1", flat, 128), ("fc2", 128, 64), ("output", 64, 4)):
        layers.append(Layer(name=name, kind=LayerKind.DENSE, in_channels=n_in,
                            out_channels=n_out))
    return CnnSpec(name="cosmoflow" if extent == 128 else f"cosmoflow-{extent}",
                   input=Volume(4, (extent,) * 3), layers=tuple(layers),
                   source="MLPerf HPC CosmoFlow reference (mlcommons/hpc, cosmoflow/)")


def unet3d_cicek() -> CnnSpec:
    """3D U-Net of Çiçek et al., MICCAI 2016 (arXiv 1606.06650), sec. 2 and Fig. 1: a
    132 x 132 x 116 x 3 input; four resolution steps, each two unpadded 3^3 convolutions with
    batch normalization and ReLU (32-64, 64-128, 128-256, then 256-512 at the bottom) and a 2^3
    max pool; the synthesis path up-convolves 2^3 by stride 2, concatenates the analysis path's
    cropped output, and runs two 3^3 convolutions; a final 1^3 convolution gives 3 labels; the
    output is 44 x 44 x 28. The paper's parameter total (19,069,955) counts the up-convolutions
    without a bias term, and no batch-norm scale/shift."""
    layers: list[Layer] = []

    def conv(name: str, c_in: int, c_out: int, concat: str | None = None) -> None:
        layers.append(Layer(name=name, kind=LayerKind.CONV, in_channels=c_in, out_channels=c_out,
                            kernel=3, batch_norm=True, concat=concat))

    def pool(name: str) -> None:
        layers.append(Layer(name=name, kind=LayerKind.MAXPOOL, in_channels=0, out_channels=0,
                            kernel=2, stride=2, bias=False, activation=False))

    def upconv(name: str, channels: int) -> None:
        layers.append(Layer(name=name, kind=LayerKind.UPCONV, in_channels=channels,
                            out_channels=channels, kernel=2, stride=2, bias=False,
                            activation=False))

    channels = 3
    for level, width in enumerate((32, 64, 128), start=1):
        conv(f"down{level}a", channels, width)
        conv(f"down{level}b", width, 2 * width)
        pool(f"pool{level}")
        channels = 2 * width
    conv("bottom_a", 256, 256)
    conv("bottom_b", 256, 512)
    channels = 512
    for level, width in ((3, 256), (2, 128), (1, 64)):
        upconv(f"up{level}", channels)
        conv(f"up{level}a", channels + width, width, concat=f"down{level}b")
        conv(f"up{level}b", width, width)
        channels = width
    layers.append(Layer(name="classifier", kind=LayerKind.CONV, in_channels=64, out_channels=3,
                        kernel=1, activation=False))
    return CnnSpec(name="unet3d", input=Volume(3, (116, 132, 132)), layers=tuple(layers),
                   source="Çiçek et al., 3D U-Net, MICCAI 2016 (arXiv 1606.06650)")


CNN_PRESETS = {
    "cosmoflow": cosmoflow,
    "cosmoflow-256": lambda: cosmoflow(extent=256),
    "cosmoflow-512": lambda: cosmoflow(extent=512),
    "unet3d": unet3d_cicek,
}
"""Preset name -> builder. The larger CosmoFlow inputs keep the reference's layers (so its
first dense layer grows with the volume), as MLPerf's model code does for any input shape."""


def cnn_preset(name: str, where: str = "model") -> CnnSpec:
    if name not in CNN_PRESETS:
        raise SpecError(where, f"unknown 3D CNN preset {name!r}{did_you_mean(name, CNN_PRESETS)}")
    return CNN_PRESETS[name]()

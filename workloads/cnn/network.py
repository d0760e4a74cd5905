"""A 3D CNN as a layer list: the shapes every layer sees, its parameters and its FLOPs per
sample, all derived by walking the list from the input volume (nothing is tabulated).

Written in a run config as a preset name (``workloads/cnn/presets.py``) or a mapping::

    model:
      name: my-cnn
      input: {channels: 4, extent: [128, 128, 128]}
      layers:
        - {name: conv1, kind: conv3d, in_channels: 4, out_channels: 32, kernel: 3, padding: same}
        - {name: pool1, kind: maxpool3d, kernel: 2, stride: 2}
        - {name: fc1, kind: dense, in_channels: 2097152, out_channels: 128}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.workloads.cnn.layers import Layer, LayerKind, Padding, Volume

LAYER_FIELDS = ("name", "kind", "in_channels", "out_channels", "kernel", "stride", "padding",
                "bias", "batch_norm", "activation", "concat")


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One layer with the volumes it reads and writes for one sample."""

    layer: Layer
    input: Volume
    output: Volume


@dataclass(frozen=True, kw_only=True, slots=True)
class CnnSpec:
    """A 3D CNN: its input volume and its layers, in order."""

    name: str
    input: Volume
    layers: tuple[Layer, ...]
    source: str = ""
    """Where the layer list comes from (paper, reference implementation)."""

    def shapes(self, where: str = "model") -> tuple[LayerShape, ...]:
        """Every layer's input and output volume; raises :class:`SpecError` naming the layer
        whose channels or extents do not follow from the ones before it."""
        out: list[LayerShape] = []
        outputs: dict[str, Volume] = {}
        x = self.input
        for i, layer in enumerate(self.layers):
            at = f"{where}.layers[{i}]"
            if layer.concat is not None:
                skip = outputs.get(layer.concat)
                if skip is None:
                    raise SpecError(f"{at}.concat", f"names no earlier layer: {layer.concat!r}")
                if any(s < n for s, n in zip(skip.extent, x.extent)):
                    raise SpecError(f"{at}.concat", f"{layer.concat} is {skip.extent}, smaller "
                                    f"than this layer's input {x.extent}; it cannot be cropped")
                x = Volume(x.channels + skip.channels, x.extent)
            expected = x.elements if layer.kind is LayerKind.DENSE else x.channels
            if not layer.is_pool and layer.in_channels != expected:
                what = "flattened input elements" if layer.kind is LayerKind.DENSE else "channels"
                raise SpecError(f"{at}.in_channels", f"expected {expected} ({what} of "
                                f"{x.channels} x {x.extent}), got {layer.in_channels}")
            if layer.kind in (LayerKind.CONV, LayerKind.MAXPOOL, LayerKind.AVGPOOL):
                bad = [n for n in x.extent if n % layer.stride]
                if bad:
                    raise SpecError(f"{at}.stride", f"{layer.stride} does not divide the input "
                                    f"extent {x.extent}")
            y = layer.output(x)
            if min(y.extent) < 1:
                raise SpecError(f"{at}.kernel", f"{layer.kernel} is larger than the (padded) "
                                f"input extent {x.extent}")
            out.append(LayerShape(layer, x, y))
            outputs[layer.name] = y
            x = y
        return tuple(out)

    @property
    def parameters(self) -> int:
        return sum(layer.parameters for layer in self.layers)

    @property
    def forward_flops_per_sample(self) -> float:
        """2 FLOPs per multiply-add of every convolution, up-convolution and dense layer."""
        return 2.0 * sum(s.layer.forward_macs(s.input, s.output) for s in self.shapes())

    @property
    def training_flops_per_sample(self) -> float:
        """Forward, and backward twice the forward (input and weight gradients)."""
        return 3.0 * self.forward_flops_per_sample

    @property
    def output(self) -> Volume:
        return self.shapes()[-1].output


def layer_from_fields(f: Fields) -> Layer:
    f.only(LAYER_FIELDS)
    kind = f.choice("kind", LayerKind)
    pool = kind in (LayerKind.MAXPOOL, LayerKind.AVGPOOL)
    kernel = f.integer("kernel", 1 if kind is LayerKind.DENSE else 2 if pool else None,
                       minimum=1)
    layer = Layer(
        name=f.text("name"), kind=kind,
        in_channels=f.integer("in_channels", 0 if pool else None, minimum=0 if pool else 1),
        out_channels=f.integer("out_channels", 0 if pool else None, minimum=0 if pool else 1),
        kernel=kernel,
        stride=f.integer("stride", kernel if pool or kind is LayerKind.UPCONV else 1, minimum=1),
        padding=f.choice("padding", Padding, Padding.VALID),
        bias=f.boolean("bias", not pool), batch_norm=f.boolean("batch_norm", False),
        activation=f.boolean("activation", not pool), concat=f.raw("concat", None))
    if kind is LayerKind.UPCONV and layer.stride != layer.kernel:
        raise SpecError(f.at("stride"), f"an up-convolution's stride must equal its kernel "
                        f"({layer.kernel}), got {layer.stride}")
    if layer.concat is not None and not isinstance(layer.concat, str):
        raise SpecError(f.at("concat"), f"expected a layer name, got {layer.concat!r}")
    f.done()
    return layer


def cnn_from_mapping(data: Mapping, where: str = "model") -> CnnSpec:
    """A layer list from a run config's ``model`` mapping (errors name the field)."""
    f = Fields(data, where).only(("name", "input", "layers", "source"))
    inp = f.sub("input", required=True).only(("channels", "extent"))
    extent = inp.integers("extent", minimum=1)
    if len(extent) != 3:
        raise SpecError(inp.at("extent"), f"expected three extents (depth, height, width), "
                        f"got {len(extent)}")
    volume = Volume(inp.integer("channels", minimum=1), tuple(extent))
    inp.done()
    entries = f.items("layers")
    if not entries:
        raise SpecError(f.at("layers"), "expected at least one layer")
    layers = tuple(layer_from_fields(Fields(e, f"{where}.layers[{i}]"))
                   for i, e in enumerate(entries))
    names = [layer.name for layer in layers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"{where}.layers[{i}].name", f"{name!r} is used twice")
    spec = CnnSpec(name=f.text("name", "cnn"), input=volume, layers=layers,
                   source=f.text("source", ""))
    f.done()
    spec.shapes(where)
    return spec

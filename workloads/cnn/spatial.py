"""Spatial parallelism of a 3D CNN: each sample's volume split over a grid of ranks.

As in Oyama et al., "The Case for Strong Scaling in Deep Learning: Training Large 3D CNNs with
Hybrid Parallelism" (IEEE TPDS 32(7), 2021; arXiv 2007.12856) and LBANN's Distconv (Dryden et
al., IPDPS 2019): every convolution and pool runs on the rank's block of its input (the volume
divided by the grid), after a halo exchange brings the planes of the neighbouring blocks that
its windows reach; backward exchanges the halo of the error signal the same way; the weights
are replicated, so their gradients are reduced over every rank (spatial x data parallel). The
dense layers at the end of CosmoFlow run on the whole (small) flattened activation, which the
grid gathers first.

The halo of a block ``b`` with widths ``(lo_d, hi_d)`` on the dimensions that are split is the
extended block minus the block: ``C x (prod_d (b_d + lo_d + hi_d) - prod_d b_d)`` elements.
Exchanging dimension by dimension (depth, then height with the depth halo, then width) carries
exactly that region, edges and corners included, in three exchanges of face-shaped messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.workloads.cnn.layers import LayerKind, Volume
from clustersim.workloads.cnn.network import CnnSpec, LayerShape

DIMENSIONS = ("depth", "height", "width")


@dataclass(frozen=True, slots=True)
class SpatialGrid:
    """Ranks per sample along depth, height and width."""

    split: tuple[int, int, int]

    @property
    def size(self) -> int:
        return math.prod(self.split)

    def block(self, volume: Volume) -> Volume:
        """One rank's block of ``volume``."""
        return Volume(volume.channels, tuple(n // p for n, p in zip(volume.extent, self.split)))

    def check(self, spec: CnnSpec, where: str = "strategy.spatial") -> None:
        """Every spatial layer's input and output must divide evenly over the grid, and no block
        may be thinner than the halo it sends (the neighbour's would then reach past it)."""
        for s in spatial_layers(spec):
            for volume, side in ((s.input, "input"), (s.output, "output")):
                for dim, n, p in zip(DIMENSIONS, volume.extent, self.split):
                    if n % p:
                        raise SpecError(where, f"{p} ranks along {dim} do not divide layer "
                                        f"{s.layer.name}'s {side} {dim} of {n} "
                                        f"(its {side} is {volume.extent})")
            lo, hi = s.layer.halo()
            thinnest = min(n // p for n, p in zip(s.input.extent, self.split))
            if max(lo, hi) > thinnest and self.size > 1:
                raise SpecError(where, f"layer {s.layer.name}'s blocks are {thinnest} voxels "
                                f"thick, thinner than its halo of {max(lo, hi)}")

    def halo_elements(self, volume: Volume, lo: int, hi: int) -> dict[int, int]:
        """Elements the busiest rank receives per split dimension (dimension index -> count),
        in exchange order, for a halo of widths ``lo``/``hi`` around its block of ``volume``
        (see the module docstring). With two ranks along a dimension each has one neighbour
        and needs one side (the wider); with more, a middle rank needs both."""
        grown = list(self.block(volume).extent)
        out = {}
        for d, p in enumerate(self.split):
            width = 0 if p == 1 else max(lo, hi) if p == 2 else lo + hi
            if width == 0:
                continue
            out[d] = volume.channels * width * math.prod(grown[:d] + grown[d + 1:])
            grown[d] += width
        return out

    def boundary_fraction(self, volume: Volume, lo: int, hi: int) -> float:
        """Share of a block's output voxels whose windows read halo planes: the work that
        waits for the exchange when the interior is computed while it runs (Distconv overlaps
        the two, ``DISTCONV_OVERLAP_HALO_EXCHANGE``)."""
        block = self.block(volume).extent
        inner = math.prod(max(n - (0 if p == 1 else lo + hi), 0)
                          for n, p in zip(block, self.split))
        return 1.0 - inner / math.prod(block)


def spatial_layers(spec: CnnSpec) -> tuple[LayerShape, ...]:
    """The layers that run on spatial blocks: all but the dense layers."""
    return tuple(s for s in spec.shapes() if s.layer.kind is not LayerKind.DENSE)


def gathered_elements(spec: CnnSpec) -> int:
    """Elements of one sample's input to the first dense layer (what the grid gathers), or 0
    for a network without dense layers."""
    for s in spec.shapes():
        if s.layer.kind is LayerKind.DENSE:
            return s.input.elements
    return 0

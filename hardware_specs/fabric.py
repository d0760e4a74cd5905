"""The scale-out network: fat-trees (classic or rail-optimised) as tiers of switches."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.units import Quantity


MAX_OVERSUBSCRIPTION = 64.0
"""Downlinks per uplink of a switch: a 64-port switch with one uplink is 63:1, the most a
fat-tree tier can be."""


class FabricKind(enum.Enum):
    RAIL_OPTIMIZED = "rail_optimized"
    """NIC k of every node goes to the leaf switches of rail k (DGX SuperPOD style)."""
    FAT_TREE = "fat_tree"
    """All NICs of a node go to the same top-of-rack leaf switch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricTier:
    """One level of switches (leaf, spine, core)."""

    name: str
    radix: int
    """Ports per switch."""
    oversubscription: float
    """Downlink to uplink bandwidth ratio at this tier's switches (1.0 = non-blocking)."""
    latency_s: float
    """Port-to-port latency of one switch of this tier."""

    @property
    def down_ports(self) -> int:
        """Ports facing the tier below (the rest go up)."""
        return max(1, round(self.radix * self.oversubscription / (1.0 + self.oversubscription)))


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricSpec:
    """A fat-tree: tiers from the leaf upward; the top tier has no uplinks."""

    name: str
    kind: FabricKind
    tiers: tuple[FabricTier, ...]
    in_network_reduction: bool = False
    """Switches reduce data in flight (InfiniBand SHARP): NCCL's CollNet algorithms."""
    source: str = ""

    def nodes_per_leaf(self, nics_per_node: int) -> int:
        """Nodes whose traffic meets in one leaf switch (one rail's leaf, or one rack's ToR)."""
        leaf = self.tiers[0]
        if self.kind is FabricKind.RAIL_OPTIMIZED:
            return leaf.down_ports
        return max(1, leaf.down_ports // max(1, nics_per_node))

    def with_oversubscription(self, ratio: float) -> "FabricSpec":
        """The same fabric with every tier but the top one oversubscribed by ``ratio``."""
        tiers = tuple(
            FabricTier(name=t.name, radix=t.radix, latency_s=t.latency_s,
                       oversubscription=(ratio if i < len(self.tiers) - 1 else t.oversubscription))
            for i, t in enumerate(self.tiers))
        return FabricSpec(name=f"{self.name}@{ratio:g}:1", kind=self.kind, tiers=tiers,
                          in_network_reduction=self.in_network_reduction, source=self.source)


def read_fabric(f: Fields) -> FabricSpec:
    tiers = []
    for i, raw in enumerate(f.items("tiers")):
        t = Fields(raw, f"{f.at('tiers')}[{i}]")
        tiers.append(FabricTier(
            name=t.text("name"),
            radix=t.integer("radix", minimum=2),
            oversubscription=t.number("oversubscription", 1.0, minimum=1.0,
                                      maximum=MAX_OVERSUBSCRIPTION),
            latency_s=t.quantity("latency", Quantity.TIME),
        ))
        t.done()
    if not tiers:
        raise SpecError(f.at("tiers"), "a fabric needs at least one tier of switches")
    spec = FabricSpec(name=f.path.rsplit(".", 1)[-1], kind=f.choice("kind", FabricKind),
                      tiers=tuple(tiers),
                      in_network_reduction=f.boolean("in_network_reduction", False),
                      source=f.text("source", ""))
    f.done()
    return spec

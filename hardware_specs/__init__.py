"""What hardware *is*: devices, nodes, fabrics, memory tiers and failure rates, from a YAML catalog."""

from hardware_specs.cluster import ClusterSpec, Placement
from hardware_specs.device import DeviceEfficiency, DeviceKind, DeviceSpec
from hardware_specs.dtypes import Dtype
from hardware_specs.efficiency import EfficiencyCurve, OpClass
from hardware_specs.errors import SpecError
from hardware_specs.fabric import FabricKind, FabricSpec, FabricTier
from hardware_specs.failures import FailureCause, FailureModel, Hazard
from hardware_specs.loader import Catalog, load_catalog
from hardware_specs.memory import MemoryTierSpec, TierKind, TierScope
from hardware_specs.node import NicKind, NodeSpec, ScaleUpKind

__all__ = [
    "Catalog", "ClusterSpec", "DeviceEfficiency", "DeviceKind", "DeviceSpec", "Dtype",
    "EfficiencyCurve", "FabricKind", "FabricSpec", "FabricTier", "FailureCause", "FailureModel",
    "Hazard", "MemoryTierSpec", "NicKind", "NodeSpec", "OpClass", "Placement", "ScaleUpKind",
    "SpecError",
    "TierKind", "TierScope", "load_catalog",
]

"""What hardware *is*: devices, nodes, fabrics, memory tiers and failure rates, from a YAML catalog."""

from clustersim.hardware_specs.cluster import ClusterSpec, Placement
from clustersim.hardware_specs.device import DeviceEfficiency, DeviceKind, DeviceSpec
from clustersim.hardware_specs.dtypes import Dtype
from clustersim.hardware_specs.efficiency import EfficiencyCurve, OpClass
from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fabric import FabricKind, FabricSpec, FabricTier
from clustersim.hardware_specs.failures import FailureCause, FailureModel, Hazard
from clustersim.hardware_specs.loader import Catalog, load_catalog
from clustersim.hardware_specs.memory import MemoryTierSpec, TierKind, TierScope
from clustersim.hardware_specs.node import NicKind, NodeSpec, ScaleUpKind

__all__ = [
    "Catalog", "ClusterSpec", "DeviceEfficiency", "DeviceKind", "DeviceSpec", "Dtype",
    "EfficiencyCurve", "FabricKind", "FabricSpec", "FabricTier", "FailureCause", "FailureModel",
    "Hazard", "MemoryTierSpec", "NicKind", "NodeSpec", "OpClass", "Placement", "ScaleUpKind",
    "SpecError",
    "TierKind", "TierScope", "load_catalog",
]

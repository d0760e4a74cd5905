"""How often components fail: rates per 1000 node-days by cause, from published field data."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from hardware_specs.errors import SpecError
from hardware_specs.fields import Fields


class FailureCause(enum.Enum):
    """Component classes as field studies group them (Llama 3 Table 5, Kokolis et al. 2024)."""

    GPU = "gpu"
    HBM = "hbm"
    HOST = "host"
    NIC = "nic"
    SWITCH_CABLE = "switch_cable"
    SOFTWARE = "software"
    MAINTENANCE = "maintenance"


class Hazard(enum.Enum):
    EXPONENTIAL = "exponential"
    WEIBULL = "weibull"


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureModel:
    """Interruption rates by cause; ``weibull_shape`` < 1 models infant mortality."""

    name: str
    rates_per_1000_node_days: Mapping[FailureCause, float]
    hazard: Hazard = Hazard.EXPONENTIAL
    weibull_shape: float = 1.0
    source: str = ""
    breakdown: Mapping[str, float] = field(default_factory=dict)
    """The source's finer categories (counts or shares), for reports."""

    @property
    def total_per_1000_node_days(self) -> float:
        return sum(self.rates_per_1000_node_days.values())

    def node_mtbf_s(self) -> float:
        """Mean time between interruptions of one node, seconds."""
        total = self.total_per_1000_node_days
        if total <= 0:
            return float("inf")
        return 1000.0 * 86400.0 / total


def read_failure_model(f: Fields) -> FailureModel:
    rates_f = f.sub("rates_per_1000_node_days", required=True)
    rates = {}
    for cause in FailureCause:
        if rates_f.has(cause.value):
            rates[cause] = rates_f.number(cause.value, minimum=0.0)
    rates_f.done()
    if not rates:
        raise SpecError(rates_f.path, "give at least one cause: "
                        + ", ".join(c.value for c in FailureCause))
    breakdown_f = f.sub("breakdown")
    breakdown = {str(k): breakdown_f.number(str(k), minimum=0.0) for k in breakdown_f.data}
    breakdown_f.done()
    spec = FailureModel(
        name=f.path.rsplit(".", 1)[-1],
        rates_per_1000_node_days=rates,
        hazard=f.choice("hazard", Hazard, Hazard.EXPONENTIAL),
        weibull_shape=f.number("weibull_shape", 1.0, minimum=0.05),
        source=f.text("source", ""),
        breakdown=breakdown,
    )
    f.done()
    return spec

"""How often components fail and slow down: rates per 1000 node-days by cause, from field data.

A failure model holds what the hardware (and its site) does, not what a job does about it:
interruption rates by cause with their hazard (exponential, or Weibull for infant mortality or
wear-out), how many nodes share a rack or a leaf switch and how often a failure takes a whole
such domain down, and the rates and size distributions of stragglers (a GPU running slow) and of
degraded links. Checkpoint and recovery policies live with the run config, not here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fields import MISSING, Fields
from clustersim.hardware_specs.units import Quantity


class FailureCause(enum.Enum):
    """Component classes as field studies group them (Llama 3 Table 5, Kokolis et al. 2024)."""

    GPU = "gpu"
    HBM = "hbm"
    HOST = "host"
    NIC = "nic"
    SWITCH_CABLE = "switch_cable"
    SOFTWARE = "software"
    MAINTENANCE = "maintenance"

    @property
    def planned(self) -> bool:
        """Announced in advance: the job saves a checkpoint and stops cleanly."""
        return self is FailureCause.MAINTENANCE

    @property
    def replaces_node(self) -> bool:
        """The job must leave the node until it is repaired (hardware, or the switch or cable
        that connects it); a software fault restarts on the same nodes."""
        return self not in (FailureCause.SOFTWARE, FailureCause.MAINTENANCE)


class Hazard(enum.Enum):
    EXPONENTIAL = "exponential"
    WEIBULL = "weibull"


class Domain(enum.Enum):
    """Sets of nodes that can fail together."""

    NODE = "node"
    RACK = "rack"
    """Nodes sharing a rack's power and cooling."""
    SWITCH = "switch"
    """Nodes under one leaf (top-of-rack) switch."""


class DistributionKind(enum.Enum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    LOG_UNIFORM = "log_uniform"
    EXPONENTIAL = "exponential"
    LOGNORMAL = "lognormal"


@dataclass(frozen=True, kw_only=True, slots=True)
class Distribution:
    """A positive random quantity (a slowdown factor, a duration in seconds).

    ``fixed``: ``value``; ``uniform`` and ``log_uniform``: ``low``..``high``; ``exponential``:
    ``mean``; ``lognormal``: ``median`` and ``sigma`` (of the underlying normal)."""

    kind: DistributionKind
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    mean: float = 0.0
    median: float = 0.0
    sigma: float = 0.0

    def upper(self) -> float:
        """The largest value (99th percentile for unbounded kinds): where step-time tables end."""
        k = self.kind
        if k is DistributionKind.FIXED:
            return self.value
        if k in (DistributionKind.UNIFORM, DistributionKind.LOG_UNIFORM):
            return self.high
        if k is DistributionKind.EXPONENTIAL:
            return self.mean * math.log(100.0)
        return self.median * math.exp(2.326 * self.sigma)   # z(0.99) = 2.326

    def expected(self) -> float:
        k = self.kind
        if k is DistributionKind.FIXED:
            return self.value
        if k is DistributionKind.UNIFORM:
            return 0.5 * (self.low + self.high)
        if k is DistributionKind.LOG_UNIFORM:
            return (self.high - self.low) / math.log(self.high / self.low)
        if k is DistributionKind.EXPONENTIAL:
            return self.mean
        return self.median * math.exp(0.5 * self.sigma**2)

    def to_dict(self) -> dict:
        names = {DistributionKind.FIXED: ("value",), DistributionKind.UNIFORM: ("low", "high"),
                 DistributionKind.LOG_UNIFORM: ("low", "high"),
                 DistributionKind.EXPONENTIAL: ("mean",),
                 DistributionKind.LOGNORMAL: ("median", "sigma")}[self.kind]
        return {"distribution": self.kind.value, **{n: getattr(self, n) for n in names}}


@dataclass(frozen=True, kw_only=True, slots=True)
class HazardSpec:
    hazard: Hazard = Hazard.EXPONENTIAL
    weibull_shape: float = 1.0
    """< 1: infant mortality (new parts fail early), > 1: wear-out."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CorrelatedFailure:
    """With ``probability``, a failure of this cause takes down its node's whole ``domain``."""

    domain: Domain
    probability: float


@dataclass(frozen=True, kw_only=True, slots=True)
class DegradationSpec:
    """Slow-downs that do not stop the job: a straggling GPU or a degraded link."""

    rate_per_1000_node_days: float
    slowdown: Distribution
    """Factor (> 1) on the affected rank's compute or communication time."""
    duration: Distribution
    """Seconds the slowdown lasts."""
    source: str = ""

    def to_dict(self) -> dict:
        return {"rate_per_1000_node_days": self.rate_per_1000_node_days,
                "slowdown": self.slowdown.to_dict(), "duration": self.duration.to_dict()}


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
    hazards: Mapping[FailureCause, HazardSpec] = field(default_factory=dict)
    """Per-cause hazard where it differs from the model's own."""
    domains: Mapping[Domain, int] = field(default_factory=dict)
    """Nodes per rack and per leaf switch."""
    correlated: Mapping[FailureCause, CorrelatedFailure] = field(default_factory=dict)
    stragglers: DegradationSpec | None = None
    link_degradation: DegradationSpec | None = None

    @property
    def total_per_1000_node_days(self) -> float:
        return sum(self.rates_per_1000_node_days.values())

    @property
    def unexpected_per_1000_node_days(self) -> float:
        return sum(r for c, r in self.rates_per_1000_node_days.items() if not c.planned)

    def node_mtbf_s(self) -> float:
        """Mean time between interruptions of one node, seconds."""
        total = self.total_per_1000_node_days
        if total <= 0:
            return float("inf")
        return 1000.0 * 86400.0 / total

    def job_mtbf_s(self, nodes: int) -> float:
        """Mean time between unexpected interruptions of a job on ``nodes`` nodes, seconds."""
        rate = self.unexpected_per_1000_node_days * nodes / (1000.0 * 86400.0)
        return 1.0 / rate if rate > 0 else float("inf")

    def hazard_of(self, cause: FailureCause) -> HazardSpec:
        return self.hazards.get(cause, HazardSpec(hazard=self.hazard,
                                                  weibull_shape=self.weibull_shape))

    def domain_nodes(self, domain: Domain) -> int:
        return 1 if domain is Domain.NODE else self.domains[domain]


MAX_SLOWDOWN = 1000.0
"""A straggler 1,000 times slower has stopped: a failure, not a slowdown."""
MAX_DURATION_S = 365 * 86400.0
"""A degradation lasting past a year outlives any training run."""

_DISTRIBUTION_FIELDS = {
    DistributionKind.FIXED: ("value",),
    DistributionKind.UNIFORM: ("low", "high"),
    DistributionKind.LOG_UNIFORM: ("low", "high"),
    DistributionKind.EXPONENTIAL: ("mean",),
    DistributionKind.LOGNORMAL: ("median", "sigma"),
}


MAX_SIGMA = 5.0
"""A lognormal's sigma: at 5 its 99th percentile is already 10^5 times its median; beyond, the
tail overflows a float before it means anything."""


def read_distribution(f: Fields, kind: Quantity, minimum: float, maximum: float
                      ) -> Distribution:
    """``{distribution: uniform, low: 1.2, high: 2}`` or ``{distribution: fixed, value: 30 min}``;
    values are ``kind`` quantities (so durations take units) from ``minimum`` to ``maximum``."""
    dist = f.choice("distribution", DistributionKind)
    values = {}
    for name in _DISTRIBUTION_FIELDS[dist]:
        if name == "sigma":
            values[name] = f.number(name, minimum=0.0, maximum=MAX_SIGMA)
            continue
        values[name] = f.quantity(name, kind, positive=False)
        if not minimum <= values[name] <= maximum:
            raise SpecError(f.at(name), f"expected {minimum:g} to {maximum:g}, "
                                        f"got {values[name]:g}")
    f.done()
    if "high" in values and values["high"] < values["low"]:
        raise SpecError(f.at("high"), f"{values['high']:g} is below low={values['low']:g}")
    if dist is DistributionKind.LOG_UNIFORM and values["low"] <= 0:
        raise SpecError(f.at("low"), "log_uniform needs low > 0")
    return Distribution(kind=dist, **values)


def _read_degradation(f: Fields, base: DegradationSpec | None) -> DegradationSpec | None:
    if not f.data:
        f.done()
        return base
    spec = DegradationSpec(
        rate_per_1000_node_days=f.number(
            "rate_per_1000_node_days",
            base.rate_per_1000_node_days if base else MISSING, minimum=0.0),
        slowdown=(read_distribution(f.sub("slowdown", required=True), Quantity.COUNT, 1.0,
                                    MAX_SLOWDOWN)
                  if f.has("slowdown") or base is None else base.slowdown),
        duration=(read_distribution(f.sub("duration", required=True), Quantity.TIME, 0.0,
                                    MAX_DURATION_S)
                  if f.has("duration") or base is None else base.duration),
        source=f.text("source", base.source if base else ""),
    )
    f.done()
    return spec


def _read_hazard(f: Fields) -> HazardSpec:
    spec = HazardSpec(hazard=f.choice("hazard", Hazard),
                      weibull_shape=f.number("weibull_shape", 1.0, minimum=0.05))
    f.done()
    return spec


def _read_correlated(f: Fields, domains: Mapping[Domain, int]) -> CorrelatedFailure:
    spec = CorrelatedFailure(domain=f.choice("domain", Domain),
                             probability=f.number("probability", minimum=0.0, maximum=1.0))
    f.done()
    if spec.domain is not Domain.NODE and spec.domain not in domains:
        raise SpecError(f.at("domain"), f"{spec.domain.value} needs its size: give "
                        f"domains: {{{spec.domain.value}: NODES}}")
    return spec


def _per_cause(f: Fields, read) -> dict:
    """``{cause: value}`` with every value through ``read(fields, key)``."""
    out = {}
    for key in f.data:
        out[_cause(str(key), f.at(str(key)))] = read(f, str(key))
    f.done()
    return out


def _cause(name: str, path: str) -> FailureCause:
    for cause in FailureCause:
        if cause.value == name:
            return cause
    raise SpecError(path, "unknown cause; expected one of: "
                    + ", ".join(c.value for c in FailureCause))


def failure_model_from_mapping(f: Fields, base: FailureModel | None = None) -> FailureModel:
    """A failure model from YAML; with ``base``, every field is optional and overrides it
    (rates replace the base's rate of the causes they name)."""
    rates = dict(base.rates_per_1000_node_days) if base else {}
    if base is None or f.has("rates_per_1000_node_days"):
        rates.update(_per_cause(f.sub("rates_per_1000_node_days", required=base is None),
                                lambda sub, key: sub.number(key, minimum=0.0)))
    if not rates:
        raise SpecError(f.at("rates_per_1000_node_days"), "give at least one cause: "
                        + ", ".join(c.value for c in FailureCause))
    breakdown_f = f.sub("breakdown")
    breakdown = {str(k): breakdown_f.number(str(k), minimum=0.0) for k in breakdown_f.data}
    breakdown_f.done()
    domains_f = f.sub("domains")
    domains = dict(base.domains) if base else {}
    for key in domains_f.data:
        domain = _domain(str(key), domains_f.at(str(key)))
        domains[domain] = domains_f.integer(str(key), minimum=1)
    domains_f.done()
    hazards = dict(base.hazards) if base else {}
    hazards.update(_per_cause(f.sub("hazards"),
                              lambda sub, key: _read_hazard(sub.sub(key, required=True))))
    correlated = dict(base.correlated) if base else {}
    correlated.update(_per_cause(f.sub("correlated"), lambda sub, key: _read_correlated(
        sub.sub(key, required=True), domains)))
    spec = FailureModel(
        name=base.name if base else f.path.rsplit(".", 1)[-1],
        rates_per_1000_node_days=rates,
        hazard=f.choice("hazard", Hazard, base.hazard if base else Hazard.EXPONENTIAL),
        weibull_shape=f.number("weibull_shape", base.weibull_shape if base else 1.0,
                               minimum=0.05),
        source=f.text("source", base.source if base else ""),
        breakdown=breakdown or (dict(base.breakdown) if base else {}),
        hazards=hazards,
        domains=domains,
        correlated=correlated,
        stragglers=_read_degradation(f.sub("stragglers"), base.stragglers if base else None),
        link_degradation=_read_degradation(f.sub("link_degradation"),
                                           base.link_degradation if base else None),
    )
    f.done()
    return spec


def _domain(name: str, path: str) -> Domain:
    for d in Domain:
        if d.value == name and d is not Domain.NODE:
            return d
    raise SpecError(path, "unknown domain; expected rack or switch")


def read_failure_model(f: Fields) -> FailureModel:
    """A catalog entry (rates required)."""
    return failure_model_from_mapping(f)


def without_planned(model: FailureModel) -> FailureModel:
    """The same model without planned maintenance."""
    rates = {c: r for c, r in model.rates_per_1000_node_days.items() if not c.planned}
    return replace(model, rates_per_1000_node_days=rates)

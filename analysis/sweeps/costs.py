"""What a step costs in money and energy: the config's ``costs:`` section.

    costs:
      gpu_hour: 2.50                  # rental price per GPU-hour (power included), or
      gpu_hour: on_demand             # the catalog's published price of the cluster's instance
      capex_per_gpu: 30000            # purchase price per GPU (with its share of node, network)
      amortization_years: 4           # required with capex_per_gpu
      electricity_per_kwh: 0.10       # with capex: energy is paid on top
      power_per_gpu: 700 W            # default: the device's TDP from the catalog
      power_per_node: 0 W             # CPUs, NICs, fans and switches per node (default 0)
      pue: 1.0                        # facility overhead (default 1.0: IT power only)
      currency: USD

Power defaults to board TDP, an upper bound on what a GPU draws (give a measured figure, e.g.
from nvidia-smi during training, for a better one); PUE defaults to 1.0, i.e. no facility
overhead is assumed. Energy per token = cluster power / tokens per second; cost per million
tokens = cost per hour / (tokens per second x 3600) x 1e6. ``on_demand`` rents whole instances at
the price the catalog's ``prices`` section holds for the cluster's node (dated, with its source):
a job on 12 GPUs of 8-GPU instances pays for 16.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from clustersim.hardware_specs import Catalog, ClusterSpec, SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.price import PublishedPrice
from clustersim.hardware_specs.units import Quantity

ON_DEMAND = "on_demand"

HOURS_PER_YEAR = 8766.0
"""365.25 days."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CostSpec:
    gpu_hour: float | None = None
    """Price per GPU-hour, power included (cloud rental)."""
    on_demand: bool = False
    """Rent at the catalog's published price of each node (``gpu_hour: on_demand``)."""
    rented: tuple[tuple[int, PublishedPrice], ...] = ()
    """With ``on_demand``, once resolved against a cluster: instances and the price of each."""
    capex_per_gpu: float | None = None
    amortization_years: float | None = None
    electricity_per_kwh: float = 0.0
    power_per_gpu_w: float | None = None
    """None: the device's TDP."""
    power_per_node_w: float = 0.0
    pue: float = 1.0
    currency: str = "USD"

    @property
    def priced(self) -> bool:
        return self.gpu_hour is not None or self.capex_per_gpu is not None or self.on_demand


def costs_from_mapping(data: Mapping | None, path: str = "costs") -> CostSpec:
    f = Fields(data or {}, path).only(("gpu_hour", "capex_per_gpu", "amortization_years",
                                       "electricity_per_kwh", "power_per_gpu", "power_per_node",
                                       "pue", "currency"))
    on_demand = f.has("gpu_hour") and f.raw("gpu_hour") == ON_DEMAND
    spec = CostSpec(
        gpu_hour=_gpu_hour(f) if f.has("gpu_hour") and not on_demand else None,
        on_demand=on_demand,
        capex_per_gpu=f.number("capex_per_gpu", minimum=0.0) if f.has("capex_per_gpu") else None,
        amortization_years=(f.number("amortization_years", minimum=0.01)
                            if f.has("amortization_years") else None),
        electricity_per_kwh=f.number("electricity_per_kwh", 0.0, minimum=0.0),
        power_per_gpu_w=(f.quantity("power_per_gpu", Quantity.POWER)
                         if f.has("power_per_gpu") else None),
        power_per_node_w=f.quantity("power_per_node", Quantity.POWER, 0.0, positive=False),
        pue=f.number("pue", 1.0, minimum=1.0),
        currency=f.text("currency", "USD"),
    )
    f.done()
    if (spec.gpu_hour is not None or on_demand) and spec.capex_per_gpu is not None:
        raise SpecError(f"{path}.capex_per_gpu", "give gpu_hour (rent) or capex_per_gpu (buy), "
                        "not both")
    if spec.capex_per_gpu is not None and spec.amortization_years is None:
        raise SpecError(f"{path}.amortization_years", "is required with capex_per_gpu "
                        "(years over which the purchase is spread)")
    return spec


def _gpu_hour(f: Fields) -> float:
    try:
        return f.number("gpu_hour", minimum=0.0)
    except SpecError as err:
        raise SpecError(err.field, f"expected a price per GPU-hour or {ON_DEMAND}, got "
                        f"{f.raw('gpu_hour')!r}") from None


def costs_for(data: Mapping | None, cluster: ClusterSpec, catalog: Catalog,
              path: str = "costs") -> CostSpec:
    """The ``costs:`` section with ``on_demand`` resolved to the published price of every node
    the cluster rents; a node without one is an error naming the priced ones."""
    spec = costs_from_mapping(data, path)
    if not spec.on_demand:
        return spec
    rented = []
    for group in cluster.device_groups:
        price = catalog.prices.get(group.node.name)
        if price is None:
            raise SpecError(f"{path}.gpu_hour", f"{ON_DEMAND}: no published price for node "
                            f"{group.node.name!r} (priced: {', '.join(sorted(catalog.prices))});"
                            " give a price per GPU-hour")
        rented.append((math.ceil(group.num_devices / group.node.devices_per_node), price))
    currencies = {p.currency for _, p in rented}
    if len(currencies) > 1:
        raise SpecError(f"{path}.gpu_hour", f"{ON_DEMAND}: the nodes are priced in "
                        f"{' and '.join(sorted(currencies))}; give one price per GPU-hour")
    return replace(spec, rented=tuple(rented), currency=currencies.pop())


def cluster_power_w(spec: CostSpec, cluster: ClusterSpec) -> float:
    """Power of the whole cluster at the wall, watts."""
    per_gpu = spec.power_per_gpu_w if spec.power_per_gpu_w is not None else cluster.device.tdp_w
    return (cluster.num_devices * per_gpu + cluster.num_nodes * spec.power_per_node_w) * spec.pue


def cost_per_hour(spec: CostSpec, cluster: ClusterSpec) -> float | None:
    """Money per hour of running the cluster; None when the config gives no price."""
    if spec.on_demand:
        if not spec.rented:
            raise ValueError("on_demand costs must be resolved with costs_for() first")
        return sum(n * price.instance_hour for n, price in spec.rented)
    if spec.gpu_hour is not None:
        return cluster.num_devices * spec.gpu_hour
    if spec.capex_per_gpu is None:
        return None
    capex = cluster.num_devices * spec.capex_per_gpu / (spec.amortization_years * HOURS_PER_YEAR)
    return capex + cluster_power_w(spec, cluster) / 1000.0 * spec.electricity_per_kwh


def energy_per_token_j(spec: CostSpec, cluster: ClusterSpec, tokens_per_s: float) -> float:
    return cluster_power_w(spec, cluster) / tokens_per_s


def cost_per_million_tokens(spec: CostSpec, cluster: ClusterSpec,
                            tokens_per_s: float) -> float | None:
    hourly = cost_per_hour(spec, cluster)
    return None if hourly is None else hourly / (tokens_per_s * 3600.0) * 1e6



def price_terms(spec: CostSpec) -> str:
    """The published prices a cost used, one phrase each; empty when the config gave its own."""
    return "; ".join(f"{p.name} {p.instance_hour:g} {p.currency}/h on demand ({p.region}, "
                     f"as of {p.as_of})" for _, p in spec.rented)


def cost_summary(spec: CostSpec, cluster: ClusterSpec, tokens_per_s: float) -> str:
    """``simulate``'s lines on money and energy, with where a published price came from."""
    hourly = cost_per_hour(spec, cluster)
    lines = [f"cost:     {cost_per_million_tokens(spec, cluster, tokens_per_s):.4g} "
             f"{spec.currency} per million tokens ({hourly:.6g} {spec.currency} per hour)"]
    lines += [f"          {n} x {p.name} at {p.instance_hour:g} {p.currency}/h on demand "
              f"({p.region}, as of {p.as_of}; {p.source})" for n, p in spec.rented]
    lines.append(f"energy:   {energy_per_token_j(spec, cluster, tokens_per_s):.3g} J per token "
                 f"({cluster_power_w(spec, cluster) / 1e3:.4g} kW)")
    return "\n".join(lines)


def cost_record(spec: CostSpec, cluster: ClusterSpec, tokens_per_s: float) -> dict:
    """The same for ``--json``."""
    return {"currency": spec.currency, "per_hour": cost_per_hour(spec, cluster),
            "per_million_tokens": cost_per_million_tokens(spec, cluster, tokens_per_s),
            "energy_per_token_j": energy_per_token_j(spec, cluster, tokens_per_s),
            "rented": [{"instances": n, "node": p.name, "instance_hour": p.instance_hour,
                        "region": p.region, "as_of": p.as_of, "source": p.source}
                       for n, p in spec.rented]}

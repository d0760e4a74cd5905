"""What renting a node costs, as its provider published it on a date.

Prices are kept apart from the hardware they rent: a node's specification does not change, its
price does (AWS cut its P5 on-demand price by up to 45% in June 2025), so each entry carries the
date and region it was read for and where, and a cost computed from it is as old as that date.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fields import Fields


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedPrice:
    """The on-demand price of one instance (one catalog node) per hour."""

    name: str
    """The catalog node it prices."""
    instance_hour: float
    """Money per hour for the whole instance, whatever share of its GPUs a job uses."""
    currency: str
    region: str
    as_of: str
    """ISO date the price was read."""
    source: str

    def per_gpu_hour(self, devices_per_node: int) -> float:
        return self.instance_hour / devices_per_node


def read_price(f: Fields) -> PublishedPrice:
    as_of = f.text("as_of")
    try:
        datetime.date.fromisoformat(as_of)
    except ValueError:
        raise SpecError(f"{f.path}.as_of", f"expected an ISO date (2026-01-19), got {as_of!r}") \
            from None
    spec = PublishedPrice(
        name=f.path.rsplit(".", 1)[-1],
        instance_hour=f.number("instance_hour", minimum=0.0),
        currency=f.text("currency", "USD"),
        region=f.text("region"),
        as_of=as_of,
        source=f.text("source"),
    )
    f.done()
    return spec

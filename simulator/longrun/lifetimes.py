"""Random draws for long-horizon runs: component lifetimes and slowdown sizes, from one generator.

A Weibull lifetime is scaled so that its mean is 1 / rate: the catalog's long-run rates stay
the rates, and the shape only moves failures earlier (shape < 1) or later (> 1) in a part's life.
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.hardware_specs.failures import Distribution, DistributionKind, Hazard, HazardSpec


def lifetimes(rng: np.random.Generator, rate_per_s: float, hazard: HazardSpec,
              size: int | tuple[int, ...]) -> np.ndarray:
    """Times to the next failure of fresh parts (seconds); infinite when the rate is zero."""
    if rate_per_s <= 0:
        return np.full(size, np.inf)
    mean = 1.0 / rate_per_s
    if hazard.hazard is Hazard.EXPONENTIAL or hazard.weibull_shape == 1.0:
        return rng.exponential(mean, size)
    k = hazard.weibull_shape
    return mean / math.gamma(1.0 + 1.0 / k) * rng.weibull(k, size)


def draw(rng: np.random.Generator, dist: Distribution) -> float:
    """One value of ``dist``."""
    k = dist.kind
    if k is DistributionKind.FIXED:
        return dist.value
    if k is DistributionKind.UNIFORM:
        return float(rng.uniform(dist.low, dist.high))
    if k is DistributionKind.LOG_UNIFORM:
        return float(math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))))
    if k is DistributionKind.EXPONENTIAL:
        return float(rng.exponential(dist.mean))
    return float(dist.median * math.exp(dist.sigma * rng.standard_normal()))

"""Checkpoint-interval sweeps: ETTR against the interval, per checkpoint policy.

Every interval of a sweep runs the same seeds, so all of them meet the same failures (common
random numbers) and the curve is smooth enough to read its optimum. Besides the best grid point,
the simulated waste is fitted by Young's form a/t + b t + c; its minimum sqrt(a/b) is the
simulated optimum, compared with Young/Daly's sqrt(2 d M).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from clustersim.simulator.longrun.checkpoint_state import checkpoint_state
from clustersim.simulator.longrun.checkpointing import (
    CheckpointPolicy, IntervalRule, checkpoint_cost, optimal_interval,
)
from clustersim.simulator.longrun.montecarlo import run_seeds

from clustersim.analysis.failures.study import Prepared, ci95_half

POINTS = 9
SPAN = 4.0
"""The grid runs from Young/Daly / SPAN to Young/Daly * SPAN."""


def fit_waste(intervals, waste) -> tuple[float, float, float]:
    """Least-squares (a, b, c) of waste = a / t + b t + c."""
    t = np.asarray(intervals, dtype=float)
    A = np.stack([1.0 / t, t, np.ones_like(t)], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(A, np.asarray(waste, dtype=float), rcond=None)
    return float(a), float(b), float(c)


def fitted_optimum(intervals, waste) -> float | None:
    """The interval minimising the fitted waste, if the fit has a minimum."""
    a, b, _ = fit_waste(intervals, waste)
    return math.sqrt(a / b) if a > 0 and b > 0 else None


def with_policy(prepared: Prepared, policy: CheckpointPolicy) -> Prepared:
    """The same study with another checkpoint policy, at its own Young/Daly interval."""
    setup = replace(prepared.spec.checkpoint, policy=policy)
    config = prepared.config
    cost = checkpoint_cost(setup, checkpoint_state(config.job, config.cluster), config.cluster,
                           prepared.plan.step_time_s)
    young = optimal_interval(IntervalRule.YOUNG, cost, prepared.mtbf_s)
    spec = replace(prepared.spec, checkpoint=setup)
    out = replace(prepared, spec=spec, cost=cost, young_interval_s=young,
                  plan=replace(prepared.plan, checkpoint=cost))
    return out.with_interval(young)


def sweep_policy(prepared: Prepared, seeds: int, workers: int = 1, points: int = POINTS,
                 span: float = SPAN) -> dict:
    """ETTR over a geometric grid of intervals around the policy's Young/Daly interval."""
    young = prepared.young_interval_s
    grid = sorted({prepared.snap(young * f) for f in np.geomspace(1.0 / span, span, points)})
    ettr, ci = [], []
    for interval in grid:
        runs = run_seeds(prepared.with_interval(interval).plan, seeds, prepared.spec.seed, workers)
        values = np.array([r.ettr for r in runs])
        ettr.append(float(values.mean()))
        ci.append(ci95_half(values))
    best = int(np.argmax(ettr))
    fitted = fitted_optimum(grid, [1.0 - e for e in ettr])
    return {"policy": prepared.cost.policy.value, "intervals_s": grid, "ettr_mean": ettr,
            "ettr_ci95_half": ci, "best_interval_s": grid[best], "best_ettr": ettr[best],
            "fitted_optimum_s": fitted, "young_daly_interval_s": young,
            "blocking_s": prepared.cost.blocking_s, "seeds": seeds}


def sweep(prepared: Prepared, seeds: int, workers: int = 1,
          policies: tuple[CheckpointPolicy, ...] = tuple(CheckpointPolicy)) -> dict[str, dict]:
    """The best interval of every checkpoint policy, under the study's recovery policy."""
    if not math.isfinite(prepared.mtbf_s):
        return {}
    return {p.value: sweep_policy(with_policy(prepared, p), seeds, workers) for p in policies}

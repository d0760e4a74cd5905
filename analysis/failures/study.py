"""Failure studies: join the step engine to seeded long-horizon runs.

``prepare`` simulates the step once healthy, and once per point of the step-time tables that
stragglers, degraded links and fewer replicas need, turns the ``failures`` section into a
:class:`RunPlan`, and ``run_study`` plays it over seeds and summarises the runs with 95%
confidence intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from clustersim.hardware_specs.failures import DegradationSpec, FailureModel
from clustersim.simulator import Faults, SimulationOptions, simulate
from clustersim.simulator.longrun.checkpoint_state import checkpoint_state, sharding_groups
from clustersim.simulator.longrun.checkpointing import (
    CheckpointCost, checkpoint_cost, optimal_interval, young_interval,
)
from clustersim.simulator.longrun.fault_impact import FaultImpact, fault_impact
from clustersim.simulator.longrun.plan import (
    CauseClock, DegradationPlan, RunPlan, RunResult, StepTable,
)
from clustersim.simulator.longrun.montecarlo import run_seeds
from clustersim.simulator.longrun.recovery import RecoveryKind
from clustersim.workloads import Axis, Job, ParallelLayout
from clustersim.workloads.builder import build_trace

from clustersim.analysis.config import RunConfig
from clustersim.analysis.failures.config import FailureStudySpec
from clustersim.analysis.step import StepReport, run_step, simulation_options

DAY = 86400.0
HOUR = 3600.0
Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile."""


def t95(dof: int) -> float:
    """Student's t 97.5% quantile with ``dof`` degrees of freedom: the half-width factor of a
    95% interval of a mean over dof + 1 runs (the normal's 1.96 is 12.7 at 2 runs, 2.26 at 10).
    Closed forms for 1 and 2 degrees of freedom, else the Cornish-Fisher expansion of
    Abramowitz & Stegun 26.7.5 (within 0.12% at 3, 4e-6 at 10)."""
    if dof < 1:
        raise ValueError(f"expected at least 1 degree of freedom, got {dof}")
    if dof == 1:
        return math.tan(math.pi * (0.975 - 0.5))
    if dof == 2:
        return (2 * 0.975 - 1) * math.sqrt(2 / (4 * 0.975 * 0.025))
    z = Z95
    g = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
         (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
         (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(gi / dof**(i + 1) for i, gi in enumerate(g))


def ci95_half(values) -> float:
    """Half-width of the 95% interval of the mean of ``values`` (Student's t; 0 for one run)."""
    a = np.asarray(values, dtype=float)
    return t95(len(a) - 1) * float(a.std(ddof=1)) / math.sqrt(len(a)) if len(a) > 1 else 0.0


@dataclass(frozen=True)
class Prepared:
    """Everything the runs need, computed once per study."""

    config: RunConfig
    spec: FailureStudySpec
    step: StepReport | None
    """The engine's healthy step (None when a measured step time made it unnecessary)."""
    cost: CheckpointCost
    mtbf_s: float
    """Mean time between unexpected interruptions of the whole job."""
    young_interval_s: float
    plan: RunPlan
    impacts: tuple[FaultImpact, ...] = ()

    def with_interval(self, interval_s: float) -> "Prepared":
        return replace(self, plan=replace(self.plan, interval_s=self.snap(interval_s)))

    def snap(self, interval_s: float) -> float:
        """Checkpoints fall between steps: a whole number of healthy steps, at least one."""
        step = self.plan.step_time_s
        return max(1, round(interval_s / step)) * step


def _job_with_dp(job: Job, dp: int) -> Job:
    """The same job on ``dp`` replicas, each keeping its batch (the global batch shrinks)."""
    per_replica = job.training.global_batch // job.strategy.dp
    training = replace(job.training, global_batch=per_replica * dp)
    return Job(job.model, training, replace(job.strategy, dp=dp))


def _replica_table(config: RunConfig, min_replicas: int, options: SimulationOptions,
                   healthy_s: float) -> StepTable:
    """Step time against live data-parallel replicas, from the engine at a few points."""
    job, cluster = config.job, config.cluster
    dp = job.strategy.dp
    points = sorted({min_replicas, dp - 1})
    steps = {dp: healthy_s}
    for n in points:
        smaller = _job_with_dp(job, n).checked(job.strategy.world_size // dp * n)
        smaller_cluster = replace(cluster, num_devices=smaller.strategy.world_size)
        steps[n] = simulate(build_trace(smaller), smaller_cluster, options).step_time_s
    xs = tuple(sorted(steps))
    return StepTable(xs=tuple(float(x) for x in xs), step_s=tuple(steps[x] for x in xs))


def _heaviest_rank(report: StepReport) -> int:
    """A rank of the class that computes most: where a slow GPU costs the most."""
    cls = max(report.result.classes, key=lambda c: (c.breakdown.compute_s, -c.index))
    return cls.representative


def _degradation(report: StepReport, spec: DegradationSpec, kind: str, rate_scale: float,
                 options: SimulationOptions) -> tuple[DegradationPlan, FaultImpact]:
    """Step time at a slowdown of 1, the middle and the top of ``spec``'s range."""
    rank = _heaviest_rank(report)
    top = max(spec.slowdown.upper(), 1.0 + 1e-6)
    factors, steps, impact = [1.0], [report.result.step_time_s], None
    for factor in (0.5 * (1.0 + top), top):
        faults = (Faults(compute_slowdown={rank: factor}) if kind == "slow gpu"
                  else Faults(link_slowdown={rank: factor}))
        impact, result = fault_impact(report.trace, report.config.cluster, report.result,
                                      faults, kind, options)
        factors.append(factor)
        steps.append(result.step_time_s)
    plan = DegradationPlan(rate_per_node_s=spec.rate_per_1000_node_days * rate_scale,
                           slowdown=spec.slowdown, duration=spec.duration,
                           step=StepTable(xs=tuple(factors), step_s=tuple(steps)))
    return plan, impact


def replicas_of_node(config: RunConfig) -> tuple[tuple[int, ...], ...]:
    s, cluster = config.job.strategy, config.cluster
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)
    out: list[set[int]] = [set() for _ in range(cluster.num_nodes)]
    for rank in range(layout.world_size):
        out[cluster.node_of(rank)].add(layout.coords(rank)[Axis.DP])
    return tuple(tuple(sorted(r)) for r in out)


def _clocks(model: FailureModel, rate_scale: float) -> tuple[CauseClock, ...]:
    clocks = []
    for cause, rate in model.rates_per_1000_node_days.items():
        corr = model.correlated.get(cause)
        clocks.append(CauseClock(
            cause=cause, rate_per_node_s=rate * rate_scale, hazard=model.hazard_of(cause),
            domain_nodes=model.domain_nodes(corr.domain) if corr else 1,
            correlated_probability=corr.probability if corr else 0.0))
    return tuple(clocks)


def needs_engine(spec: FailureStudySpec) -> bool:
    """Step times beyond the healthy one come from the engine."""
    m = spec.model
    return (not spec.step_time_s
            or any(d is not None and d.rate_per_1000_node_days > 0
                   for d in (m.stragglers, m.link_degradation))
            or spec.recovery.kind in (RecoveryKind.ELASTIC, RecoveryKind.REPLICA_FT))


def _scaled(table: StepTable | None, factor: float) -> StepTable | None:
    if table is None or factor == 1.0:
        return table
    return StepTable(xs=table.xs, step_s=tuple(t * factor for t in table.step_s))


def prepare(config: RunConfig, spec: FailureStudySpec) -> Prepared:
    """Engine runs and the run plan for ``spec``. A measured ``step_time`` replaces the
    simulated healthy step; the engine's tables (stragglers, links, fewer replicas) are then
    scaled to it."""
    job, cluster, model, rec = config.job, config.cluster, spec.model, spec.recovery
    report = run_step(config) if needs_engine(spec) else None
    options = replace(simulation_options(config), record=False)
    step_s = spec.step_time_s or report.result.step_time_s
    scale = step_s / report.result.step_time_s if report else 1.0
    nodes = cluster.num_nodes
    cost = checkpoint_cost(spec.checkpoint, checkpoint_state(job, cluster), cluster, step_s)
    mtbf = model.job_mtbf_s(nodes)
    young = young_interval(max(cost.blocking_s, 1e-9), mtbf) if math.isfinite(mtbf) else math.inf
    interval = optimal_interval(spec.interval_rule, cost, mtbf,
                                spec.interval_s or spec.interval_steps * step_s)
    rate_scale = 1.0 / (1000.0 * DAY)   # per 1000 node-days -> per node-second
    impacts = []
    degradations = {}
    for name, dspec, kind in (("stragglers", model.stragglers, "slow gpu"),
                              ("links", model.link_degradation, "slow link")):
        if dspec is not None and dspec.rate_per_1000_node_days > 0:
            dplan, impact = _degradation(report, dspec, kind, rate_scale, options)
            degradations[name] = replace(dplan, step=_scaled(dplan.step, scale))
            impacts.append(impact)
    replicas_step = None
    if rec.kind in (RecoveryKind.ELASTIC, RecoveryKind.REPLICA_FT):
        replicas_step = _scaled(_replica_table(config, rec.min_replicas, options,
                                               report.result.step_time_s), scale)
    horizon = spec.days * DAY
    budget = (spec.token_budget / job.training.tokens_per_step if spec.token_budget
              else horizon / step_s)
    largest_domain = max(model.domains.values(), default=1)
    plan = RunPlan(
        step_time_s=step_s, horizon_s=horizon, budget_steps=budget, nodes=nodes,
        dp=job.strategy.dp, replicas_of_node=replicas_of_node(config),
        clocks=_clocks(model, rate_scale), checkpoint=cost, interval_s=interval,
        recovery=rec, stragglers=degradations.get("stragglers"),
        links=degradations.get("links"), replicas_step=replicas_step,
        peer_offset=min(largest_domain, nodes - 1) if nodes > 1 else 1,
        peer_replicas=spec.checkpoint.peer_replicas,
        sharding_groups=sharding_groups(job, cluster),
        tolerated_failures=spec.checkpoint.tolerated_failures,
        # A replacement copies its node's share of one replica's full state from a live peer.
        rejoin_transfer_s=cost.state_bytes / max(1, nodes // job.strategy.dp)
        / cluster.node.network_bandwidth)
    prepared = Prepared(config=config, spec=spec, step=report, cost=cost, mtbf_s=mtbf,
                        young_interval_s=young, plan=plan, impacts=tuple(impacts))
    return prepared.with_interval(interval)


# --- summaries ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stat:
    mean: float
    ci95: tuple[float, float]
    """95% confidence interval of the mean (Student's t over runs, so few seeds widen it)."""
    p5: float
    p95: float

    @classmethod
    def of(cls, values, upper: float = math.inf) -> "Stat":
        """Mean and its interval, clipped to what the quantity can be (>= 0, <= ``upper``):
        with few runs the interval alone would reach below zero."""
        a = np.asarray(values, dtype=float)
        finite = a[np.isfinite(a)]
        if len(finite) < len(a) or len(a) == 0:
            return cls(math.inf, (math.inf, math.inf), math.inf, math.inf)
        mean = float(a.mean())
        half = ci95_half(a)
        return cls(mean, (max(mean - half, 0.0), min(mean + half, upper)),
                   float(np.percentile(a, 5)), float(np.percentile(a, 95)))


MEAN_KEYS = {"lost_work_hours": "lost_work_hours_mean",
             "checkpoint_overhead_fraction": "checkpoint_overhead_fraction",
             "downtime_hours": "downtime_hours_mean", "slowdown_hours": "slowdown_hours_mean",
             "time_to_train_days": "time_to_train_days_mean"}
"""Stat -> its JSON key (the issue's stable names; each also has ``<stat>_ci95``)."""


@dataclass(frozen=True)
class StudyResult:
    prepared: Prepared
    runs: tuple[RunResult, ...]
    stats: dict[str, Stat]
    by_cause: dict[str, float]
    """Mean interruptions per run, by cause (planned maintenance included)."""
    lost_hours_by_cause: dict[str, float]
    """Mean lost work + downtime per run, hours, by the cause that started it."""
    sweep: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        p, s = self.prepared, self.stats
        out = {
            "name": p.config.name, "seeds": len(self.runs), "days": p.spec.days,
            "step_time_s": p.plan.step_time_s, "nodes": p.plan.nodes,
            "job_mtbf_hours": p.mtbf_s / HOUR,
            "checkpoint": p.cost.to_dict(),
            "checkpoint_interval_s": p.plan.interval_s,
            "young_daly_interval_s": p.young_interval_s,
            "recovery": p.spec.recovery.to_dict(),
            "interruptions_mean": s["interruptions"].mean,
            "interruptions_ci95": list(s["interruptions"].ci95),
            "planned_interruptions_mean": s["planned"].mean,
            "interruptions_by_cause": self.by_cause,
            "ettr_mean": s["ettr"].mean, "ettr_ci95": list(s["ettr"].ci95),
            "ettr_p5": s["ettr"].p5, "ettr_p95": s["ettr"].p95,
        }
        for key, name in MEAN_KEYS.items():
            out[name] = _finite(s[key].mean)
            out[f"{key}_ci95"] = [_finite(v) for v in s[key].ci95]
        out["lost_time_by_cause_hours"] = self.lost_hours_by_cause
        out["fault_impacts"] = [i.to_dict() for i in p.impacts]
        if self.sweep:
            out["sweep"] = self.sweep
        return out


def _finite(value: float) -> float | None:
    """JSON has no infinity: a budget never reached is null."""
    return value if math.isfinite(value) else None


def summarise(prepared: Prepared, runs: list[RunResult]) -> StudyResult:
    horizon = prepared.plan.horizon_s
    stats = {
        "interruptions": Stat.of([r.interruptions for r in runs]),
        "planned": Stat.of([r.planned for r in runs]),
        "ettr": Stat.of([r.ettr for r in runs], upper=1.0),
        "lost_work_hours": Stat.of([r.lost_s / HOUR for r in runs]),
        "checkpoint_overhead_fraction": Stat.of([r.checkpoint_s / r.wall_s for r in runs],
                                                upper=1.0),
        "downtime_hours": Stat.of([r.down_s / HOUR for r in runs]),
        "slowdown_hours": Stat.of([max(r.slowdown_s, 0.0) / HOUR for r in runs]),
        "time_to_train_days": Stat.of([r.time_to_train_s / DAY for r in runs]),
    }
    causes = sorted({c for r in runs for c in r.by_cause})
    by_cause = {c: float(np.mean([r.by_cause.get(c, 0) for r in runs])) for c in causes}
    lost: dict[str, float] = {}
    for r in runs:
        for e in r.events:
            if e.kind in ("failure", "planned") and e.time_s <= horizon:
                lost[e.cause] = lost.get(e.cause, 0.0) + (e.downtime_s + e.lost_work_s) / HOUR
    lost = {c: v / len(runs) for c, v in sorted(lost.items(), key=lambda kv: -kv[1])}
    return StudyResult(prepared, tuple(runs), stats, by_cause, lost)


def run_study(prepared: Prepared, seeds: int, workers: int = 1, record_first: bool = True
              ) -> StudyResult:
    runs = run_seeds(prepared.plan, seeds, prepared.spec.seed, workers, record_first)
    return summarise(prepared, runs)

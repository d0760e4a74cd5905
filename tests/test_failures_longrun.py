"""Long-horizon runs: Young/Daly, accounting, determinism, and what each policy changes."""

import math
from dataclasses import replace

import numpy as np
import pytest

from clustersim.hardware_specs.failures import FailureCause, HazardSpec
from clustersim.simulator.longrun.checkpointing import (
    CheckpointCost, CheckpointLevel, CheckpointPolicy, young_interval, young_waste,
)
from clustersim.simulator.longrun.plan import CauseClock, RunPlan, StepTable
from clustersim.simulator.longrun.montecarlo import run_one, run_seeds
from clustersim.simulator.longrun.recovery import RecoveryKind, RecoveryPolicy

from clustersim.analysis.failures.sweep import fitted_optimum

HOUR, DAY = 3600.0, 86400.0
INSTANT = RecoveryPolicy(detection_s=0.0, drain_s=0.0, reschedule_s=0.0, hot_swap_s=0.0,
                         process_restart_s=0.0, warmup_s=0.0, repair_time_s=1.0)


def sync_cost(pause: float, load: float = 0.0) -> CheckpointCost:
    return CheckpointCost(policy=CheckpointPolicy.SYNC, state_bytes=1.0, blocking_s=pause,
                          levels=(CheckpointLevel(every=1, background_s=0.0, load_s=load,
                                                  durable=True),))


def plan(*, mtbf_s: float, interval_s: float, cost: CheckpointCost, days: float = 200.0,
         recovery: RecoveryPolicy = INSTANT, cause: FailureCause = FailureCause.SOFTWARE,
         nodes: int = 1, dp: int = 1, **over) -> RunPlan:
    """A job whose nodes fail with ``cause`` so that the whole job's MTBF is ``mtbf_s``."""
    base = RunPlan(
        step_time_s=1.0, horizon_s=days * DAY, budget_steps=days * DAY, nodes=nodes, dp=dp,
        replicas_of_node=tuple((n * dp // nodes,) for n in range(nodes)),
        clocks=(CauseClock(cause=cause, rate_per_node_s=1.0 / (mtbf_s * nodes),
                           hazard=HazardSpec()),),
        checkpoint=cost, interval_s=interval_s, recovery=recovery)
    return replace(base, **over)


def mean_waste(runs) -> float:
    return float(np.mean([1.0 - r.ettr for r in runs]))


@pytest.mark.slow
@pytest.mark.parametrize("mtbf_h, pause_s, restart_s, days", [(24.0, 60.0, 600.0, 200.0),
                                                               (6.0, 20.0, 0.0, 60.0)])
def test_young_daly_optimum_and_waste(mtbf_h, pause_s, restart_s, days):
    """Young (1974): waste d/t + t/(2M) + R/M, minimised at t = sqrt(2 d M). Simulated over 40
    seeds of 200-240 failures each, with common failure times: optimum within 10%, waste
    within 5%."""
    mtbf = mtbf_h * HOUR
    t0 = young_interval(pause_s, mtbf)
    recovery = replace(INSTANT, detection_s=restart_s)
    grid = [t0 * f for f in (0.4, 0.55, 0.75, 1.0, 1.35, 1.8, 2.5)]
    waste = []
    for t in grid:
        runs = run_seeds(plan(mtbf_s=mtbf, interval_s=t, cost=sync_cost(pause_s), days=days,
                              recovery=recovery, budget_steps=math.inf), 40)
        waste.append(mean_waste(runs))
        assert waste[-1] == pytest.approx(young_waste(t, pause_s, mtbf, restart_s), rel=0.05)
    assert fitted_optimum(grid, waste) == pytest.approx(t0, rel=0.10)


def test_wall_clock_splits_into_useful_lost_checkpoint_down_and_slowdown():
    p = plan(mtbf_s=6 * HOUR, interval_s=1800.0, cost=sync_cost(30.0, load=60.0), days=30,
             recovery=replace(INSTANT, detection_s=300.0, process_restart_s=120.0),
             cause=FailureCause.GPU, nodes=8, dp=4,
             replicas_step=StepTable(xs=(1.0, 4.0), step_s=(1.2, 1.0)))
    for kind in RecoveryKind:
        for r in run_seeds(replace(p, recovery=replace(p.recovery, kind=kind, spare_nodes=2)), 5):
            total = r.useful_s + r.lost_s + r.checkpoint_s + r.down_s + r.slowdown_s
            assert total == pytest.approx(r.wall_s, rel=1e-9), kind
            assert min(r.lost_s, r.checkpoint_s, r.down_s) >= 0 and r.slowdown_s > -1e-6


def test_same_seed_same_result_whatever_the_workers():
    p = plan(mtbf_s=4 * HOUR, interval_s=1200.0, cost=sync_cost(20.0), days=20,
             cause=FailureCause.GPU, nodes=16, dp=4,
             recovery=replace(INSTANT, kind=RecoveryKind.ELASTIC, detection_s=60.0),
             replicas_step=StepTable(xs=(1.0, 4.0), step_s=(1.1, 1.0)))
    one = run_seeds(p, 6, seed=7, workers=1)
    two = run_seeds(p, 6, seed=7, workers=2)
    assert one == two
    assert run_seeds(p, 1, seed=8)[0] != one[0]


def test_interruption_count_follows_the_rate_and_survives_downtime():
    """Failures keep coming while the job is down (a restart can fail too): the count over the
    horizon is rate x wall time, whatever the downtime."""
    p = plan(mtbf_s=2 * HOUR, interval_s=600.0, cost=sync_cost(5.0), days=10,
             recovery=replace(INSTANT, detection_s=1800.0), budget_steps=math.inf)
    runs = run_seeds(p, 40)
    assert np.mean([r.interruptions for r in runs]) == pytest.approx(10 * 12, rel=0.05)


def test_waiting_for_repair_without_spares():
    """No spare: each hardware failure waits for its node's repair (exponential, mean 1 h)."""
    rec = replace(INSTANT, detection_s=60.0, reschedule_s=120.0, repair_time_s=HOUR)
    p = plan(mtbf_s=24 * HOUR, interval_s=3600.0, cost=sync_cost(1.0), days=400,
             recovery=rec, cause=FailureCause.GPU, budget_steps=math.inf)
    runs = run_seeds(p, 10)
    per_failure = sum(r.down_s for r in runs) / sum(r.interruptions for r in runs)
    assert per_failure == pytest.approx(60.0 + HOUR + 120.0, rel=0.1)
    spared = run_seeds(replace(p, recovery=replace(rec, spare_nodes=1)), 10)
    per_failure = sum(r.down_s for r in spared) / sum(r.interruptions for r in spared)
    assert per_failure < 60.0 + 120.0 + 0.05 * HOUR


def test_hot_spares_beat_cold_spares_on_the_same_failures():
    rec = replace(INSTANT, detection_s=60.0, reschedule_s=900.0, hot_swap_s=30.0, spare_nodes=4)
    p = plan(mtbf_s=3 * HOUR, interval_s=1200.0, cost=sync_cost(10.0), days=30,
             cause=FailureCause.GPU, nodes=32, recovery=rec)
    cold = run_seeds(p, 10)
    hot = run_seeds(replace(p, recovery=replace(rec, kind=RecoveryKind.HOT_SPARE)), 10)
    assert sum(r.interruptions for r in hot) == pytest.approx(sum(r.interruptions for r in cold),
                                                             rel=0.02)
    assert mean_waste(hot) < mean_waste(cold) - 0.03


def test_replica_ft_loses_half_a_step_per_failure_and_keeps_training():
    p = plan(mtbf_s=HOUR, interval_s=3600.0, cost=sync_cost(10.0), days=10, nodes=8, dp=8,
             cause=FailureCause.GPU, step_time_s=10.0, budget_steps=math.inf,
             recovery=replace(INSTANT, kind=RecoveryKind.REPLICA_FT, detection_s=30.0,
                              spare_nodes=8, reschedule_s=600.0),
             replicas_step=StepTable(xs=(1.0, 8.0), step_s=(10.0, 10.0)))
    runs = run_seeds(p, 10)
    restart = run_seeds(replace(p, recovery=replace(p.recovery, kind=RecoveryKind.RESTART)), 10)
    # Each failure loses half a step of the replicas then live: a replica is out 630 s of every
    # 8 h (its nodes' MTBF), so 1 - 630 / 28800 of them on average.
    per_failure = sum(r.lost_s for r in runs) / sum(r.interruptions for r in runs)
    assert per_failure == pytest.approx(0.5 * 10.0 * (1 - 630 / 28800), rel=0.05)
    assert mean_waste(runs) < 0.5 * mean_waste(restart)


@pytest.mark.slow
def test_elastic_continues_on_fewer_replicas_instead_of_waiting_for_repair():
    rec = replace(INSTANT, detection_s=60.0, reschedule_s=300.0, repair_time_s=12 * HOUR,
                  process_restart_s=120.0)
    p = plan(mtbf_s=8 * HOUR, interval_s=1800.0, cost=sync_cost(20.0), days=60, nodes=16, dp=8,
             cause=FailureCause.GPU, recovery=rec,
             replicas_step=StepTable(xs=(1.0, 7.0, 8.0), step_s=(1.0, 1.01, 1.0)))
    waiting = run_seeds(p, 8)
    elastic = run_seeds(replace(p, recovery=replace(rec, kind=RecoveryKind.ELASTIC)), 8)
    assert mean_waste(elastic) < mean_waste(waiting) - 0.2
    assert all(r.slowdown_s > 0 for r in elastic)     # fewer replicas train fewer tokens


def in_memory_cost(pause=0.5, peer_load=5.0, storage_bg=300.0, storage_load=600.0, every=4):
    return CheckpointCost(policy=CheckpointPolicy.IN_MEMORY, state_bytes=1.0, blocking_s=pause,
                          levels=(CheckpointLevel(every=1, background_s=10.0, load_s=peer_load,
                                                  durable=False),
                                  CheckpointLevel(every=every, background_s=storage_bg,
                                                  load_s=storage_load, durable=True)))


@pytest.mark.slow
def test_in_memory_checkpoints_restore_from_peers_unless_a_domain_takes_them_too():
    """GEMINI: a failed node's state comes back from a peer's memory; when the failure takes
    the peer down as well (correlated, peer in the same rack) it falls back to storage."""
    base = plan(mtbf_s=2 * HOUR, interval_s=600.0, cost=in_memory_cost(), days=20, nodes=4,
                cause=FailureCause.GPU, recovery=replace(INSTANT, spare_nodes=4),
                peer_offset=1)
    spread = run_seeds(base, 10)
    rack = replace(base, clocks=(replace(base.clocks[0], domain_nodes=2,
                                         correlated_probability=1.0),))
    together = run_seeds(rack, 10)
    apart = run_seeds(replace(rack, peer_offset=2), 10)
    lost = {name: sum(r.lost_s for r in runs) / sum(r.interruptions for r in runs)
            for name, runs in (("spread", spread), ("together", together), ("apart", apart))}
    # From memory: half a 600 s interval (plus 10 s of replication), except in the ~2% of
    # failures whose peer was itself replaced since the last copy (610 s of its 8 h MTBF), which
    # fall back to storage, every 4th checkpoint, about 4 x 600 s further back.
    expected = 300.0 + 10.0 + 610.0 / 28800.0 * 4 * 600.0
    assert lost["spread"] == pytest.approx(expected, rel=0.1)
    assert lost["apart"] == pytest.approx(expected, rel=0.1)
    assert lost["together"] > 3 * lost["spread"]


def test_planned_maintenance_costs_a_save_and_a_restart_but_no_work():
    p = plan(mtbf_s=12 * HOUR, interval_s=3600.0, cost=sync_cost(60.0), days=30,
             cause=FailureCause.MAINTENANCE, recovery=replace(INSTANT, process_restart_s=300.0))
    r = run_one(p, 0, 0, record=True)
    assert r.interruptions == 0 and r.planned > 0 and r.lost_s == 0.0
    assert r.down_s == pytest.approx(300.0 * r.planned, rel=0.02)
    assert {s.state for s in r.timeline} == {"train", "save", "down"}


def test_stragglers_slow_the_job_for_their_duration():
    from clustersim.hardware_specs.failures import Distribution, DistributionKind
    from clustersim.simulator.longrun.plan import DegradationPlan
    slow = DegradationPlan(rate_per_node_s=1.0 / (10 * HOUR),
                           slowdown=Distribution(kind=DistributionKind.FIXED, value=2.0),
                           duration=Distribution(kind=DistributionKind.FIXED, value=HOUR),
                           step=StepTable(xs=(1.0, 2.0), step_s=(1.0, 1.5)))
    p = plan(mtbf_s=1e12, interval_s=3600.0, cost=sync_cost(0.0), days=100, stragglers=slow,
             budget_steps=math.inf)
    runs = run_seeds(p, 10)
    # 10% of the time one straggler (rarely two) costs a third of the speed: ~3.3% slowdown.
    fraction = np.mean([r.slowdown_s / r.wall_s for r in runs])
    assert fraction == pytest.approx(0.1 * (1 - 1 / 1.5), rel=0.1)


def test_evicting_long_stragglers_trades_slowdown_for_downtime():
    """FALCON (arXiv 2410.12588) reports fail-slows lasting up to ~10 h; evicting after 10 min
    turns most of their slowdown into one save-and-restart each."""
    from clustersim.hardware_specs.failures import Distribution, DistributionKind
    from clustersim.simulator.longrun.plan import DegradationPlan
    slow = DegradationPlan(rate_per_node_s=1.0 / (20 * HOUR),
                           slowdown=Distribution(kind=DistributionKind.FIXED, value=3.0),
                           duration=Distribution(kind=DistributionKind.FIXED, value=5 * HOUR),
                           step=StepTable(xs=(1.0, 3.0), step_s=(1.0, 3.0)))
    rec = replace(INSTANT, spare_nodes=2, process_restart_s=300.0)
    p = plan(mtbf_s=1e12, interval_s=1800.0, cost=sync_cost(10.0), days=30, stragglers=slow,
             recovery=rec, budget_steps=math.inf, nodes=4)
    keep = run_seeds(p, 5)
    evict = run_seeds(replace(p, recovery=replace(rec, evict_slow_after_s=600.0)), 5)
    assert np.mean([r.slowdown_s for r in evict]) < 0.1 * np.mean([r.slowdown_s for r in keep])
    assert all(r.down_s > 0 for r in evict) and all(r.down_s == 0 for r in keep)
    assert mean_waste(evict) < mean_waste(keep)


def test_weibull_infant_mortality_front_loads_failures_of_new_nodes():
    """Shape 0.5 (decreasing hazard) with the same mean life: a fleet of new nodes fails far
    more often early on. Each of 256 nodes fails by day 10 with probability
    1 - exp(-(10 / eta)^0.5), eta = 1000 d / Gamma(3) = 500 d: 13.2%, against 1% for the
    exponential of the same mean."""
    import math as m
    from clustersim.hardware_specs.failures import Hazard
    base = plan(mtbf_s=1000 * DAY / 256, interval_s=3600.0, cost=sync_cost(1.0), days=10,
                cause=FailureCause.GPU, nodes=256, budget_steps=math.inf,
                recovery=replace(INSTANT, spare_nodes=1000))
    weibull = replace(base, clocks=(replace(base.clocks[0], hazard=HazardSpec(
        hazard=Hazard.WEIBULL, weibull_shape=0.5)),))
    first = 256 * (1 - m.exp(-m.sqrt(10 / 500)))
    exp_count = np.mean([r.interruptions for r in run_seeds(base, 20)])
    weibull_count = np.mean([r.interruptions for r in run_seeds(weibull, 20)])
    assert exp_count == pytest.approx(256 * 10 / 1000, rel=0.15)
    # First failures, plus the replacements' own (new parts again) failures.
    assert first < weibull_count < 1.5 * first

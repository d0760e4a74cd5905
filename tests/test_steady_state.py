"""A sweep point from its pipeline's steady state equals the full replay, to the microsecond and
below; whatever is not periodic is replayed in full."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import simulation_options
from clustersim.analysis.sweeps import steady_state
from clustersim.analysis.sweeps.critical_summary import critical_summary
from clustersim.analysis.sweeps.steady_state import (
    Probes, StepPoint, probe_plans, simulate_job, steady_step, with_micro_batches,
)
from clustersim.simulator import StepSimulation, simulate
from clustersim.simulator.result import BREAKDOWN_COLUMNS
from clustersim.workloads.builder import build_trace

BASE = {"name": "steady", "model": {"name": "steady", "layers": 8, "hidden": 1024, "heads": 16,
                                    "vocab": 256},
        "training": {"seq_len": 1024, "global_batch": 64},
        "strategy": {"tp": 2, "pp": 4, "dp": 1}, "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}

PERIODIC = {
    "1f1b": {"training": {"seq_len": 1024, "global_batch": 128}},
    "interleaved": {"strategy": {"tp": 2, "pp": 4, "dp": 1, "schedule": "interleaved",
                                 "virtual_stages": 2},
                    "training": {"seq_len": 1024, "global_batch": 256}},
    "no-pipeline": {"strategy": {"tp": 4, "pp": 1, "dp": 2},
                    "training": {"seq_len": 1024, "global_batch": 96}},
    "uneven-rounds": {"training": {"seq_len": 1024, "global_batch": 149}},
    "period-of-pp": {"strategy": {"tp": 8, "pp": 2, "dp": 1},
                     "training": {"seq_len": 1024, "global_batch": 128},
                     "cluster": {"gpu": "h100-sxm", "num_gpus": 16}},
}
"""Steps whose shorter steps repeat: their points come from three short replays."""

REPLAYED = {
    "zero1-dp2": {"strategy": {"tp": 1, "pp": 4, "dp": 2, "zero": 1}},
    "zero3-dp2": {"strategy": {"tp": 1, "pp": 4, "dp": 2, "zero": 3}},
    "gpipe": {"strategy": {"tp": 2, "pp": 4, "dp": 1, "schedule": "gpipe"}},
    "fp8": {"training": {"seq_len": 1024, "global_batch": 64, "precision": "fp8"}},
}
"""Steps replayed in full: too short for their period, no steady state, or not the same in
every micro-batch."""

MICROSECOND = 1e-6


def config(name: str):
    over = {**PERIODIC, **REPLAYED}[name]
    return config_from_mapping({**BASE, **over})


def point_of(r) -> StepPoint:
    """The point of a full replay's step summary (the reference)."""
    return StepPoint(step_time_s=r.step_time_s, tokens_per_s=r.tokens_per_s,
                     tflops_per_gpu=r.tflops_per_gpu, mfu=r.mfu, breakdown=r.breakdown,
                     critical_class=r.critical_class, events=r.events)


def full_and_fast(name: str) -> tuple[StepPoint, StepPoint]:
    cfg = config(name)
    options = replace(simulation_options(cfg), record=False)
    full = point_of(simulate(build_trace(cfg.job), cfg.cluster, options))
    return full, simulate_job(cfg.job, cfg.cluster, options)


def assert_same_point(full: StepPoint, fast: StepPoint) -> None:
    assert fast.step_time_s == pytest.approx(full.step_time_s, abs=MICROSECOND / 1000)
    for column in BREAKDOWN_COLUMNS:
        assert fast.breakdown.columns()[column] == pytest.approx(
            full.breakdown.columns()[column], abs=MICROSECOND / 1000), column
    assert fast.critical_class == full.critical_class
    assert fast.tokens_per_s == pytest.approx(full.tokens_per_s, rel=1e-12)
    assert fast.tflops_per_gpu == pytest.approx(full.tflops_per_gpu, rel=1e-12)
    assert fast.mfu == pytest.approx(full.mfu, rel=1e-12)


@pytest.mark.parametrize("name", PERIODIC)
def test_a_periodic_step_equals_its_full_replay_in_fewer_events(name):
    full, fast = full_and_fast(name)
    assert_same_point(full, fast)
    cfg = config(name)  # it was extrapolated, not replayed (the events no longer tell: a full
    # replay folds what shares nothing, so a one-node step costs a handful of events)
    options = replace(simulation_options(cfg), record=False)
    assert steady_state.steady_step(cfg.job, cfg.cluster, options) == fast


@pytest.mark.parametrize("name", REPLAYED)
def test_a_step_that_does_not_repeat_is_replayed_in_full(name):
    full, fast = full_and_fast(name)
    assert fast == full


def test_three_steps_on_a_line_are_not_enough():
    """ZeRO-1 over two replicas on one node repeats every pp = 4 micro-batches: the steps of 6,
    7 and 8 micro-batches happen to lie on a line whose slope is not the period's average, so
    extrapolating them would be off by about 10 us at 32. The op-by-op comparison refuses it."""
    cfg = config("zero1-dp2")
    options = replace(simulation_options(cfg), record=False)
    runs = []
    for m in (6, 7, 8):
        trace = build_trace(with_micro_batches(cfg.job, m))
        replay = StepSimulation(trace, cfg.cluster, options).replay()
        runs.append((replay, critical_summary(replay, trace)))
    (a, ra), (b, rb), (c, rc) = runs
    assert (rc.step_time_s - rb.step_time_s) == pytest.approx(rb.step_time_s - ra.step_time_s,
                                                              abs=1e-12)
    plan = Probes(micro_batches=32, counts=(6, 7, 8), round=1)
    totals = build_trace(cfg.job)
    line = steady_state.extrapolate(plan, [ra, rb, rc], totals, cfg.cluster)
    full = simulate(totals, cfg.cluster, options)
    assert abs(line.step_time_s - full.step_time_s) > 5 * MICROSECOND
    assert not steady_state._inserted_round(b, c, rc.step_time_s - rb.step_time_s)
    assert steady_step(cfg.job, cfg.cluster, options) is None


def test_records_faults_and_expanded_ranks_are_replayed():
    cfg = config("1f1b")
    for options in (simulation_options(cfg), replace(simulation_options(cfg), record=False,
                                                     expand=True),
                    replace(simulation_options(cfg), record=False,
                            comm_slowdown_when_overlapped=0.3)):
        assert steady_state.replay_reason(cfg.job, cfg.cluster, options)


def test_shorter_steps_keep_the_schedule_shape_and_stay_shorter():
    cfg = config("interleaved")
    plans = probe_plans(cfg.job)
    assert [p.counts for p in plans] == [(8, 12, 16), (16, 20, 24), (32, 36, 40),
                                         (64, 68, 72), (128, 132, 136)]   # twice the last
    assert all(p.round == 4 and p.counts[2] < cfg.job.micro_batches for p in plans)


def test_a_plan_that_cannot_finish_within_the_allowance_is_never_started(monkeypatch):
    """Shorter steps of a plan that would overrun the allowance are wasted: none is run."""
    cfg = config("1f1b")
    options = replace(simulation_options(cfg), record=False)
    first = probe_plans(cfg.job)[0]
    monkeypatch.setattr(steady_state, "SHORTER_SHARE",
                        (sum(first.counts) - 1) / cfg.job.micro_batches)
    started = []

    class Counting(StepSimulation):
        def __init__(self, trace, *args, **kwargs):
            started.append(trace)
            super().__init__(trace, *args, **kwargs)

    monkeypatch.setattr(steady_state, "StepSimulation", Counting)
    assert steady_step(cfg.job, cfg.cluster, options) is None
    assert started == []
    monkeypatch.setattr(steady_state, "SHORTER_SHARE", sum(first.counts) / cfg.job.micro_batches)
    assert steady_step(cfg.job, cfg.cluster, options) is not None
    assert len(started) == 3


@pytest.mark.parametrize("name", ["1f1b", "zero3-dp2", "gpipe"])
def test_the_critical_summary_is_the_step_summary_of_its_class(name):
    """Only the critical class is attributed, with the step summary's numbers exactly."""
    cfg = config(name)
    options = replace(simulation_options(cfg), record=False)
    trace = build_trace(cfg.job)
    sim = StepSimulation(trace, cfg.cluster, options)
    replay = sim.replay()
    full, kept = sim.summary(replay), critical_summary(replay, trace)
    assert len(full.classes) > 1
    assert kept.classes == tuple((c.index, c.program, c.ranks, c.representative)
                                 for c in full.classes)
    assert kept.finish_s == tuple(c.finish_s for c in full.classes)
    assert kept.step_time_s == full.step_time_s
    assert kept.critical_class == full.critical_class
    assert kept.breakdown == full.breakdown
    assert kept.peak_memory_bytes / 1e9 == full.peak_memory_gb

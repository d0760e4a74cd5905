"""A sweep point from its pipeline's steady state equals the full replay, to the microsecond and
below; whatever is not periodic is replayed in full."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import simulation_options
from clustersim.analysis.sweeps import op_repeats, steady_state, steady_window
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

GPT3_WIDTH = {"name": "gpt3-width", "layers": 16, "hidden": 12288, "heads": 96, "vocab": 51200}
"""GPT-3 175B's layer on A100 with TP16 across two nodes: the transfers of neighbouring stages
meet on the shared NICs, and the pipeline settles late or repeats only every few rounds."""

SETTLING = {"name": "settling", "model": GPT3_WIDTH,
            "training": {"seq_len": 1024, "global_batch": 256},
            "strategy": {"tp": 16, "pp": 4, "dp": 1, "zero": 3},
            "cluster": {"gpu": "a100-80gb", "num_gpus": 64}}
"""A 1F1B pipeline that settles stage by stage: not before about 16 micro-batches. (At 2,048
tokens it settled early enough for one shorter step once attention ran at its key length.)"""

TWO_ROUNDS = {"name": "two-rounds", "model": {**GPT3_WIDTH, "layers": 96},
              "training": {"seq_len": 2048, "global_batch": 768},
              "strategy": {"tp": 16, "pp": 8, "dp": 1, "schedule": "interleaved",
                           "virtual_stages": 2},
              "cluster": {"gpu": "a100-80gb", "num_gpus": 128}}
"""An interleaved pipeline that repeats every 2 rounds (16 micro-batches), from about the
16th. (With 64 layers it repeated every round once attention ran at its key length: 96.)"""

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
    assert not op_repeats.inserted_round(b, c, rc.step_time_s - rb.step_time_s)
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
    micro = cfg.job.micro_batches
    shape = steady_state._warmups(cfg.job, micro)
    assert {p.round for p in plans} == {4, 8, 16}   # 1, 2 and 4 rounds of pp = 4
    assert sorted(p.counts for p in plans if p.round == 4)[:4] == [
        (20, 24), (20, 24, 28), (32, 36), (32, 36, 40)]   # half again
    for p in plans:
        assert len(p.counts) in (2, 3) and p.counts[-1] < micro
        assert all(b - a == p.round for a, b in zip(p.counts, p.counts[1:]))
        assert (micro - p.counts[-1]) % p.round == 0
        assert steady_state._warmups(with_micro_batches(cfg.job, p.counts[0]), p.counts[0]) \
            == shape
        # three periods of steady state after the longest warm-up (11 forwards of 2 chunks)
        assert 2 * p.counts[0] - max(shape) >= 3 * 2 * p.round
    assert [sum(p.counts) for p in plans] == sorted(sum(p.counts) for p in plans)


def count_replays(monkeypatch) -> list:
    """The traces of every shorter step the steady state replays from now on."""
    started = []

    class Counting(StepSimulation):
        def __init__(self, trace, *args, **kwargs):
            started.append(trace)
            super().__init__(trace, *args, **kwargs)

    monkeypatch.setattr(steady_state, "StepSimulation", Counting)
    return started


def test_a_step_that_cannot_finish_within_the_allowance_is_never_started(monkeypatch):
    """Shorter steps that would overrun the allowance are wasted: none is run. The first
    step tried is the shortest with steady state, alone: its own records show it repeating."""
    cfg = config("1f1b")
    options = replace(simulation_options(cfg), record=False)
    first = steady_state.first_count(cfg.job, 1, steady_state.ONE_STEP_PERIODS)
    monkeypatch.setattr(steady_state, "SHORTER_SHARE", (first - 1) / cfg.job.micro_batches)
    started = count_replays(monkeypatch)
    assert steady_step(cfg.job, cfg.cluster, options) is None
    assert started == []
    monkeypatch.setattr(steady_state, "SHORTER_SHARE", first / cfg.job.micro_batches)
    assert steady_step(cfg.job, cfg.cluster, options) is not None
    assert [len(t.programs[0].ops) for t in started] == [
        len(build_trace(with_micro_batches(cfg.job, first)).programs[0].ops)]


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


def replays(cfg, options, *counts):
    """Steps of ``counts`` micro-batches replayed, with their step times."""
    out = []
    for m in counts:
        replay = StepSimulation(build_trace(with_micro_batches(cfg.job, m)), cfg.cluster,
                                options).replay()
        out.append((replay, max(t.finish_s for t in replay.timelines)))
    return out


def test_a_period_of_two_rounds_is_found_and_one_round_is_refused():
    """One round apart, the steps are not the shorter with a round inserted (the pipeline
    does not repeat round by round); two rounds apart they are, and the period settles."""
    cfg = config_from_mapping(TWO_ROUNDS)
    options = replace(simulation_options(cfg), record=False)
    (a, ta), (b, tb), (c, tc) = replays(cfg, options, 32, 40, 48)
    assert not op_repeats.inserted_round(a, b, tb - ta)
    assert op_repeats.inserted_round(a, c, tc - ta)


def assert_steady_equals_full(mapping: dict) -> None:
    """The step of ``mapping`` comes from shorter steps, and equals its full replay."""
    cfg = config_from_mapping(mapping)
    options = replace(simulation_options(cfg), record=False)
    full = point_of(simulate(build_trace(cfg.job), cfg.cluster, options))
    fast = steady_step(cfg.job, cfg.cluster, options)
    assert fast is not None
    assert_same_point(full, replace(fast, events=full.events))


@pytest.mark.slow
def test_a_step_that_repeats_every_two_rounds_equals_its_full_replay():
    assert_steady_equals_full(TWO_ROUNDS)


def test_a_pipeline_that_settles_late_comes_from_one_step_past_its_settling(monkeypatch):
    """The shortest step is refused (stages after the first have not settled when it parts
    from a longer one); one step past the settling gives the full replay's point, with 256
    micro-batches and with 96, where a pair past the settling would not fit in half of them."""
    assert_steady_equals_full(SETTLING)
    short = {**SETTLING, "training": {"seq_len": 1024, "global_batch": 96}}
    cfg = config_from_mapping(short)
    options = replace(simulation_options(cfg), record=False)
    probes = steady_state._ProbeSteps(cfg.job, cfg.cluster, options)
    shortest = steady_state.first_count(cfg.job, 1, steady_state.ONE_STEP_PERIODS)
    assert probes.one_step(shortest) is None
    started = count_replays(monkeypatch)
    assert_steady_equals_full(short)
    assert len(started) == 2   # the shortest, then one past the settling


def test_one_step_is_refused_where_it_does_not_repeat_one_period_before_parting():
    """An interleaved pipeline that repeats every two rounds: the step of 96 micro-batches
    does not repeat one round (8) before it parts from a longer one, and does two rounds."""
    cfg = config_from_mapping(TWO_ROUNDS)
    options = replace(simulation_options(cfg), record=False)
    probes = steady_state._ProbeSteps(cfg.job, cfg.cluster, options)
    replay, _ = probes.run(96)
    one, two = probes.divergence(96, 8), probes.divergence(96, 16)
    assert steady_window.repeat_before_parting(replay, one, probes.recvs[96], 1e-10)[0] is None
    repeat, _ = steady_window.repeat_before_parting(replay, two, probes.recvs[96], 1e-10)
    assert repeat is not None
    (_, t96), (_, t112) = replays(cfg, options, 96, 112)
    assert t112 - t96 == pytest.approx(repeat.growth_s, abs=1e-9)


def test_settled_share_counts_stages_that_repeat_a_period():
    cfg = config_from_mapping(SETTLING)
    options = replace(simulation_options(cfg), record=False)
    probes = steady_state._ProbeSteps(cfg.job, cfg.cluster, options)
    early, late = probes.run(8)[0], probes.run(40)[0]
    lags = probes.lags(8, 9)
    assert 0 < op_repeats.settled_share(early, lags) < 1   # the first stages only
    assert op_repeats.settled_share(late, lags) == 1

"""A step of many micro-batches from three short ones: the pipeline's steady state, simulated once.

With identical micro-batches a 1F1B or interleaved pipeline repeats itself once every stage's
warm-up is over: each further period of the schedule (one micro-batch under 1F1B, or ``pp``;
one to four rounds of ``pp`` under the interleaved schedule, whose micro-batches advance in
rounds of ``pp``) adds the same time to the step and to each part of every rank class's
breakdown, while warm-up, drain, gradient reduction and optimizer stay what they are. The step
time is then affine in the number of periods, and a step of ``m`` micro-batches follows from
two or three shorter ones one period apart, whose schedule has the same shape.

One shorter step may be enough: where its own records show every class repeating a period
before it parts from a step a period longer (``steady_window``), the longer steps follow without
a second replay of the warm-up; that is tried first, then pairs or triples of steps.

This is a check, not an assumption. A pipeline can take hundreds of micro-batches to settle
(GPT-3 175B with TP16 across two A100 nodes: each 1F1B stage about 5.5 micro-batches after
the one before), and an interleaved one may repeat only every few rounds (TP16 x PP8: every 4,
32 micro-batches; steps one round apart are then ms off). So each shorter step is compared op
by op with the next: every op of every rank class must either end exactly as before (ahead of
the inserted period) or exactly one period's growth later (after it). Then a period of the
longer step repeats the one before it, shifted; a pair stands for the step when, in every
class of the longer step, the inserted period's ops each end one period's growth after the
same op a period before (the state it leaves is the one it found), and a triple when every
class's finish time and each part of the critical class's breakdown grow by the same amount
over both periods, within :data:`TOLERANCE_S`. A step whose first shorter step shows a stage
that repeats no period is not continued, and when only some stages have settled, shorter steps
than the share settled needs are not tried. When anything fails, or when something is not the
same in every micro-batch (faults, interference, expanded ranks, per-op records for a trace,
FP8 weight casts spread over the step's micro-batches, uneven data-parallel replicas), the step
is replayed in full.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator import Breakdown, Replay, SimulationOptions, StepSimulation
from clustersim.simulator.interference import Interference
from clustersim.simulator.metrics import step_metrics
from clustersim.simulator.summary import critical_position
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.strategies.pipeline import stage_order
from clustersim.workloads.strategy import Schedule
from clustersim.workloads.training import Precision
from clustersim.workloads.trace import Op, RecvOp, Trace

from clustersim.analysis.sweeps.critical_summary import CriticalSummary, critical_summary
from clustersim.analysis.sweeps.op_repeats import (
    OP_TOLERANCE_S, inserted_round, settled_round, settled_share,
)
from clustersim.analysis.sweeps.steady_window import (
    WINDOW_PERIODS, Divergence, divergence, extended, repeat_before_parting,
)

TOLERANCE_S = 1e-7
"""How far (seconds) an extrapolated number may be from the full replay's, in the worst case the
check allows: a tenth of the microsecond that step times are compared to."""

SHORTER_SHARE = 1 / 2
"""The shorter steps tried for a step run at most this share of its micro-batches, together: a
step that never settles costs at most 3/2 replays, one that does at most half of one. An
interleaved step of 24 rounds (GPT-3 175B, TP16 x PP32 of 768 micro-batches) settles about a
round after its warm-up and needs 11 of them for its pair (5 and 6 rounds)."""

STEADY_PERIODS = 3
"""Periods of steady state after the longest warm-up in a plan's first step: two to show a
period repeat the one before it (:func:`settled_share`), and one for the pipeline to settle
after its warm-up (GPT-3 175B, TP16 or TP32 x PP32 interleaved on A100: about one round)."""

ONE_STEP_PERIODS = STEADY_PERIODS + WINDOW_PERIODS
"""Periods of steady state after the longest warm-up in the first step that alone may stand
for the step: the first stage parts from a longer step before the last has run as many, and
the ops of :data:`steady_window.WINDOW_PERIODS` periods before that must repeat."""

REPEATING_SHARE = 1 / 4
"""A shorter step where fewer than this share of the rank classes repeat a period of their own
before it parts from a longer one is not settling: no further step is tried, and the step is
replayed in full. A pipeline that settles stage by stage repeats in many of its stages early
(GPT-3 175B on A100, 1F1B: TP16 x PP32 in 29 of 32 at 64 micro-batches, all from about 250;
TP16 x PP8 in 5 of 8 at 16; the four-stage test pipeline in 1 of 4 at 12); TP16 x PP64, with
stages of one and two layers whose transfers meet on the NICs, repeats in 7 of 64 at 128 and
in none up to 512 (per micro-batch 20.6 to 21.6 ms, and no period of 64 or 128); interleaved
TP32 x PP8 in none of 8 at 64."""

INTERLEAVED_PERIODS = (1, 2, 4)
"""Periods, in rounds of ``pp`` micro-batches, looked for in an interleaved pipeline."""

STEADY_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
"""Schedules with a warm-up, a steady state and a drain (GPipe has no steady state; DualPipe's
phases depend on the micro-batch count)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Probes:
    """Shorter steps, a pair or a triple, that may stand for a step of ``micro_batches``."""

    micro_batches: int
    counts: tuple[int, ...]
    """Micro-batches of the shorter steps, one period apart: a pair or a triple."""
    round: int
    """Micro-batches per period: the shorter steps are one period apart, and the full step
    is a whole number of periods past the last."""

    @property
    def rounds_beyond(self) -> int:
        """Periods between the last shorter step and the full one."""
        return (self.micro_batches - self.counts[-1]) // self.round


def replay_reason(job: Job, cluster: ClusterSpec, options: SimulationOptions) -> str | None:
    """Why the step must be replayed in full (None: its steady state may stand for it)."""
    s, training = job.strategy, job.training
    if options.record:
        return "per-op records asked for"
    if options.expand:
        return "every rank followed on its own"
    if Interference.of(cluster.device, comm=options.comm_slowdown_when_overlapped,
                       compute=options.compute_slowdown_when_overlapped).any:
        return "compute/communication interference depends on what overlaps what"
    if s.schedule not in STEADY_SCHEDULES:
        return f"schedule {s.schedule.value} has no steady state"
    if s.replica_batch:
        return "uneven data-parallel replicas"
    if training.precision is Precision.FP8:
        return "FP8 weight casts are spread over the step's micro-batches"
    return None


def probe_plans(job: Job) -> list[Probes]:
    """Shorter steps to try, the cheapest first: for each period, a pair and a triple from the
    fewest micro-batches whose schedule has the full step's shape and, in every stage,
    :data:`STEADY_PERIODS` periods of steady state after the warm-up, then
    half as many again and so on (a pipeline may take many periods to settle). A 1F1B period
    is one micro-batch where nothing but the schedule repeats, ``pp`` where transfers of
    neighbouring stages meet on shared links in a pattern that repeats with the pipeline; the
    interleaved schedule's micro-batches advance in rounds of ``pp``, and its transfers may
    repeat only every few rounds (GPT-3 175B, TP16 x PP8 on A100: every 4 rounds, 32
    micro-batches): periods of :data:`INTERLEAVED_PERIODS` rounds are tried."""
    micro = job.micro_batches
    if _warmups(job, micro) is None:
        return []
    plans = []
    for period in periods(job):
        first = first_count(job, period)
        while first + period < micro:
            plans.append(Probes(micro_batches=micro, round=period,
                                counts=(first, first + period)))
            if first + 2 * period < micro:
                plans.append(Probes(micro_batches=micro, round=period,
                                    counts=(first, first + period, first + 2 * period)))
            first += max(period, -(-first // (2 * period)) * period)   # half again, one residue
    return sorted(plans, key=lambda p: (sum(p.counts), p.round))


def periods(job: Job) -> list[int]:
    """Micro-batches per period to look for, shortest first (see :func:`probe_plans`)."""
    s = job.strategy
    interleaved = s.schedule is Schedule.INTERLEAVED and s.virtual_stages > 1
    return sorted({s.pp * k for k in INTERLEAVED_PERIODS} if interleaved else {1, s.pp})


def first_count(job: Job, period: int, steady: int = STEADY_PERIODS) -> int:
    """The fewest micro-batches, in the full step's residue modulo ``period``, whose schedule
    has the full step's shape and ``steady`` periods of steady state after the longest
    warm-up (``job.micro_batches`` when none has)."""
    s, micro = job.strategy, job.micro_batches
    shape = _warmups(job, micro)
    if shape is None:
        return micro
    first = micro % period or period
    while first < micro and (_warmups(job, first) != shape or
                             first * s.virtual_stages - max(shape)
                             < steady * period * s.virtual_stages):
        first += period
    return first


def _warmups(job: Job, micro: int) -> tuple[int, ...] | None:
    """Each stage's forwards before its first backward with ``micro`` micro-batches (None when
    some stage has no steady state: its warm-up runs every forward)."""
    s = job.strategy
    out = []
    for stage in range(s.pp):
        order = stage_order(s.schedule, s.pp, s.virtual_stages, micro, stage,
                            merge=s.moe_a2a_overlap)
        warmup = next(i for i, slot in enumerate(order) if slot.kind is Pass.BACKWARD)
        if warmup >= micro * s.virtual_stages:
            return None
        out.append(warmup)
    return tuple(out)


def with_micro_batches(job: Job, micro: int) -> Job:
    """``job`` with ``micro`` micro-batches per pipeline (the global batch scaled to match)."""
    t = job.training
    return replace(job, training=replace(t, global_batch=micro * t.micro_batch * job.strategy.dp))


@dataclass(frozen=True, kw_only=True, slots=True)
class StepPoint:
    """What a sweep keeps of a step: its time, rates and the critical class's breakdown."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown: Breakdown
    critical_class: int
    events: int
    """SimPy events processed to find it (every shorter step's, when extrapolated)."""

    @classmethod
    def of(cls, r: CriticalSummary, totals: Trace, cluster: ClusterSpec,
           step_time_s: float | None = None, events: int | None = None) -> StepPoint:
        """The point of ``r``, or of a step of ``step_time_s`` with ``r``'s breakdown;
        ``totals``: a trace with the step's model FLOPs and tokens (for its rates)."""
        step = r.step_time_s if step_time_s is None else step_time_s
        rates = step_metrics(step, totals, cluster, (float("inf"),) * len(totals.programs))
        return cls(step_time_s=step, tokens_per_s=rates.tokens_per_s,
                   tflops_per_gpu=rates.tflops_per_gpu, mfu=rates.mfu, breakdown=r.breakdown,
                   critical_class=r.critical_class, events=r.events if events is None else events)


def replayed(trace: Trace, cluster: ClusterSpec, options: SimulationOptions) -> CriticalSummary:
    """``trace`` replayed in full on ``cluster``, summarised as a sweep needs it."""
    return critical_summary(StepSimulation(trace, cluster, options).replay(), trace)


def simulate_job(job: Job, cluster: ClusterSpec, options: SimulationOptions) -> StepPoint:
    """The step of ``job``: from its steady state where that is exact, else replayed in full."""
    if replay_reason(job, cluster, options) is None:
        steady = steady_step(job, cluster, options)
        if steady is not None:
            return steady
    trace = build_trace(job)
    return StepPoint.of(replayed(trace, cluster, options), trace, cluster)


def steady_step(job: Job, cluster: ClusterSpec, options: SimulationOptions) -> StepPoint | None:
    """The step of ``job`` from shorter steps (:func:`probe_plans`), or None when none of them
    is periodic within :data:`SHORTER_SHARE` of its micro-batches. The next plan tried is the
    one that needs the fewest micro-batches more; a plan whose steps would not all fit in the
    allowance, with the steps already run, is never started (its first steps would be wasted),
    and after the first plan, none is continued whose first step shows a stage that repeats no
    period of the plan's length (:func:`settled_share`). When a failed plan's steps were not
    one period apart and its longest shows only some stages settled, the pipeline is settling
    stage by stage (``_ProbeSteps.settle_floor``): shorter steps than the share settled would
    need are not tried with that period. A pair stands for the step when its
    longer step is settled around the inserted period (:func:`settled_round`); else the
    third step of its triple checks that the step grows the same over two periods."""
    probes = _ProbeSteps(job, cluster, options)
    budget = SHORTER_SHARE * job.micro_batches
    steady = probes.one_step_search(budget)
    if steady is not None or probes.aperiodic:
        return steady
    floor: dict[int, float] = {}
    """period -> the fewest micro-batches worth trying with it."""
    plans = probe_plans(job)
    while True:
        plans = [p for p in plans if p.counts[0] >= floor.get(p.round, 0)
                 and probes.spent + probes.new_steps(p) <= budget   # it could finish
                 and all(probes.apart.get(pair, True) for pair in zip(p.counts, p.counts[1:]))]
        if not plans:
            return None
        plan = min(plans, key=lambda p: (probes.new_steps(p), p.round, sum(p.counts)))
        plans.remove(plan)
        steady = probes.try_plan(plan)
        if steady is not None:
            return steady
        if not all(probes.apart.get(pair, False) for pair in zip(plan.counts, plan.counts[1:])):
            period, least = probes.settle_floor(plan)   # not one period apart: too early?
            floor[period] = max(floor.get(period, 0.0), least)


class _ProbeSteps:
    """The shorter steps of one job replayed so far (each once), and what they showed."""

    def __init__(self, job: Job, cluster: ClusterSpec, options: SimulationOptions):
        self.job, self.cluster, self.options = job, cluster, options
        self.done: dict[int, tuple[Replay, CriticalSummary]] = {}
        self.ops: dict[int, tuple[int, ...]] = {}
        """micro-batches -> each program's op count (known once its trace is built)."""
        self.traces: dict[int, Trace] = {}
        """Built, not replayed yet."""
        self.apart: dict[tuple[int, int], bool] = {}
        """Whether the longer of two steps is the shorter with a period inserted, op by op."""
        self.totals: Trace | None = None
        self.critical_ops: dict[int, tuple[Op, ...]] = {}
        """micro-batches -> the ops of the critical class's program (for its breakdown)."""
        self.aperiodic = False
        """Whether a step was seen that is not settling (:data:`REPEATING_SHARE`)."""
        self.repeating = 0
        """The most classes that repeated a period of their own before a step parted from a
        longer one (:meth:`one_step`)."""
        self.recvs: dict[int, list[np.ndarray]] = {}
        """micro-batches -> for each program, which of its ops are receives."""
        self.divergences: dict[tuple[int, int], Divergence | None] = {}
        """(micro-batches, period) -> where the step parts from one a period longer."""

    @property
    def spent(self) -> int:
        return sum(self.done)

    def new_steps(self, plan: Probes) -> int:
        """Micro-batches of ``plan``'s steps not run yet."""
        return sum(m for m in plan.counts if m not in self.done)

    def trace(self, micro: int) -> Trace:
        if micro not in self.traces:
            self.traces[micro] = build_trace(with_micro_batches(self.job, micro))
            self.ops[micro] = tuple(len(p.ops) for p in self.traces[micro].programs)
        return self.traces[micro]

    def run(self, micro: int) -> tuple[Replay, CriticalSummary]:
        if micro not in self.done:
            trace = self.trace(micro)
            del self.traces[micro]
            replay = StepSimulation(trace, self.cluster, self.options).replay()
            summary = critical_summary(replay, trace)
            self.done[micro] = replay, summary
            program = next(tl.rank_class.program for tl in replay.timelines
                           if tl.rank_class.index == summary.critical_class)
            self.critical_ops[micro] = trace.programs[program].ops
            self.recvs[micro] = [np.fromiter((isinstance(op, RecvOp) for op in p.ops), bool,
                                             len(p.ops)) for p in trace.programs]
            self.totals = self.totals or replace(
                trace, model_flops=self.job.model_flops_per_step,
                tokens=float(self.job.training.tokens_per_step))
        return self.done[micro]

    def programs_of(self, micro: int) -> list[tuple[Op, ...]]:
        return [p.ops for p in self.trace(micro).programs]

    def divergence(self, micro: int, period: int) -> Divergence | None:
        if (micro, period) not in self.divergences:
            self.divergences[micro, period] = divergence(
                self.programs_of, micro, period, first_count(self.job, period, steady=0))
        return self.divergences[micro, period]

    def one_step(self, micro: int) -> StepPoint | None:
        """The step from the one of ``micro`` micro-batches, where its records show the state
        repeating one period before it parts from a longer step (``steady_window``)."""
        replay, summary = self.run(micro)
        for period in periods(self.job):
            rounds, rest = divmod(self.job.micro_batches - micro, period)
            div = None if rest or rounds <= 0 else self.divergence(micro, period)
            if div is None:
                continue
            repeat, repeating = repeat_before_parting(
                replay, div, self.recvs[micro], min(OP_TOLERANCE_S, TOLERANCE_S / rounds))
            self.repeating = max(self.repeating, repeating)
            grown = None if repeat is None else extended(
                summary, replay, self.critical_ops[micro], repeat, rounds)
            if grown is not None:
                return StepPoint.of(grown[0], self.totals, self.cluster, step_time_s=grown[1],
                                    events=sum(r.events for _, r in self.done.values()))
        return None

    def one_step_search(self, budget: float) -> StepPoint | None:
        """The step from one shorter step (:meth:`one_step`): the fewest micro-batches with
        steady state first, then one as long as the share of settled classes suggests
        (stages settle one after the other), two to four times as long, and at most what is
        left of ``budget`` micro-batches. Each is a whole number of the longest period short
        of the step (where that fits), so that every period can be checked. Only under 1F1B:
        an interleaved period is a round of pp or more, and two of them before the parting
        point take more micro-batches than a pair of steps one period apart (interleaved TP16
        x PP8 on A100, 192 micro-batches: a pair of 2-round steps, where one step did not fit)."""
        periods_ = periods(self.job)
        if periods_[0] != 1:
            return None
        first = first_count(self.job, periods_[0], ONE_STEP_PERIODS)
        micro = self._in_residue(first, budget, least=first)
        while micro is not None:
            steady = self.one_step(micro)
            if steady is not None:
                return steady
            if self.repeating < REPEATING_SHARE * len(self.done[micro][0].timelines):
                self.aperiodic = True
                return None
            div = self.divergence(micro, periods_[0])
            if div is None:
                return None
            replay = self.done[micro][0]
            share = settled_share(replay, tuple(div.lag[tl.rank_class.program]
                                                for tl in replay.timelines))
            wanted = min(max(micro / share if share > 0 else 0, 2 * micro), 4 * micro)
            micro = self._in_residue(wanted, budget, least=micro + periods_[0])
        return None

    def _in_residue(self, wanted: float, budget: float, least: int = 0) -> int | None:
        """Micro-batches near ``wanted`` for one step, at least ``least``, a whole number of
        periods short of the full step (the longest period where that fits), that the
        steps run so far leave room for in ``budget`` (None: none)."""
        full, room = self.job.micro_batches, budget - self.spent
        for period in reversed(periods(self.job)):
            up = full - (full - max(wanted, least)) // period * period
            down = full - -(-(full - min(wanted, room)) // period) * period
            micro = up if up <= room else down
            if max(least, 1) <= micro < full and micro <= room:
                return int(micro)
        return None

    def lags(self, shorter: int, longer: int) -> tuple[int, ...]:
        """Each class's ops inserted between the steps of ``shorter`` and ``longer``."""
        if longer not in self.ops:
            self.trace(longer)
        a, b = self.ops[shorter], self.ops[longer]
        return tuple(b[tl.rank_class.program] - a[tl.rank_class.program]
                     for tl in self.done[shorter][0].timelines)

    def try_plan(self, plan: Probes) -> StepPoint | None:
        """The step from ``plan``'s steps, run as far as they agree (None: they do not)."""
        first, second = plan.counts[:2]
        not_first_plan = bool(self.done) and first not in self.done
        a, ra = self.run(first)
        if not_first_plan and second not in self.done and settled_share(a, self.lags(first, second)) < 1:
            return None   # a stage repeats no period yet: the longer step would be wasted
        for earlier, later in zip(plan.counts, plan.counts[1:]):
            if (earlier, later) not in self.apart:
                (a, ra), (b, rb) = self.run(earlier), self.run(later)
                self.apart[earlier, later] = inserted_round(a, b,
                                                             rb.step_time_s - ra.step_time_s)
            if not self.apart[earlier, later]:
                return None
        if len(plan.counts) == 2:
            (a, ra), (b, rb) = (self.done[m] for m in plan.counts)
            if not settled_round(a, b, rb.step_time_s - ra.step_time_s):
                return None
        steady = extrapolate(plan, [self.done[m][1] for m in plan.counts], self.totals,
                             self.cluster)
        return None if steady is None else replace(
            steady, events=sum(r.events for _, r in self.done.values()))

    def settle_floor(self, plan: Probes) -> tuple[int, float]:
        """The fewest micro-batches worth trying after ``plan`` failed, for ``plan``'s period
        (another may be the pipeline's: ZeRO-1 over two replicas repeats every pp micro-batches):
        when its longest step shows some stages settled and others not (a pipeline that
        settles stage by stage: GPT-3 175B, TP16 x PP32 1F1B on A100, about 5.5 micro-batches
        a stage), that step over the share settled; when it shows none, twice that step."""
        longest = max(m for m in plan.counts if m in self.done)
        share = settled_share(self.done[longest][0], self.lags(*plan.counts[:2]))
        if share == 0:
            return plan.round, 2.0 * longest
        return plan.round, longest / share if share < 1 else 0.0


def extrapolate(plan: Probes, shorter: list[CriticalSummary], totals: Trace,
                cluster: ClusterSpec) -> StepPoint | None:
    """The full step from the results of ``plan``'s shorter steps, or None when they do not
    grow by the same amount every round: every class's finish time (which class finishes
    last) and the critical class's breakdown. ``totals``: a trace whose model FLOPs and
    tokens are the full step's (for its throughput and MFU). ``events``: the shorter steps'."""
    if not _same_shape(shorter):
        return None
    line = _Line(plan.rounds_beyond)
    finish = [line.at(*(r.finish_s[i] for r in shorter)) for i in range(len(shorter[0].classes))]
    if None in finish:
        return None
    critical = critical_position(finish, [c[0] for c in shorter[0].classes])
    parts = line.breakdown(*(r.breakdown for r in shorter))
    if shorter[0].classes[critical][0] != shorter[0].critical_class or parts is None:
        return None
    return StepPoint.of(replace(shorter[-1], breakdown=parts), totals, cluster,
                        step_time_s=finish[critical], events=sum(r.events for r in shorter))


def _same_shape(shorter: list[CriticalSummary]) -> bool:
    """The same classes, critical class, communication axes and memory in every shorter step."""
    def shape(r: CriticalSummary) -> tuple:
        return (r.critical_class, r.peak_memory_bytes, r.classes,
                tuple(r.breakdown.exposed_comm_s))
    return len({shape(r) for r in shorter}) == 1


@dataclass(frozen=True, slots=True)
class _Line:
    """Extrapolation over ``rounds`` more periods from two or three values one period apart."""

    rounds: int

    def at(self, *values: float) -> float | None:
        """The last value plus ``rounds`` times the last period's growth; from three values,
        None when the two periods grew by amounts so different that a drift at that rate would
        move the result by more than :data:`TOLERANCE_S` (a second difference r kept for k
        periods adds r k (k+1) / 2). Two values: a settled pair, checked op by op instead."""
        b, c = values[-2:]
        growth, k = c - b, self.rounds
        if len(values) == 3 and abs(growth - (b - values[0])) * k * (k + 1) / 2 > TOLERANCE_S:
            return None
        return c + k * growth

    def breakdown(self, *parts: Breakdown) -> Breakdown | None:
        values = {name: self.at(*(getattr(p, name) for p in parts)) for name in _PARTS}
        exposed = {axis: self.at(*(p.exposed_comm_s[axis] for p in parts))
                   for axis in parts[-1].exposed_comm_s}
        if None in values.values() or None in exposed.values():
            return None
        return Breakdown(exposed_comm_s=exposed, **values)


_PARTS = ("compute_s", "bubble_s", "optimizer_s", "other_s", "offload_s", "host_s")
"""Breakdown parts besides the exposed communication of each axis."""

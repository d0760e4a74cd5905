"""A step of many micro-batches from three short ones: the pipeline's steady state, simulated once.

With identical micro-batches a 1F1B or interleaved pipeline repeats itself once every stage's
warm-up is over: each further round of the schedule (one micro-batch under 1F1B, ``pp`` under the
interleaved schedule, whose micro-batches advance in groups of ``pp``) adds the same time to the
step and to each part of every rank class's breakdown, while warm-up, drain, gradient reduction
and optimizer stay what they are. The step time is then affine in the micro-batch count, and a
step of ``m`` micro-batches follows from three shorter ones ``m1 < m2 < m3``, one round apart,
whose schedule has the same shape (every stage's warm-up as long as in the full step, and shorter
than its passes).

This is a check, not an assumption. A pipeline can take hundreds of micro-batches to settle: a
stage whose own period is slightly longer than the step's growth absorbs its slack round by round,
and the step time bends once it is used up (seen on GPT-3 175B, TP16 x PP32: three shorter steps
on one line, 8 ms off at 768 micro-batches). So each shorter step is compared op by op with the
next: every op of every rank class must either end exactly as before (ahead of the inserted
round) or exactly one round's growth later (after it). Then a round of the longer step repeats the
one before it, shifted, and by determinism so does every later round: the step is periodic and
its time affine from there on. On top, every class's finish time and each part of the critical
class's breakdown (what a sweep keeps) must grow by the same amount over both rounds, within
:data:`TOLERANCE_S`. When anything fails, or when something is not the same in every micro-batch
(faults, interference, expanded ranks, per-op records for a trace, FP8 weight casts spread over
the step's micro-batches, uneven data-parallel replicas), the step is replayed in full.
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
from clustersim.workloads.trace import Trace

from clustersim.analysis.sweeps.critical_summary import CriticalSummary, critical_summary

TOLERANCE_S = 1e-7
"""How far (seconds) an extrapolated number may be from the full replay's, in the worst case the
check allows: a tenth of the microsecond that step times are compared to."""

SHORTER_SHARE = 1 / 3
"""The shorter steps tried for a step run at most this share of its micro-batches, together: a
step that never settles costs at most 4/3 replays, one that does at most a third of one. A 1F1B
step of 12 micro-batches per stage (``pp``) needs just over a quarter for its first plan (``pp +
1`` to ``pp + 3``); one of 24 cannot afford a second plan after the first failed."""

OP_TOLERANCE_S = 1e-9
"""Rounding allowed when two replays' op times are compared (sums of floats in another order)."""

STEADY_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
"""Schedules with a warm-up, a steady state and a drain (GPipe has no steady state; DualPipe's
phases depend on the micro-batch count)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Probes:
    """Three shorter steps that may stand for a step of ``micro_batches``."""

    micro_batches: int
    counts: tuple[int, int, int]
    """Micro-batches of the shorter steps, one round apart."""
    round: int
    """Micro-batches per round of the schedule."""

    @property
    def rounds_beyond(self) -> int:
        """Rounds between the last shorter step and the full one."""
        return (self.micro_batches - self.counts[2]) // self.round


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
    """Shorter steps to try, the cheapest first: for each round, from the fewest micro-batches
    with the full step's schedule shape, then twice as many and so on (a pipeline may take
    many rounds to settle). A 1F1B round is one micro-batch where nothing but the schedule
    repeats, ``pp`` where transfers of neighbouring stages meet on shared links in a pattern
    that repeats with the pipeline; the interleaved schedule's micro-batches advance in groups
    of ``pp``."""
    s, micro = job.strategy, job.micro_batches
    shape = _warmups(job, micro)
    if shape is None:
        return []
    interleaved = s.schedule is Schedule.INTERLEAVED and s.virtual_stages > 1
    plans = []
    for group in sorted({s.pp} if interleaved else {1, s.pp}):
        first = micro % group or group
        while first < micro and _warmups(job, first) != shape:
            first += group
        while first + 2 * group < micro:
            plans.append(Probes(micro_batches=micro, round=group,
                                counts=(first, first + group, first + 2 * group)))
            first += -(-first // group) * group   # at least twice as many, one residue
    return sorted(plans, key=lambda p: (sum(p.counts), p.round))


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
    """The step of ``job`` from shorter steps (:func:`probe_plans`, each tried in turn, the
    next as soon as two of its steps are not one round apart op by op), or None when none of
    them is periodic within :data:`SHORTER_SHARE` of its micro-batches. A plan whose steps
    would not all fit in that allowance, with the steps already run, is never started: its
    first steps would be wasted."""
    done: dict[int, tuple[Replay, CriticalSummary]] = {}
    totals: Trace | None = None
    budget = SHORTER_SHARE * job.micro_batches
    for plan in probe_plans(job):
        if sum(done) + sum(m for m in plan.counts if m not in done) > budget:
            continue   # it could not finish within the allowance: never start it
        periodic = True
        for earlier, later in ((None, plan.counts[0]), *zip(plan.counts, plan.counts[1:])):
            if later not in done:
                trace = build_trace(with_micro_batches(job, later))
                replay = StepSimulation(trace, cluster, options).replay()
                done[later] = replay, critical_summary(replay, trace)
                totals = totals or replace(trace, model_flops=job.model_flops_per_step,
                                           tokens=float(job.training.tokens_per_step))
            if earlier is not None:
                (a, ra), (b, rb) = done[earlier], done[later]
                if not _inserted_round(a, b, rb.step_time_s - ra.step_time_s):
                    periodic = False
                    break
        if not periodic:
            continue
        steady = extrapolate(plan, [done[m][1] for m in plan.counts], totals, cluster)
        if steady is not None:
            return replace(steady, events=sum(r.events for _, r in done.values()))
    return None


def _inserted_round(shorter: Replay, longer: Replay, growth_s: float) -> bool:
    """Whether ``longer`` is ``shorter`` with one round inserted: in every rank class, each op
    ends at the same time as in ``shorter`` up to some op, and ``growth_s`` later from there to
    the end, the ops counted from the end. (When an op could start says less: a receive is
    posted at the start of the step.)"""
    for a, b in zip(shorter.timelines, longer.timelines, strict=True):
        end, later = np.asarray(a.end_s), np.asarray(b.end_s)
        n, extra = len(end), len(later) - len(end)
        if extra <= 0:
            return False
        same = np.abs(later[:n] - end) <= OP_TOLERANCE_S
        shifted = np.abs(later[extra:] - end - growth_s) <= OP_TOLERANCE_S
        if _leading(same) + _leading(shifted[::-1]) < n:
            return False
    return True


def _leading(ok: np.ndarray) -> int:
    """How many of ``ok`` are true before the first false."""
    misses = np.flatnonzero(~ok)
    return int(misses[0]) if len(misses) else len(ok)


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
    """Extrapolation over ``rounds`` more rounds from three values one round apart."""

    rounds: int

    def at(self, a: float, b: float, c: float) -> float | None:
        """``c`` plus ``rounds`` times the last round's growth, or None when the two rounds
        grew by amounts so different that a drift at that rate would move the result by more
        than :data:`TOLERANCE_S` (a second difference r kept for k rounds adds r k (k+1) / 2)."""
        growth, drift = c - b, (c - b) - (b - a)
        k = self.rounds
        if abs(drift) * k * (k + 1) / 2 > TOLERANCE_S:
            return None
        return c + k * growth

    def breakdown(self, a: Breakdown, b: Breakdown, c: Breakdown) -> Breakdown | None:
        values = {name: self.at(getattr(a, name), getattr(b, name), getattr(c, name))
                  for name in _PARTS}
        exposed = {axis: self.at(a.exposed_comm_s[axis], b.exposed_comm_s[axis], value)
                   for axis, value in c.exposed_comm_s.items()}
        if None in values.values() or None in exposed.values():
            return None
        return Breakdown(exposed_comm_s=exposed, **values)


_PARTS = ("compute_s", "bubble_s", "optimizer_s", "other_s", "offload_s")
"""Breakdown parts besides the exposed communication of each axis."""

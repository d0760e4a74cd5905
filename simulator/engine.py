"""The SimPy engine: replay a Trace on a cluster, one process per (rank class, stream).

- Ops of a stream run in order; an op also waits for its ``deps`` (CUDA-stream semantics). The
  pp stream is the exception: each send/recv is posted as soon as its deps are done, like
  NCCL's non-blocking isend/irecv, so neighbouring stages never deadlock.
- A collective waits until every rank class of its group has reached it (rendezvous), then
  takes the network model's time; a send and its matching recv start together.
- Exposed communication is time the compute stream waits on a communication op; waiting for a
  recv whose sender had not yet posted it is pipeline bubble.
- Same-time events are ordered by SimPy's (time, priority, insertion) key and processes are
  created in a fixed order, so a run is deterministic.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import simpy

from clustersim.hardware_specs import ClusterSpec, Dtype
from clustersim.simulator.classes import RankClass, rank_classes
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.collectives import COPY_KERNEL_S, Algorithm, Plan
from clustersim.simulator.cost.measured import MeasuredNetwork
from clustersim.simulator.cost.network import Instances, NetworkModel
from clustersim.simulator.flows import FlowNetwork
from clustersim.simulator.result import AXES, Breakdown, ClassSummary, OpRecord, StepResult
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyOp, MemoryOp, Op, Phase, RecvOp, SendOp, Stream,
    Trace,
)

_AXIS_OF_GROUP = {"tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "dp": "dp", "embedding": "dp"}


class NetworkMode(enum.Enum):
    FLOW = "flow"
    """Concurrent transfers share network links max-min fairly (``simulator/flows.py``)."""
    ANALYTIC = "analytic"
    """Every collective takes its uncontended time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulationOptions:
    comm_slowdown_when_overlapped: float | None = None
    """Extra fraction of time a collective takes when it starts while the compute stream is
    busy (NCCL kernels and GEMMs compete for SMs and HBM; vTrain, MICRO'24, measured NCCL ~30%
    slower inside training than alone). None: the device's own figure."""
    compute_slowdown_when_overlapped: float | None = None
    """Extra fraction of time compute takes while a transfer of its rank is moving data (the
    same cores or SMs do both): only the overlapping part of an op stretches, whether the op
    or the transfer started first. None: the device's own figure."""
    expand: bool = False
    """Simulate every rank on its own (for checking the rank-class collapse)."""
    record: bool = True
    """Keep per-op records (for the Chrome trace and breakdowns of every class)."""
    network: NetworkMode = NetworkMode.FLOW
    algorithms: Mapping[CollectiveKind, Algorithm] = field(default_factory=dict)
    """Forced collective algorithm per kind (default: NCCL-style automatic choice)."""


@dataclass(frozen=True, slots=True)
class Faults:
    """In-step conditions: per-rank compute slowdown and per-rank network slowdown factors."""

    compute_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 (a straggler GPU: thermal throttling, a bad HBM stack)."""
    link_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the time of every communication it takes part in (degraded NIC
    or cable)."""

    def condition(self, rank: int) -> tuple[float, float]:
        return (self.compute_slowdown.get(rank, 1.0), self.link_slowdown.get(rank, 1.0))

    def ranks(self) -> set[int]:
        return set(self.compute_slowdown) | set(self.link_slowdown)


class _Rendezvous:
    __slots__ = ("needed", "arrived", "event", "posted")

    def __init__(self, env: simpy.Environment, needed: frozenset[int]):
        self.needed = needed
        self.arrived: set[int] = set()
        self.event = env.event()
        self.posted: dict[int, float] = {}


class _ClassState:
    """Run-time state of one rank class."""

    __slots__ = ("cls", "ops", "finish", "arrive", "previous", "waiters", "records",
                 "compute_busy_until", "comms_in_flight", "comm_busy_until", "compute_debt",
                 "seq", "signature", "instances",
                 "compute_slow", "link_slow", "send_posted", "group_classes")

    def __init__(self, cls: RankClass, ops: tuple[Op, ...], slow: tuple[float, float]):
        self.cls = cls
        self.ops = ops
        self.finish: list[float] = [math.nan] * len(ops)
        self.arrive: list[float] = [0.0] * len(ops)
        """When each op was ready to start (its deps and its stream predecessor done)."""
        self.previous: list[int] = [-1] * len(ops)
        """The op before it on its stream (-1: first, or on the unordered pp stream)."""
        self.waiters: dict[int, simpy.Event] = {}
        self.records: list[OpRecord] = []
        self.compute_busy_until = 0.0
        self.comms_in_flight = 0
        self.comm_busy_until = 0.0
        """When the transfers in flight are expected to end (their uncontended times)."""
        self.compute_debt = 0.0
        """Time the running compute op owes to transfers that started while it ran."""
        self.seq: dict[str, int] = {}
        self.signature: dict[str, tuple[int, ...]] = {}
        self.group_classes: dict[str, frozenset[int]] = {}
        self.instances: dict[str, Instances] = {}
        self.compute_slow, self.link_slow = slow
        self.send_posted: dict[int, float] = {}
        """recv op id -> when the matching send was posted (before that it is bubble)."""


class StepSimulation:
    def __init__(self, trace: Trace, cluster: ClusterSpec,
                 options: SimulationOptions = SimulationOptions(), faults: Faults = Faults(),
                 compute: ComputeModel | None = None, network: NetworkModel | None = None):
        """``compute`` and ``network`` replace the default cost models (tests, calibration)."""
        self.trace, self.cluster, self.options, self.faults = trace, cluster, options, faults
        self.compute = compute or ComputeModel(cluster.device)
        model = MeasuredNetwork if cluster.node.measured_comm else NetworkModel
        self.network = network or model(cluster, options.algorithms)
        eff = cluster.device.efficiency
        self.comm_overlap = (options.comm_slowdown_when_overlapped
                             if options.comm_slowdown_when_overlapped is not None
                             else eff.comm_slowdown_when_overlapped)
        self.compute_overlap = (options.compute_slowdown_when_overlapped
                                if options.compute_slowdown_when_overlapped is not None
                                else eff.compute_slowdown_when_overlapped)
        self.env = simpy.Environment()
        self.flows = (FlowNetwork(self.env, self.network.topology.capacity)
                      if options.network is NetworkMode.FLOW else None)
        conditions = {r: faults.condition(r) for r in faults.ranks()}
        self.classes, self.class_of = rank_classes(trace, conditions, expand=options.expand)
        self.states = [
            _ClassState(c, trace.programs[c.program].ops, faults.condition(c.representative))
            for c in self.classes]
        self.rendezvous: dict[tuple, _Rendezvous] = {}
        self._instance_cache: dict[tuple, Instances] = {}

    # --- structure ----------------------------------------------------------------------
    def _signature(self, st: _ClassState, group_set: str) -> tuple[int, ...]:
        sig = st.signature.get(group_set)
        if sig is None:
            group = self.trace.group_of(group_set, st.cls.representative)
            sig = st.signature[group_set] = tuple(int(self.class_of[r]) for r in group)
            st.group_classes[group_set] = frozenset(sig)
            st.instances[group_set] = self._instances(group_set, frozenset(sig))
        return sig

    def _instances(self, group_set: str, classes: frozenset[int]) -> Instances:
        """Device groups of ``group_set`` that hold ranks of ``classes``: the collectives that
        run together when these classes reach it (every DP group of a stage, say)."""
        key = (group_set, classes)
        hit = self._instance_cache.get(key)
        if hit is None:
            gs = self.trace.group_sets[group_set]
            seen = {gs.index[r] for c in sorted(classes) for r in self.classes[c].ranks}
            device = self.cluster.device_of
            hit = self._instance_cache[key] = tuple(
                tuple(device(r) for r in gs.groups[i]) for i in sorted(seen))
        return hit

    def _link_factor(self, classes) -> float:
        return max(self.states[c].link_slow for c in classes)

    # --- waiting ----------------------------------------------------------------------------
    def _wait(self, st: _ClassState, op_id: int) -> simpy.Event:
        ev = st.waiters.get(op_id)
        if ev is None:
            ev = st.waiters[op_id] = self.env.event()
        return ev

    def _done(self, st: _ClassState, op: Op, start: float, category: str) -> None:
        now = self.env.now
        st.finish[op.id] = now
        ev = st.waiters.pop(op.id, None)
        if ev is not None:
            ev.succeed()
        if self.options.record or isinstance(op, ComputeOp):
            st.records.append(OpRecord(st.cls.index, op.id, op.name, op.stream.value, start, now,
                                       category))

    # --- processes --------------------------------------------------------------------------
    def _stream(self, st: _ClassState, ops: list[Op]):
        for op in ops:
            yield from self._run_op(st, op)

    def _single(self, st: _ClassState, op: Op):
        yield from self._run_op(st, op)

    def _run_op(self, st: _ClassState, op: Op):
        finish = st.finish
        for d in op.deps:
            if finish[d] != finish[d]:  # NaN: not finished yet
                yield self._wait(st, d)
        st.arrive[op.id] = self.env.now
        if isinstance(op, ComputeOp):
            yield from self._compute(st, op)
        elif isinstance(op, CollectiveOp):
            yield from self._collective(st, op)
        elif isinstance(op, (SendOp, RecvOp)):
            yield from self._p2p(st, op)
        elif isinstance(op, CopyOp):
            start = self.env.now
            yield self.env.timeout(self.network.copy_time(op.kind, op.bytes))
            self._done(st, op, start, "other")
        elif isinstance(op, MemoryOp):
            self._done(st, op, self.env.now, "memory")

    def _compute(self, st: _ClassState, op: ComputeOp):
        env = self.env
        start = env.now
        duration = self.compute.op_time(op) * st.compute_slow
        if st.comms_in_flight and self.compute_overlap:
            duration += _overlap_penalty(self.compute_overlap, duration, st.comm_busy_until - start)
        st.compute_busy_until = start + duration
        yield env.timeout(duration)
        while st.compute_debt > 0:  # transfers that started while it ran
            debt, st.compute_debt = st.compute_debt, 0.0
            st.compute_busy_until += debt
            yield env.timeout(debt)
        self._done(st, op, start, op.phase.value)

    def _stretch(self, classes) -> float:
        """Bandwidth slowdown of a transfer: degraded links of its members, and interference
        when it starts while their compute streams are busy."""
        factor = self._link_factor(classes)
        slowdown = self.comm_overlap
        if slowdown and any(self.states[c].compute_busy_until > self.env.now for c in classes):
            factor *= 1.0 + slowdown
        return factor

    def _transfer(self, plan: Plan, classes, extra_s: float = 0.0):
        """Run a plan for ``classes``: latency plus the longer of its NVLink part and its
        network part, the network part shared with other traffic under the flow model. While
        it runs, those classes count it as a transfer in flight."""
        env = self.env
        if self.compute_overlap or self.comm_overlap:
            # Let compute ops that start at this instant start first: they overlap it.
            yield env.timeout(0)
        factor = self._stretch(classes)
        if factor != 1.0:
            plan = plan.scaled(factor)
        expected = plan.time(self.network.topology) + extra_s if self.compute_overlap else 0.0
        for c in classes:
            st = self.states[c]
            st.comms_in_flight += 1
            if expected:
                st.comm_busy_until = max(st.comm_busy_until, env.now + expected)
                if st.compute_busy_until > env.now:
                    st.compute_debt += _overlap_penalty(
                        self.compute_overlap, st.compute_busy_until - env.now, expected)
        if self.flows is None or not plan.loads:
            yield env.timeout(plan.time(self.network.topology) + extra_s)
        else:
            start = env.now
            yield self.flows.transfer(plan.loads)
            elapsed = env.now - start
            yield env.timeout(plan.latency_s + max(plan.intra_s, elapsed) - elapsed + extra_s)
        for c in classes:
            self.states[c].comms_in_flight -= 1

    def _run_collective(self, op: CollectiveOp, st: _ClassState, classes):
        instances = self._instances(op.group, classes)
        if len(instances[0]) <= 1 or op.bytes <= 0:
            return
        plan = self.network.plan(op.kind, op.bytes, instances)
        copies = len(instances[0]) * COPY_KERNEL_S if op.per_rank_copies else 0.0
        yield from self._transfer(plan, classes, copies)

    def _collective(self, st: _ClassState, op: CollectiveOp):
        env = self.env
        sig = self._signature(st, op.group)
        arrived = env.now
        needed = st.group_classes[op.group]
        if len(needed) == 1:
            # Every member of the group is in this class: nobody to wait for.
            yield from self._run_collective(op, st, needed)
        else:
            seq = st.seq.get(op.group, 0)
            st.seq[op.group] = seq + 1
            key = (op.group, sig, seq)
            rv = self.rendezvous.get(key)
            if rv is None:
                rv = self.rendezvous[key] = _Rendezvous(env, needed)
            rv.arrived.add(st.cls.index)
            if rv.arrived == rv.needed:
                del self.rendezvous[key]
                yield from self._run_collective(op, st, needed)
                rv.event.succeed()
            else:
                yield rv.event
        self._done(st, op, arrived, _AXIS_OF_GROUP.get(op.group, "dp"))

    def _p2p(self, st: _ClassState, op: SendOp | RecvOp):
        env = self.env
        group = self.trace.group_of(op.group, st.cls.representative)
        peer_rank = group[op.peer]
        peer = int(self.class_of[peer_rank])
        me = st.cls.index
        src, dst = (me, peer) if isinstance(op, SendOp) else (peer, me)
        key = ("p2p", src, dst, op.tag)
        rv = self.rendezvous.get(key)
        if rv is None:
            rv = self.rendezvous[key] = _Rendezvous(env, frozenset((0, 1)))
        side = 0 if isinstance(op, SendOp) else 1
        rv.arrived.add(side)
        rv.posted[side] = env.now
        posted = env.now
        if len(rv.arrived) == 2:
            del self.rendezvous[key]
            if isinstance(op, RecvOp):
                st.send_posted[op.id] = rv.posted[0]
            plan = self._p2p_plan(op, st, src, dst)
            yield from self._transfer(plan, (src,) if src == dst else (src, dst))
            rv.event.succeed()
        else:
            yield rv.event
            if isinstance(op, RecvOp):
                st.send_posted[op.id] = rv.posted[0]
        self._done(st, op, posted, "pp")

    def _p2p_plan(self, op: SendOp | RecvOp, st: _ClassState, src: int, dst: int) -> Plan:
        """All sends of the sending class to the receiving class, as one plan (they happen
        together: every DP and TP replica of a stage sends its activation at once)."""
        sending = isinstance(op, SendOp)
        key = ("p2p", op.group, op.bytes, src, dst, sending, op.peer)
        hit = self._instance_cache.get(key)
        if hit is None:
            gs = self.trace.group_sets[op.group]
            mine, other = (src, dst) if sending else (dst, src)
            device = self.cluster.device_of
            pairs = []
            for r in self.classes[mine].ranks:
                partner = gs.group_of(r)[op.peer]
                if self.class_of[partner] == other:
                    pairs.append((device(r), device(partner)) if sending
                                 else (device(partner), device(r)))
            hit = self._instance_cache[key] = self.network.p2p_plan(op.bytes, pairs)
        return hit

    # --- running ----------------------------------------------------------------------------
    def run(self) -> StepResult:
        wall = time.perf_counter()
        for st in self.states:
            by_stream: dict[Stream, list[Op]] = {}
            for op in st.ops:
                by_stream.setdefault(op.stream, []).append(op)
            for stream, ops in by_stream.items():
                if stream is not Stream.PP:
                    for before, after in zip(ops, ops[1:]):
                        st.previous[after.id] = before.id
                if stream is Stream.PP:
                    for op in ops:
                        self.env.process(self._single(st, op))
                else:
                    self.env.process(self._stream(st, ops))
        self.env.run()
        stuck = [st for st in self.states if any(f != f for f in st.finish)]
        if stuck:
            st = stuck[0]
            op = st.ops[next(i for i, f in enumerate(st.finish) if f != f)]
            raise RuntimeError(f"deadlock: rank class {st.cls.index} never finished op {op.id} "
                               f"({op.name}); the trace's collectives or send/recv do not match")
        return self._result(time.perf_counter() - wall)

    def _blocker(self, st: _ClassState, op_id: int) -> int:
        """The dep (or stream predecessor) that finished last before ``op_id`` could start."""
        op = st.ops[op_id]
        candidates = list(op.deps) + ([st.previous[op_id]] if st.previous[op_id] >= 0 else [])
        return max(candidates, key=lambda d: st.finish[d]) if candidates else -1

    def _attribute(self, st: _ClassState, op_id: int, a: float, b: float, parts: dict) -> None:
        """Charge the wait [a, b] to the op that ended it, and the part before that op was
        even ready to the op that held it back, and so on down the chain."""
        while op_id >= 0 and b - a > 1e-12:
            op = st.ops[op_id]
            own = max(a, st.arrive[op_id])
            if own < b:
                if isinstance(op, RecvOp):
                    posted = st.send_posted.get(op_id, own)
                    waiting = min(max(posted - own, 0.0), b - own)
                    parts["bubble"] += waiting
                    parts["pp"] += b - own - waiting
                elif isinstance(op, (CollectiveOp, SendOp)):
                    parts[_AXIS_OF_GROUP.get(op.group, "dp")] += b - own
                else:
                    parts["other"] += b - own
            b = min(b, st.arrive[op_id])
            op_id = self._blocker(st, op_id)
        if b - a > 1e-12:
            parts["other"] += b - a

    def _breakdown(self, st: _ClassState) -> tuple[Breakdown, float]:
        parts = {a: 0.0 for a in AXES} | {"bubble": 0.0, "other": 0.0}
        compute = optimizer = 0.0
        prev_end = 0.0
        for rec in (r for r in st.records if r.stream == Stream.COMPUTE.value):
            if rec.start - prev_end > 1e-12:
                self._attribute(st, self._blocker(st, rec.op_id), prev_end, rec.start, parts)
            busy = rec.end - rec.start
            if rec.category == Phase.OPTIMIZER.value:
                optimizer += busy
            else:
                compute += busy
            prev_end = rec.end
        finish = max(st.finish) if st.finish else 0.0
        if finish - prev_end > 1e-12:
            last = max(range(len(st.ops)), key=lambda i: st.finish[i])
            self._attribute(st, last, prev_end, finish, parts)
        exposed = {a: parts[a] for a in AXES}
        return Breakdown(compute, exposed, parts["bubble"], optimizer, parts["other"]), finish

    def _result(self, wall: float) -> StepResult:
        summaries = []
        for st in self.states:
            bd, finish = self._breakdown(st)
            prog = self.trace.programs[st.cls.program]
            summaries.append(ClassSummary(st.cls.index, prog.name, st.cls.multiplicity,
                                          st.cls.representative, finish, bd))
        critical = max(summaries, key=lambda s: (s.finish_s, -s.index))
        step = critical.finish_s
        world = self.trace.world_size
        peak_flops = self.cluster.device.flops(Dtype(self.trace.meta.get("peak_dtype", "bf16")))
        tflops = self.trace.model_flops / step / world if step > 0 else 0.0
        peak_mem = max(p.peak_memory_bytes for p in self.trace.programs)
        records = tuple(r for st in self.states for r in st.records) if self.options.record else ()
        return StepResult(
            step_time_s=step,
            tokens_per_s=self.trace.tokens / step if step > 0 else 0.0,
            tflops_per_gpu=tflops / 1e12,
            mfu=tflops / peak_flops,
            peak_memory_gb=peak_mem / 1e9,
            fits_in_memory=peak_mem <= self.cluster.device.memory_bytes,
            breakdown=critical.breakdown,
            critical_class=critical.index,
            classes=tuple(summaries),
            events=next(self.env._eid),  # SimPy's event counter: events scheduled so far
            wall_time_s=wall,
            records=records,
        )


def _overlap_penalty(slowdown: float, compute_s: float, window_s: float) -> float:
    """Extra time of ``compute_s`` of compute that runs ``1 + slowdown`` times slower while a
    transfer moves data for the next ``window_s``: the overlap stretches, the rest does not."""
    if window_s <= 0:
        return 0.0
    return slowdown * min(compute_s, window_s / (1.0 + slowdown))


def simulate(trace: Trace, cluster: ClusterSpec, options: SimulationOptions = SimulationOptions(),
             faults: Faults = Faults()) -> StepResult:
    """Replay ``trace`` on ``cluster`` and return the step's timing and breakdown."""
    return StepSimulation(trace, cluster, options, faults).run()

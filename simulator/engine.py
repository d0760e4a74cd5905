"""The SimPy engine: replay a Trace on a cluster, rank class by rank class, stream by stream.

- Ops of a stream run in order; an op also waits for its ``deps`` (CUDA-stream semantics). The
  pp stream is the exception: each send/recv is posted as soon as its deps are done, like
  NCCL's non-blocking isend/irecv, so neighbouring stages never deadlock.
- A collective waits until every rank class of its group has reached it (rendezvous), then
  takes the network model's time; a send and its matching recv start together.
- Without interference, an op that shares nothing (compute, copies, a collective inside one
  class that crosses no network link) is folded into its stream: its end is known as soon as
  its deps' ends are, so it costs no SimPy event; only the ops that meet other classes or
  share links run in the environment. So do a collective whose kernels hold SMs (DeepEP's
  dispatch and combine) and the compute ops it may overlap, which it slows
  (``held_overlap.py``); the rest of such a trace folds. With interference, every op runs
  there, one process per (rank class, stream), since compute and transfers then change each
  other's times.
- Exposed communication is time the compute stream waits on a communication op; waiting for a
  recv whose sender had not yet posted it is pipeline bubble.
- Same-time events are ordered by SimPy's (time, priority, insertion) key and processes are
  created in a fixed order, so a run is deterministic.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator, Sequence

import simpy
from simpy.core import EmptySchedule

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.classes import rank_classes
from clustersim.simulator.cost.collectives import COPY_KERNEL_S, Plan
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.grouped import GroupedNetwork
from clustersim.simulator.cost.host import issue_time
from clustersim.simulator.cost.interfaces import ComputeCost, MemoryCost, NetworkCost
from clustersim.simulator.cost.measured import MeasuredNetwork
from clustersim.simulator.cost.memory import MemoryModel
from clustersim.simulator.cost.network import NetworkModel
from clustersim.simulator.class_state import ClassState, Rendezvous, StreamRun
from clustersim.simulator.device_groups import DeviceGroups
from clustersim.simulator.flows import FlowNetwork
from clustersim.simulator.held_overlap import folding_pays, ops_beside_held
from clustersim.simulator.interference import Interference, sm_share_slowdown
from clustersim.simulator.lanes import LaneReplay, Unsupported, lane_classes
from clustersim.simulator.options import Faults, NetworkMode, SimulationOptions
from clustersim.simulator.records import Replay
from clustersim.simulator.result import StepResult
from clustersim.simulator.streams import stream_runs
from clustersim.simulator.summary import summarize
from clustersim.workloads.trace import (
    CollectiveOp, ComputeOp, CopyOp, HostOp, MemoryOp, Op, RecvOp, SendOp, Stream, Trace,
)

__all__ = ["Faults", "NetworkMode", "SimulationOptions", "StepSimulation", "cycle_collector_paused",
           "simulate"]


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a step replays. The replay allocates millions of
    small objects that reference counting frees; the collector, triggered by those
    allocations, would scan every live object (the trace's too) again and again: about 40% of
    a 16K-GPU replay. What cycles the replay leaves are collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class StepSimulation:
    """One replay of ``trace`` on ``cluster``: :meth:`replay` gives the records, :meth:`run`
    the step's result (breakdowns and metrics computed from those records)."""

    def __init__(self, trace: Trace, cluster: ClusterSpec,
                 options: SimulationOptions = SimulationOptions(), faults: Faults = Faults(),
                 compute: ComputeCost | None = None, network: NetworkCost | None = None,
                 memory: MemoryCost | None = None, *, env: simpy.Environment | None = None,
                 flows: FlowNetwork | None = None, devices: Sequence[int] | None = None,
                 lanes: bool = True, fold: bool | None = None):
        """``compute``, ``network`` and ``memory`` replace the default cost models (tests,
        calibration). ``env``, ``flows`` and ``devices`` let several jobs share one SimPy
        environment and one flow network (``simulator/shared_fabric.py``): ``devices[d]`` is
        the fabric's device that runs the job's device ``d`` (``cluster.device_of(rank)``).
        ``lanes=False`` expands into one class per rank, the slow reference that the lane
        engine is checked against; ``fold=False`` runs every op as SimPy events, the reference
        that the folded replay is checked against (it always does with interference);
        ``fold=True`` folds even a trace whose collectives hold SMs beside most of its compute,
        which by default runs as events, the faster there (``folding_pays``)."""
        self.trace, self.cluster, self.options, self.faults = trace, cluster, options, faults
        self.computes = tuple(compute or ComputeModel(g.device) for g in cluster.device_groups)
        """One compute model per device group (one on a homogeneous cluster)."""
        self.issue_s = tuple(g.node.eager_issue_s for g in cluster.device_groups)
        """Each device group's host time to issue one kernel eagerly."""
        self.compute = self.computes[0]

        def network_of(view: ClusterSpec) -> NetworkCost:
            model = MeasuredNetwork if view.node.measured_comm else NetworkModel
            return model(view, options.algorithms)

        self.network = network or (GroupedNetwork(cluster, network_of) if cluster.groups
                                   else network_of(cluster))
        self.memory = memory or MemoryModel(cluster)
        self.interference = Interference.of(cluster.device,
                                            comm=options.comm_slowdown_when_overlapped,
                                            compute=options.compute_slowdown_when_overlapped)
        self.held = _held_slowdowns(trace, cluster.device.compute_units)
        """SM-share slowdown by the SMs a collective's kernels hold (``interference.py``)."""
        self.beside = ({p: ops_beside_held(program.ops)
                        for p, program in enumerate(trace.programs)} if self.held else {})
        """Program -> its ops that run as events in a folded replay though they share nothing
        (collectives holding SMs and the compute they may overlap)."""
        self.fold = (fold is not False and not self.interference.any
                     and (fold or folding_pays(trace, self.beside)))
        self.env = env if env is not None else simpy.Environment()
        self.flows = ((flows if flows is not None
                       else FlowNetwork(self.env, self.network.topology.capacity))
                      if options.network is NetworkMode.FLOW else None)
        self.device_of = (cluster.device_of if devices is None
                          else lambda rank: devices[cluster.device_of(rank)])
        self.rendezvous: dict[tuple, Rendezvous] = {}
        self._instance_cache: dict[tuple, Plan] = {}
        self._plans: dict[tuple, tuple[Plan, float] | None] = {}
        """A collective's (plan, copy time) by what decides it: the network model's own cache
        hashes the device groups, thousands of ints, on every lookup."""
        self._times: dict[int, tuple[Plan, float]] = {}
        self._factors: dict[object, tuple[float, float]] = {}
        """Classes of a transfer -> their link factors (fixed for a replay)."""
        """id(plan) -> (plan, its uncontended time): a plan's time walks its link loads."""
        self.lanes: LaneReplay | None = None
        if (options.expand and lanes and not options.one_class_per_rank(cluster.device)
                and not self.held):
            self.classes, self.class_of = lane_classes(trace, self._conditions())
            try:
                self.lanes = LaneReplay(
                    trace, self.classes, self.class_of, computes=self.computes,
                    issue_s=self.issue_s,
                    device_group=cluster.group_of_rank, network=self.network,
                    memory=self.memory, env=self.env, flows=self.flows, faults=faults,
                    device_of=self.device_of, record=options.record)
            except Unsupported:  # ranks of a class meet different classes: one class per rank
                self.lanes = None
        if self.lanes is None:
            self._class_states(expand=options.expand)
            self.device_groups = DeviceGroups(trace, self.classes, self.class_of, self.device_of)

    def _conditions(self) -> dict[int, tuple]:
        """rank -> what sets it apart: its faults and, on a mixed cluster, its device group (its
        ranks compute at their own device's rates, so they form classes of their own)."""
        faults, cluster = self.faults, self.cluster
        group = cluster.group_of_rank if cluster.groups else (lambda rank: 0)
        ranks = range(self.trace.world_size) if cluster.groups else sorted(faults.ranks())
        return {r: (group(r),) + faults.condition(r) for r in ranks}

    def _class_states(self, expand: bool) -> None:
        """One state per rank class (per rank when ``expand``)."""
        faults, cluster = self.faults, self.cluster
        group = cluster.group_of_rank if cluster.groups else (lambda rank: 0)
        self.classes, self.class_of = rank_classes(self.trace, self._conditions(), expand=expand)
        self.states = [
            ClassState(c, self.trace.programs[c.program].ops, faults.condition(c.representative),
                       self.interference, self.computes[group(c.representative)],
                       self.issue_s[group(c.representative)])
            for c in self.classes]

    # --- structure ----------------------------------------------------------------------
    def _signature(self, st: ClassState, group_set: str) -> tuple[int, ...]:
        sig = st.signature.get(group_set)
        if sig is None:
            group = self.trace.group_of(group_set, st.cls.representative)
            sig = st.signature[group_set] = tuple(int(self.class_of[r]) for r in group)
            st.group_classes[group_set] = frozenset(sig)
            st.instances[group_set] = self.device_groups.instances(group_set, frozenset(sig))
        return sig

    def _plan_time(self, plan: Plan) -> float:
        hit = self._times.get(id(plan))
        if hit is None or hit[0] is not plan:
            hit = self._times[id(plan)] = (plan, plan.time(self.network.topology))
        return hit[1]

    def _link_factors(self, classes) -> tuple[float, float]:
        """(network, scale-up) stretch of a transfer among ``classes``: its slowest member's."""
        hit = self._factors.get(classes)
        if hit is None:
            states = [self.states[c] for c in classes]
            hit = self._factors[classes] = (max(max(s.link_slow, s.nic_slow) for s in states),
                                            max(max(s.link_slow, s.nvlink_slow) for s in states))
        return hit

    # --- folded replay (no interference) --------------------------------------------------
    # An op whose duration nothing else can change (compute, copies, a collective inside one
    # rank class that moves no bytes over the network) ends at its ready time plus that
    # duration: it is resolved in plain Python, as soon as its deps' ends are known, without
    # SimPy events. Only ops that meet other classes or share network links (collectives
    # across classes, send/recv, transfers under the flow model) run in the environment, each
    # in a process that starts at its ready time. Every time is the same float sum the
    # event-per-op replay makes (ready + duration), so the results are the same, bit for bit.

    def _start_folded(self) -> None:
        now = self.env.now
        for st in self.states:
            st.evented = self.beside.get(st.cls.program, frozenset())
        self._left = sum(len(st.ops) for st in self.states)
        self._resolved = self.env.event()
        for st in self.states:
            runs = [StreamRun(ops, now + st.stall_s if st.stall_s and ops[0].stream is Stream.COMPUTE
                         else now)
                    for ops in stream_runs(st.ops, st.previous)]
            runs.reverse()  # taken from the end: the first stream first
            self._advance(st, runs)
        self.processes = [self.env.process(self._step_end())]

    def _advance(self, st: ClassState, work: list[StreamRun],
                 keep: StreamRun | None = None) -> tuple[Op, float] | None:
        """Resolve every op of ``work``'s streams whose deps' ends are known, until each stream
        waits on an unknown end or on an op that runs in the environment: a process each, but
        ``keep``'s, which is returned (with its ready time) for the caller's process to run."""
        finish, arrive, blocked, fixed_s = st.finish, st.arrive, st.blocked, self._fixed_s
        resolved, kept = 0, None
        while work:
            run = work.pop()
            ops, i, end = run.ops, run.next, run.end
            while i < len(ops):
                op = ops[i]
                ready = end
                waiting = -1
                for d in op.deps:
                    f = finish[d]
                    if f != f:  # NaN: not known yet
                        waiting = d
                        break
                    if f > ready:
                        ready = f
                if waiting >= 0:
                    blocked.setdefault(waiting, []).append(run)
                    break
                op_id = op.id
                arrive[op_id] = ready
                duration = fixed_s(st, op)
                if duration is None:
                    if run is keep:
                        kept = op, ready
                    else:
                        self.env.process(self._shared(st, run, op, ready))
                    break
                finish[op_id] = end = ready + duration
                i += 1
                resolved += 1
                if blocked:
                    woken = blocked.pop(op_id, None)
                    if woken is not None:
                        work += woken
            run.next, run.end = i, end
        self._left -= resolved
        if not self._left and not self._resolved.triggered:
            self._resolved.succeed()
        return kept

    def _fixed_s(self, st: ClassState, op: Op) -> float | None:
        """The duration of an op that shares nothing; None for one that must run in the
        environment (also a collective holding SMs and the compute it may overlap)."""
        if op.id in st.evented:
            return None
        if isinstance(op, CollectiveOp):
            key = (op.group, op.kind, op.bytes, op.routing, op.per_rank_copies)
            try:
                return st.fixed[key]
            except KeyError:
                duration = st.fixed[key] = self._collective_fixed_s(st, op)
                return duration
        if isinstance(op, ComputeOp):
            return self._busy(st, op)
        if isinstance(op, CopyOp):
            return self.memory.copy_time(op.kind, op.bytes)
        if isinstance(op, HostOp):
            return issue_time(op.launches, st.issue_s, st.launch_s)
        if isinstance(op, MemoryOp):
            return 0.0
        return None

    def _collective_fixed_s(self, st: ClassState, op: CollectiveOp) -> float | None:
        """A collective's duration when its group is all in this class and it crosses no
        network link under the flow model (the same for every op of the same group, kind and
        size, so the class keeps it)."""
        self._signature(st, op.group)
        needed = st.group_classes[op.group]
        if len(needed) != 1:
            return None
        hit = self._collective_plan(op, needed)
        if hit is None:
            return 0.0
        plan = self._stretched(hit[0], needed)
        if self.flows is not None and plan.loads:
            return None
        return self._plan_time(plan) + hit[1]

    def _shared(self, st: ClassState, run: StreamRun, op: Op, ready: float):
        """Run ``op`` in the environment from ``ready``, resolve what waited for it, and go on
        with its stream's next op while that one runs in the environment too."""
        env = self.env
        while True:
            if ready > env.now:
                yield env.timeout(self._delay_to(ready))
            if isinstance(op, CollectiveOp):
                yield from self._collective(st, op)
            elif isinstance(op, ComputeOp):
                yield from self._compute(st, op)
            else:
                yield from self._p2p(st, op)
            st.finish[op.id] = run.end = env.now
            run.next += 1
            self._left -= 1
            work = st.blocked.pop(op.id, [])
            work.append(run)
            following = self._advance(st, work, keep=run)
            if following is None:
                return
            op, ready = following

    def _delay_to(self, t: float) -> float:
        """The delay whose timeout fires at exactly ``t`` (``now + (t - now)`` may round)."""
        now = self.env.now
        delay = t - now
        while now + delay < t:
            delay = math.nextafter(delay, math.inf)
        while now + delay > t:
            delay = math.nextafter(delay, -math.inf)
        return delay

    def _step_end(self):
        """Ends when the step's last op does (a shared fabric waits on it)."""
        yield self._resolved
        last = max((max(st.finish, default=0.0) for st in self.states), default=0.0)
        if last > self.env.now:
            yield self.env.timeout(self._delay_to(last))

    # --- replay with an event per op (interference: compute and transfers interact) --------
    def _wait(self, st: ClassState, op_id: int) -> simpy.Event:
        ev = st.waiters.get(op_id)
        if ev is None:
            ev = st.waiters[op_id] = self.env.event()
        return ev

    def _done(self, st: ClassState, op: Op) -> None:
        st.finish[op.id] = self.env.now
        ev = st.waiters.pop(op.id, None)
        if ev is not None:
            ev.succeed()

    def _stream(self, st: ClassState, ops: list[Op]):
        env = self.env
        if st.stall_s and ops[0].stream is Stream.COMPUTE:
            yield env.timeout(st.stall_s)    # the step's input is late
        finish = st.finish
        for op in ops:
            for d in op.deps:
                if finish[d] != finish[d]:  # NaN: not finished yet
                    yield self._wait(st, d)
            st.arrive[op.id] = env.now
            if isinstance(op, ComputeOp):
                yield from self._compute(st, op)
            elif isinstance(op, CollectiveOp):
                yield from self._collective(st, op)
            elif isinstance(op, (SendOp, RecvOp)):
                yield from self._p2p(st, op)
            elif isinstance(op, CopyOp):
                yield env.timeout(self.memory.copy_time(op.kind, op.bytes))
            elif isinstance(op, HostOp):
                yield env.timeout(issue_time(op.launches, st.issue_s, st.launch_s))
            self._done(st, op)

    def _busy(self, st: ClassState, op: ComputeOp) -> float:
        """A compute op's time alone: its straggler factor, and no less than its kernels'
        launches on a slow host."""
        busy = st.compute.op_time(op) * st.compute_slow
        if st.launch_s:
            busy = max(busy, len(op.kernels) * st.launch_s)
        return busy

    def _compute(self, st: ClassState, op: ComputeOp):
        env = self.env
        activity = st.activity
        yield env.timeout(activity.start_compute(env.now, self._busy(st, op)))
        while activity.debt > 0:  # transfers that started while it ran
            yield env.timeout(activity.take_debt())

    # --- what runs in the environment --------------------------------------------------------
    def _stretched(self, plan: Plan, classes) -> Plan:
        """``plan`` with its bandwidth terms stretched by its members' degraded links and, when
        it starts while their compute streams are busy, by interference."""
        net, intra = self._link_factors(classes)
        slowdown = self.interference.comm_slowdown
        if slowdown:
            now = self.env.now
            if any(self.states[c].activity.computing(now) for c in classes):
                net *= 1.0 + slowdown
                intra *= 1.0 + slowdown
        return plan if net == 1.0 and intra == 1.0 else plan.scaled(net, intra)

    def _transfer(self, plan: Plan, classes, extra_s: float = 0.0, held: float = 0.0):
        """Run a plan for ``classes``: latency plus the longer of its NVLink part and its
        network part, the network part shared with other traffic under the flow model. While
        it runs, those classes count it as a transfer in flight, whose kernels slow their
        compute by ``held`` (the SMs they hold)."""
        env = self.env
        interference = self.interference.any or bool(self.held)
        if interference:
            # Let compute ops that start at this instant start first: they overlap it.
            yield env.timeout(0)
        plan = self._stretched(plan, classes)
        if interference:
            expected = (self._plan_time(plan) + extra_s
                        if self.interference.compute_slowdown or held else 0.0)
            for c in classes:
                self.states[c].activity.start_transfer(env.now, expected, held)
        if self.flows is None or not plan.loads:
            yield env.timeout(self._plan_time(plan) + extra_s)
        else:
            start = env.now
            yield self.flows.transfer(plan.loads)
            elapsed = env.now - start
            yield env.timeout(plan.latency_s + max(plan.intra_s, elapsed) - elapsed + extra_s)
        if interference:
            for c in classes:
                self.states[c].activity.end_transfer(held)

    def _collective_plan(self, op: CollectiveOp, classes) -> tuple[Plan, float] | None:
        """The plan of ``op`` run by ``classes`` and its per-rank copy time; None when there
        is nothing to move (one rank, no bytes)."""
        key = (op.group, classes, op.kind, op.bytes, op.routing, op.per_rank_copies)
        try:
            return self._plans[key]
        except KeyError:
            pass
        instances = self.device_groups.instances(op.group, classes)
        hit = None
        if len(instances[0]) > 1 and op.bytes > 0:
            plan = self.network.plan(op.kind, op.bytes, instances, op.routing)
            hit = (plan, len(instances[0]) * COPY_KERNEL_S if op.per_rank_copies else 0.0)
        self._plans[key] = hit
        return hit

    def _run_collective(self, op: CollectiveOp, classes):
        hit = self._collective_plan(op, classes)
        if hit is not None:
            held = self.held.get(op.routing.sms, 0.0) if op.routing is not None else 0.0
            yield from self._transfer(hit[0], classes, hit[1], held)

    def _collective(self, st: ClassState, op: CollectiveOp):
        sig = self._signature(st, op.group)
        needed = st.group_classes[op.group]
        if len(needed) == 1:
            # Every member of the group is in this class: nobody to wait for.
            yield from self._run_collective(op, needed)
            return
        seq = st.seq.get(op.group, 0)
        st.seq[op.group] = seq + 1
        key = (op.group, sig, seq)
        rv = self.rendezvous.get(key)
        if rv is None:
            rv = self.rendezvous[key] = Rendezvous(self.env, needed)
        rv.arrived.add(st.cls.index)
        if rv.arrived == rv.needed:
            del self.rendezvous[key]
            yield from self._run_collective(op, needed)
            rv.event.succeed()
        else:
            yield rv.event

    def _p2p(self, st: ClassState, op: SendOp | RecvOp):
        env = self.env
        group = self.trace.group_of(op.group, st.cls.representative)
        peer_rank = group[op.peer]
        peer = int(self.class_of[peer_rank])
        me = st.cls.index
        src, dst = (me, peer) if isinstance(op, SendOp) else (peer, me)
        key = ("p2p", src, dst, op.tag)
        rv = self.rendezvous.get(key)
        if rv is None:
            rv = self.rendezvous[key] = Rendezvous(env, frozenset((0, 1)))
        side = 0 if isinstance(op, SendOp) else 1
        rv.arrived.add(side)
        rv.posted[side] = env.now
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

    def _p2p_plan(self, op: SendOp | RecvOp, st: ClassState, src: int, dst: int) -> Plan:
        """All sends of the sending class to the receiving class, as one plan (they happen
        together: every DP and TP replica of a stage sends its activation at once)."""
        sending = isinstance(op, SendOp)
        key = ("p2p", op.group, op.bytes, src, dst, sending, op.peer)
        hit = self._instance_cache.get(key)
        if hit is None:
            pairs = self.device_groups.pairs(op.group, op.peer, src, dst, sending)
            hit = self._instance_cache[key] = self.network.p2p_plan(op.bytes, pairs)
        return hit

    # --- running ----------------------------------------------------------------------------
    def _start_processes(self) -> None:
        self.processes = [self.env.process(self._stream(st, ops))
                          for st in self.states for ops in stream_runs(st.ops, st.previous)]
        """The step's processes: all of them done is the step's end (a shared fabric waits
        on that to start the job's next step)."""

    def _run_to_end(self) -> int:
        """Process every event; return how many there were (SimPy's public stepping API)."""
        step, events = self.env.step, 0
        try:
            while True:
                step()
                events += 1
        except EmptySchedule:
            return events

    def replay(self) -> Replay:
        """Replay the step: one timeline of records per rank class."""
        wall = time.perf_counter()
        with cycle_collector_paused():
            self.start()
            events = self._run_to_end()
        return self.finished(events, time.perf_counter() - wall)

    def start(self) -> None:
        """Create the step's processes in the environment (a shared one runs them later)."""
        if self.lanes is not None:
            self.lanes.start()
        elif self.fold:
            self._start_folded()
        else:
            self._start_processes()

    def finished(self, events: int, wall_time_s: float) -> Replay:
        """The records once the environment has run out of events; a deadlock is an error."""
        if self.lanes is not None:
            return self.lanes.finished(events, wall_time_s)
        stuck = [st for st in self.states if any(f != f for f in st.finish)]
        if stuck:
            st = stuck[0]
            op = st.ops[next(i for i, f in enumerate(st.finish) if f != f)]
            raise RuntimeError(f"deadlock: rank class {st.cls.index} never finished op {op.id} "
                               f"({op.name}); the trace's collectives or send/recv do not match")
        every = self.options.record
        return Replay(timelines=tuple(st.timeline(every) for st in self.states),
                      class_of=self.class_of, events=events, wall_time_s=wall_time_s)

    def run(self) -> StepResult:
        """Replay the step and summarise it: breakdowns, critical class, metrics."""
        with cycle_collector_paused():
            return self.summary(self.replay())

    def summary(self, replay: Replay) -> StepResult:
        """A replay's breakdowns, critical class and metrics."""
        return summarize(replay, self.trace, self.cluster, self._program_capacities(),
                         keep_records=self.options.record)

    def _program_capacities(self) -> tuple[float, ...]:
        """Device memory each program may use: the smallest device among its ranks."""
        c = self.cluster
        if not c.groups:
            return (self.memory.capacity_bytes,) * len(self.trace.programs)
        sizes = [g.device.memory_bytes for g in c.groups]
        return tuple(min(sizes[c.group_of_rank(r)] for r in p.ranks) for p in self.trace.programs)


def _held_slowdowns(trace: Trace, device_sms: int) -> dict[int, float]:
    """The SM-share slowdown of each SM count a collective of ``trace`` holds (none: {})."""
    held = {op.routing.sms for p in trace.programs for op in p.ops
            if isinstance(op, CollectiveOp) and op.routing is not None and op.routing.sms}
    return {sms: sm_share_slowdown(sms, device_sms) for sms in sorted(held)}


def simulate(trace: Trace, cluster: ClusterSpec, options: SimulationOptions = SimulationOptions(),
             faults: Faults = Faults()) -> StepResult:
    """Replay ``trace`` on ``cluster`` and return the step's timing and breakdown."""
    with cycle_collector_paused():
        # The simulation dies here, its plans, link sets and per-op times with it, before the
        # collector is back on: back on while they lived, its first pass would scan them all
        # (0.1-0.2 s after a 16,384-GPU step, as much as a third of the step's cost).
        return StepSimulation(trace, cluster, options, faults).run()

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

import contextlib
import enum
import gc
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import simpy
from simpy.core import EmptySchedule

from clustersim.hardware_specs import ClusterSpec, DeviceSpec
from clustersim.simulator.classes import RankClass, rank_classes
from clustersim.simulator.cost.collectives import COPY_KERNEL_S, Algorithm, Plan
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.grouped import GroupedNetwork
from clustersim.simulator.cost.interfaces import ComputeCost, Instances, MemoryCost, NetworkCost
from clustersim.simulator.cost.measured import MeasuredNetwork
from clustersim.simulator.cost.memory import MemoryModel
from clustersim.simulator.cost.network import NetworkModel
from clustersim.simulator.flows import FlowNetwork
from clustersim.simulator.interference import DeviceActivity, Interference
from clustersim.simulator.lanes import LaneReplay, Unsupported, lane_classes
from clustersim.simulator.records import ClassTimeline, OpRecord, Replay
from clustersim.simulator.result import StepResult, charged_axis
from clustersim.simulator.streams import stream_runs
from clustersim.simulator.summary import summarize
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyOp, MemoryOp, Op, RecvOp, SendOp, Stream, Trace,
)


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
    """Follow every rank's own clock, so stragglers and degraded links can differ rank by rank
    (``lanes.py``; one class per rank when compute/communication interference is on)."""
    record: bool = True
    """Keep per-op records (for the Chrome trace and breakdowns of every class)."""
    network: NetworkMode = NetworkMode.FLOW
    algorithms: Mapping[CollectiveKind, Algorithm] = field(default_factory=dict)
    """Forced collective algorithm per kind (default: NCCL-style automatic choice)."""

    def one_class_per_rank(self, device: DeviceSpec) -> bool:
        """Whether an expanded run simulates each rank as a class of its own: when compute and
        transfers slow each other down (a per-device state the lanes do not follow). Otherwise
        it follows every rank's clock for about the events of the collapsed run."""
        return self.expand and Interference.of(
            device, comm=self.comm_slowdown_when_overlapped,
            compute=self.compute_slowdown_when_overlapped).any


@dataclass(frozen=True, slots=True)
class Faults:
    """In-step conditions of single ranks: a slow GPU, a degraded link, a slow host."""

    compute_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 (a straggler GPU: thermal throttling, a bad HBM stack)."""
    link_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the time of every communication it takes part in (degraded NIC
    or cable)."""
    nic_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the scale-out (network) part of its transfers only: its NIC or
    cable runs at a fraction of its bandwidth."""
    nvlink_slowdown: Mapping[int, float] = field(default_factory=dict)
    """rank -> factor > 1 on the scale-up (NVLink) part of its transfers only."""
    launch_overhead_s: Mapping[int, float] = field(default_factory=dict)
    """rank -> host seconds per kernel launch (a slow or contended CPU): a compute op takes at
    least its kernel count times this, since the GPU cannot run kernels faster than the host
    launches them."""
    input_stall_s: Mapping[int, float] = field(default_factory=dict)
    """rank -> seconds its step's input arrives late (a slow data loader): its compute stream
    starts that much after the others."""

    def condition(self, rank: int) -> tuple[float, float, float, float, float, float]:
        return (self.compute_slowdown.get(rank, 1.0), self.link_slowdown.get(rank, 1.0),
                self.nic_slowdown.get(rank, 1.0), self.nvlink_slowdown.get(rank, 1.0),
                self.launch_overhead_s.get(rank, 0.0), self.input_stall_s.get(rank, 0.0))

    def ranks(self) -> set[int]:
        return (set(self.compute_slowdown) | set(self.link_slowdown) | set(self.nic_slowdown)
                | set(self.nvlink_slowdown) | set(self.launch_overhead_s)
                | set(self.input_stall_s))


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


class _Rendezvous:
    __slots__ = ("needed", "arrived", "event", "posted")

    def __init__(self, env: simpy.Environment, needed: frozenset[int]):
        self.needed = needed
        self.arrived: set[int] = set()
        self.event = env.event()
        self.posted: dict[int, float] = {}


class _ClassState:
    """Run-time state of one rank class."""

    __slots__ = ("cls", "compute", "ops", "finish", "arrive", "previous", "waiters", "records", "activity",
                 "seq", "signature", "instances",
                 "compute_slow", "link_slow", "nic_slow", "nvlink_slow", "launch_s", "stall_s",
                 "send_posted", "group_classes")

    def __init__(self, cls: RankClass, ops: tuple[Op, ...], condition: tuple[float, ...],
                 interference: Interference, compute: ComputeCost):
        self.cls = cls
        self.compute = compute
        """The compute model of this class's device."""
        self.ops = ops
        self.finish: list[float] = [math.nan] * len(ops)
        self.arrive: list[float] = [0.0] * len(ops)
        """When each op was ready to start (its deps and its stream predecessor done)."""
        self.previous: list[int] = [-1] * len(ops)
        """The op before it on its stream (-1: first, or on the unordered pp stream)."""
        self.waiters: dict[int, simpy.Event] = {}
        self.records: list[OpRecord] = []
        self.activity = DeviceActivity(interference)
        self.seq: dict[str, int] = {}
        self.signature: dict[str, tuple[int, ...]] = {}
        self.group_classes: dict[str, frozenset[int]] = {}
        self.instances: dict[str, Instances] = {}
        (self.compute_slow, self.link_slow, self.nic_slow, self.nvlink_slow, self.launch_s,
         self.stall_s) = condition
        self.send_posted: dict[int, float] = {}
        """recv op id -> when the matching send was posted (before that it is bubble)."""

    def timeline(self) -> ClassTimeline:
        return ClassTimeline(rank_class=self.cls, ready_s=tuple(self.arrive),
                             end_s=tuple(self.finish), stream_predecessor=tuple(self.previous),
                             send_posted_s=self.send_posted, records=tuple(self.records))


class StepSimulation:
    """One replay of ``trace`` on ``cluster``: :meth:`replay` gives the records, :meth:`run`
    the step's result (breakdowns and metrics computed from those records)."""

    def __init__(self, trace: Trace, cluster: ClusterSpec,
                 options: SimulationOptions = SimulationOptions(), faults: Faults = Faults(),
                 compute: ComputeCost | None = None, network: NetworkCost | None = None,
                 memory: MemoryCost | None = None, *, env: simpy.Environment | None = None,
                 flows: FlowNetwork | None = None, devices: Sequence[int] | None = None,
                 lanes: bool = True):
        """``compute``, ``network`` and ``memory`` replace the default cost models (tests,
        calibration). ``env``, ``flows`` and ``devices`` let several jobs share one SimPy
        environment and one flow network (``simulator/shared_fabric.py``): ``devices[d]`` is
        the fabric's device that runs the job's device ``d`` (``cluster.device_of(rank)``).
        ``lanes=False`` expands into one class per rank, the slow reference that the lane
        engine is checked against."""
        self.trace, self.cluster, self.options, self.faults = trace, cluster, options, faults
        self.computes = tuple(compute or ComputeModel(g.device) for g in cluster.device_groups)
        """One compute model per device group (one on a homogeneous cluster)."""
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
        self.env = env if env is not None else simpy.Environment()
        self.flows = ((flows if flows is not None
                       else FlowNetwork(self.env, self.network.topology.capacity))
                      if options.network is NetworkMode.FLOW else None)
        self.device_of = (cluster.device_of if devices is None
                          else lambda rank: devices[cluster.device_of(rank)])
        self.rendezvous: dict[tuple, _Rendezvous] = {}
        self._instance_cache: dict[tuple, Instances] = {}
        self._plans: dict[tuple, tuple[Plan, float] | None] = {}
        """A collective's (plan, copy time) by what decides it: the network model's own cache
        hashes the device groups, thousands of ints, on every lookup."""
        self._times: dict[int, tuple[Plan, float]] = {}
        self._factors: dict[object, tuple[float, float]] = {}
        """Classes of a transfer -> their link factors (fixed for a replay)."""
        """id(plan) -> (plan, its uncontended time): a plan's time walks its link loads."""
        self.lanes: LaneReplay | None = None
        if options.expand and lanes and not options.one_class_per_rank(cluster.device):
            self.classes, self.class_of = lane_classes(trace, self._conditions())
            try:
                self.lanes = LaneReplay(
                    trace, self.classes, self.class_of, computes=self.computes,
                    device_group=cluster.group_of_rank, network=self.network,
                    memory=self.memory, env=self.env, flows=self.flows, faults=faults,
                    device_of=self.device_of, record=options.record)
            except Unsupported:  # ranks of a class meet different classes: one class per rank
                self.lanes = None
        if self.lanes is None:
            self._class_states(expand=options.expand)

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
            _ClassState(c, self.trace.programs[c.program].ops, faults.condition(c.representative),
                        self.interference, self.computes[group(c.representative)])
            for c in self.classes]

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
            device = self.device_of
            hit = self._instance_cache[key] = tuple(
                tuple(device(r) for r in gs.groups[i]) for i in sorted(seen))
        return hit

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
        if st.stall_s and ops[0].stream is Stream.COMPUTE:
            yield self.env.timeout(st.stall_s)    # the step's input is late
        for op in ops:
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
            yield self.env.timeout(self.memory.copy_time(op.kind, op.bytes))
            self._done(st, op, start, "other")
        elif isinstance(op, MemoryOp):
            self._done(st, op, self.env.now, "memory")

    def _compute(self, st: _ClassState, op: ComputeOp):
        env = self.env
        start = env.now
        activity = st.activity
        busy = st.compute.op_time(op) * st.compute_slow
        if st.launch_s:
            busy = max(busy, len(op.kernels) * st.launch_s)
        yield env.timeout(activity.start_compute(start, busy))
        while activity.debt > 0:  # transfers that started while it ran
            yield env.timeout(activity.take_debt())
        self._done(st, op, start, op.phase.value)

    def _stretch(self, classes) -> tuple[float, float]:
        """Bandwidth slowdown of a transfer, (network, scale-up): degraded links of its
        members, and interference when it starts while their compute streams are busy."""
        net, intra = self._link_factors(classes)
        slowdown = self.interference.comm_slowdown
        now = self.env.now
        if slowdown and any(self.states[c].activity.computing(now) for c in classes):
            net *= 1.0 + slowdown
            intra *= 1.0 + slowdown
        return net, intra

    def _transfer(self, plan: Plan, classes, extra_s: float = 0.0):
        """Run a plan for ``classes``: latency plus the longer of its NVLink part and its
        network part, the network part shared with other traffic under the flow model. While
        it runs, those classes count it as a transfer in flight."""
        env = self.env
        if self.interference.any:
            # Let compute ops that start at this instant start first: they overlap it.
            yield env.timeout(0)
        net, intra = self._stretch(classes)
        if net != 1.0 or intra != 1.0:
            plan = plan.scaled(net, intra)
        expected = (self._plan_time(plan) + extra_s
                    if self.interference.compute_slowdown else 0.0)
        for c in classes:
            self.states[c].activity.start_transfer(env.now, expected)
        if self.flows is None or not plan.loads:
            yield env.timeout(self._plan_time(plan) + extra_s)
        else:
            start = env.now
            yield self.flows.transfer(plan.loads)
            elapsed = env.now - start
            yield env.timeout(plan.latency_s + max(plan.intra_s, elapsed) - elapsed + extra_s)
        for c in classes:
            self.states[c].activity.end_transfer()

    def _collective_plan(self, op: CollectiveOp, classes) -> tuple[Plan, float] | None:
        """The plan of ``op`` run by ``classes`` and its per-rank copy time; None when there
        is nothing to move (one rank, no bytes)."""
        key = (op.group, classes, op.kind, op.bytes, op.routing, op.per_rank_copies)
        try:
            return self._plans[key]
        except KeyError:
            pass
        instances = self._instances(op.group, classes)
        hit = None
        if len(instances[0]) > 1 and op.bytes > 0:
            plan = self.network.plan(op.kind, op.bytes, instances, op.routing)
            hit = (plan, len(instances[0]) * COPY_KERNEL_S if op.per_rank_copies else 0.0)
        self._plans[key] = hit
        return hit

    def _run_collective(self, op: CollectiveOp, st: _ClassState, classes):
        hit = self._collective_plan(op, classes)
        if hit is not None:
            yield from self._transfer(hit[0], classes, hit[1])

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
        self._done(st, op, arrived, charged_axis(op))

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
        self._done(st, op, posted, charged_axis(op))

    def _p2p_plan(self, op: SendOp | RecvOp, st: _ClassState, src: int, dst: int) -> Plan:
        """All sends of the sending class to the receiving class, as one plan (they happen
        together: every DP and TP replica of a stage sends its activation at once)."""
        sending = isinstance(op, SendOp)
        key = ("p2p", op.group, op.bytes, src, dst, sending, op.peer)
        hit = self._instance_cache.get(key)
        if hit is None:
            gs = self.trace.group_sets[op.group]
            mine, other = (src, dst) if sending else (dst, src)
            device = self.device_of
            pairs = []
            for r in self.classes[mine].ranks:
                partner = gs.group_of(r)[op.peer]
                if self.class_of[partner] == other:
                    pairs.append((device(r), device(partner)) if sending
                                 else (device(partner), device(r)))
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
        return Replay(timelines=tuple(st.timeline() for st in self.states),
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


def simulate(trace: Trace, cluster: ClusterSpec, options: SimulationOptions = SimulationOptions(),
             faults: Faults = Faults()) -> StepResult:
    """Replay ``trace`` on ``cluster`` and return the step's timing and breakdown."""
    return StepSimulation(trace, cluster, options, faults).run()

"""The expanded replay that scales: every rank keeps its own clock, a class's ranks move together.

``simulation: {expand: true}`` asks for every rank on its own, so that stragglers and degraded
links can differ rank by rank. Simulating each rank as its own class costs an event per rank and
op; instead the ranks of one class (one program: a pipeline stage) run as *lanes* of one SimPy
process per stream, as the collapsed engine's classes do, and each op carries one time per lane:

- an op is ready on a lane when its deps and its stream predecessor are done on that lane;
- a compute op takes its time on that lane's device (mixed clusters) times its straggler factor,
  and no less than its kernels' launches on a slow host; late input delays the compute stream;
- a collective's group starts when its last member arrives (a gather and a max per group, over
  every class that meets in it) and takes the network model's time, its network and NVLink parts
  stretched by the slowest NIC and NVLink of the group; a send and its recv start when both have
  posted.

Times stay floats while every lane agrees (``lane_tables.settle``), so without faults the replay
is the collapsed one, event for event and bit for bit. With a few faulted ranks the classes are
the collapsed run's split (``lane_classes``), whose ranks never differ: the replay is the collapsed
split's. With many (every rank its own factor) the classes are the programs, and when lanes
differ, the process's clock follows its latest lane. Under the analytic network model every transfer's time depends only on
its own group, and the lane times are those of the per-rank replay. Under the flow model a class's
transfer shares the links once, at its latest lane, and every group of it is charged the same
contention delay on top of its own time alone: exact when the class's groups start together (no
faults, or faults that hold whole classes back), an approximation otherwise.

Memory: one time per (class, op) while lanes agree, one array of lanes where they differ; records
only for the slowest rank of each class (its timeline gives the class's breakdown).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import simpy

from clustersim.simulator.classes import RankClass, rank_classes
from clustersim.simulator.cost.collectives import COPY_KERNEL_S, Plan
from clustersim.simulator.cost.host import issue_time
from clustersim.simulator.cost.interfaces import ComputeCost, MemoryCost, NetworkCost
from clustersim.simulator.flows import FlowNetwork
from clustersim.simulator.lane_tables import (
    CollectiveTable, LaneMap, Lanes, PairTable, Unsupported, collective_table, latest, pair_table,
    settle,
)
from clustersim.simulator.op_records import op_records
from clustersim.simulator.records import ClassTimeline, Replay
from clustersim.simulator.streams import stream_runs
from clustersim.workloads.trace import (
    CollectiveOp, ComputeOp, CopyOp, HostOp, Op, RecvOp, SendOp, Stream, Trace,
)

if TYPE_CHECKING:
    from clustersim.simulator.options import Faults

__all__ = ["LaneReplay", "Unsupported", "lane_classes"]

SPLIT_PER_PROGRAM = 16
"""Fault-split classes per program up to which the lanes are those classes' ranks (exact: the
ranks of one keep one clock; the cost of the collapsed run with the same faults, up to this many
times the healthy run's events)."""


def lane_classes(trace: Trace, conditions: Mapping[int, object]
                 ) -> tuple[tuple[RankClass, ...], np.ndarray]:
    """The classes whose ranks run as lanes: the collapsed run's split by ``conditions`` while it
    stays within :data:`SPLIT_PER_PROGRAM` classes per program, else one class per program (many
    ranks each with faults of their own: as many events as the healthy run)."""
    split = rank_classes(trace, conditions)
    if len(split[0]) <= SPLIT_PER_PROGRAM * len(trace.programs):
        return split
    return rank_classes(trace)


class _Meeting:
    __slots__ = ("arrived", "event", "result")

    def __init__(self, env: simpy.Environment):
        self.arrived: dict[int, Lanes] = {}
        self.event = env.event()
        self.result: Lanes = 0.0


class _LaneClass:
    """Run-time state of one class: per op, its lanes' end times."""

    __slots__ = ("cls", "ops", "end", "done", "previous", "waiters", "seq", "slow", "launch_s",
                 "stall_s", "issue_s", "first_compute", "computes", "device_group", "send_posted")

    def __init__(self, cls: RankClass, ops: tuple[Op, ...], slow: Lanes, launch_s: Lanes,
                 stall_s: Lanes, issue_s: Lanes, computes: tuple[ComputeCost, ...],
                 device_group: Lanes):
        self.cls, self.ops, self.slow = cls, ops, slow
        self.launch_s, self.stall_s = launch_s, stall_s
        """Host seconds per kernel launch on a slow host; how late the step's input arrives."""
        self.issue_s = issue_s
        """Each lane's host time to issue one kernel eagerly (its node's)."""
        self.first_compute = -1
        """The first op of the compute stream (it waits for the input)."""
        self.computes, self.device_group = computes, device_group
        """Compute model per device group, and each lane's group (a float while they agree)."""
        self.end: list[Lanes] = [0.0] * len(ops)
        self.done = [False] * len(ops)
        self.previous = [-1] * len(ops)
        self.waiters: dict[int, simpy.Event] = {}
        self.seq: dict[str, int] = {}
        self.send_posted: dict[int, Lanes] = {}


class LaneReplay:
    """One expanded replay (see the module docstring); :meth:`replay` gives its records."""

    def __init__(self, trace: Trace, classes: tuple[RankClass, ...], class_of: np.ndarray, *,
                 computes: tuple[ComputeCost, ...], issue_s: tuple[float, ...],
                 device_group: Callable[[int], int],
                 network: NetworkCost, memory: MemoryCost, env: simpy.Environment,
                 flows: FlowNetwork | None, faults: Faults, device_of: Callable[[int], int],
                 record: bool):
        """``computes``: one compute model per device group, ``issue_s`` its host's time to
        issue one kernel eagerly, ``device_group``: a rank's group;
        ``flows`` None: the analytic network model. Raises :class:`Unsupported` at once for a
        trace whose ranks of one class meet different classes at one op."""
        self.trace, self.classes, self.class_of = trace, classes, class_of
        self.network, self.memory = network, memory
        self.device_of, self.record = device_of, record
        self.env, self.flows = env, flows
        world = trace.world_size
        lane_of = np.empty(world, dtype=np.int64)
        ranks = tuple(np.array(c.ranks, dtype=np.int64) for c in classes)
        for members in ranks:
            lane_of[members] = np.arange(len(members))
        link = _per_rank(faults.link_slowdown, world, 1.0)
        self.lanes = LaneMap(class_of, lane_of, ranks,
                             _slowest(link, _per_rank(faults.nic_slowdown, world, 1.0)),
                             _slowest(link, _per_rank(faults.nvlink_slowdown, world, 1.0)))
        straggle = _per_rank(faults.compute_slowdown, world, 1.0)
        launch = _per_rank(faults.launch_overhead_s, world, 0.0)
        stall = _per_rank(faults.input_stall_s, world, 0.0)
        groups = (np.array([device_group(r) for r in range(world)], dtype=np.float64)
                  if len(computes) > 1 else None)
        issue = None if groups is None else np.array(issue_s)[groups.astype(np.int64)]

        def lanes_of(per_rank: np.ndarray | None, members: np.ndarray, default: float) -> Lanes:
            return default if per_rank is None else settle(per_rank[members])

        self.states = [
            _LaneClass(c, trace.programs[c.program].ops, lanes_of(straggle, ranks[c.index], 1.0),
                       lanes_of(launch, ranks[c.index], 0.0), lanes_of(stall, ranks[c.index], 0.0),
                       lanes_of(issue, ranks[c.index], issue_s[0]), computes,
                       lanes_of(groups, ranks[c.index], 0.0))
            for c in classes]
        self.meetings: dict[tuple, _Meeting] = {}
        self._tables: dict[tuple, CollectiveTable | PairTable] = {}
        self._plans: dict[tuple, Plan] = {}
        self._plan_times: dict[int, tuple[Plan, float]] = {}
        for st in self.states:  # every table now, so that an unsupported trace fails first
            for op in st.ops:
                if isinstance(op, CollectiveOp):
                    self._collective_table(op.group, st.cls.index)
                elif isinstance(op, (SendOp, RecvOp)):
                    self._pair_table(op, st.cls.index)

    # --- tables ---------------------------------------------------------------------------
    def _collective_table(self, group_set: str, cls: int) -> CollectiveTable:
        key = (group_set, cls)
        hit = self._tables.get(key)
        if hit is None:
            hit = self._tables[key] = collective_table(self.trace.group_sets[group_set], cls,
                                                       self.lanes, self.device_of)
        return hit

    def _pair_table(self, op: SendOp | RecvOp, cls: int) -> PairTable:
        sending = isinstance(op, SendOp)
        key = ("p2p", op.group, op.peer, cls, sending)
        hit = self._tables.get(key)
        if hit is None:
            hit = self._tables[key] = pair_table(self.trace.group_sets[op.group], op.peer, cls,
                                                 sending, self.lanes)
        return hit

    # --- processes ------------------------------------------------------------------------
    def _stream(self, st: _LaneClass, ops: list[Op]):
        for op in ops:
            yield from self._run_op(st, op)

    def _run_op(self, st: _LaneClass, op: Op):
        done = st.done
        for d in op.deps:
            if not done[d]:
                ev = st.waiters.get(d)
                if ev is None:
                    ev = st.waiters[d] = self.env.event()
                yield ev
        ready = self._ready(st, op.id)
        if isinstance(op, ComputeOp):
            end = yield from self._run_for(ready, self._busy(st, op))
        elif isinstance(op, CollectiveOp):
            end = yield from self._collective(st, op, ready)
        elif isinstance(op, (SendOp, RecvOp)):
            end = yield from self._p2p(st, op, ready)
        elif isinstance(op, CopyOp):
            end = yield from self._run_for(ready, self.memory.copy_time(op.kind, op.bytes))
        elif isinstance(op, HostOp):
            end = yield from self._run_for(ready, self._issue_s(st, op))
        else:
            end = ready
        st.end[op.id] = end
        done[op.id] = True
        ev = st.waiters.pop(op.id, None)
        if ev is not None:
            ev.succeed()

    def _ready(self, st: _LaneClass, op_id: int) -> Lanes:
        before = [st.end[d] for d in st.ops[op_id].deps]
        if st.previous[op_id] >= 0:
            before.append(st.end[st.previous[op_id]])
        if op_id == st.first_compute and not (isinstance(st.stall_s, float) and not st.stall_s):
            before.append(st.stall_s)    # the step's input is late
        return latest(before)

    def _busy(self, st: _LaneClass, op: ComputeOp) -> Lanes:
        """Each lane's time for ``op``: its device's, times its straggler factor, and no less
        than its kernels' launches on a slow host."""
        group = st.device_group
        if isinstance(group, float):
            busy = st.computes[int(group)].op_time(op) * st.slow
        else:
            alone = np.array([c.op_time(op) for c in st.computes])
            busy = alone[group.astype(np.int64)] * st.slow
        launch = st.launch_s
        if isinstance(launch, float) and not launch:
            return busy
        floor = len(op.kernels) * launch
        if isinstance(busy, float) and isinstance(floor, float):
            return max(busy, floor)
        return settle(np.maximum(busy, floor))

    @staticmethod
    def _issue_s(st: _LaneClass, op: HostOp) -> Lanes:
        """Each lane's host time to issue ``op``'s kernels (a slow host's where longer)."""
        launch, issue = st.launch_s, st.issue_s
        if isinstance(launch, float) and isinstance(issue, float):
            return issue_time(op.launches, issue, launch)
        return settle(op.launches * np.maximum(issue, launch))

    def _run_for(self, ready: Lanes, duration: Lanes):
        """Lanes busy from ``ready`` for ``duration``; the process wakes at the latest end."""
        now = self.env.now
        end = ready + duration
        if isinstance(end, float):
            yield self.env.timeout(duration if ready == now else max(end - now, 0.0))
            return end
        end = settle(end)
        yield self.env.timeout(max(float(np.max(end)) - now, 0.0))
        return end

    def _collective(self, st: _LaneClass, op: CollectiveOp, ready: Lanes):
        me = st.cls.index
        table = self._collective_table(op.group, me)
        if len(table.classes) == 1:
            per_group = yield from self._meet(op, table, {me: ready})
            return table.spread(per_group, me)
        seq = st.seq.get(op.group, 0)
        st.seq[op.group] = seq + 1
        key = (op.group, table.classes, seq)
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings[key] = _Meeting(self.env)
        meeting.arrived[me] = ready
        if len(meeting.arrived) == len(table.classes):
            del self.meetings[key]
            meeting.result = yield from self._meet(op, table, meeting.arrived)
            meeting.event.succeed()
        else:
            yield meeting.event
        return table.spread(meeting.result, me)

    def _meet(self, op: CollectiveOp, table: CollectiveTable, arrived: Mapping[int, Lanes]):
        """Per group: when the collective ends."""
        start = table.start(arrived)
        if len(table.instances[0]) <= 1 or op.bytes <= 0:
            return start
        key = (table, op.kind, op.bytes, op.routing)  # the table by identity: no rehashing
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.network.plan(op.kind, op.bytes, table.instances,
                                                        op.routing)
        copies = len(table.instances[0]) * COPY_KERNEL_S if op.per_rank_copies else 0.0
        end = yield from self._transfer(plan, table.link_factor, start, copies)
        return end

    def _p2p(self, st: _LaneClass, op: SendOp | RecvOp, ready: Lanes):
        table = self._pair_table(op, st.cls.index)
        key = ("p2p", table.src, table.dst, op.tag)
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings[key] = _Meeting(self.env)
        side = 0 if isinstance(op, SendOp) else 1
        meeting.arrived[side] = ready
        if len(meeting.arrived) == 2:
            del self.meetings[key]
            start = table.start(meeting.arrived[0], meeting.arrived[1])
            plan = self._p2p_plan(op, table)
            meeting.result = yield from self._transfer(plan, table.link_factor, start, 0.0)
            meeting.event.succeed()
        else:
            yield meeting.event
        if side == 0:
            return meeting.result
        st.send_posted[op.id] = table.to_receiver(meeting.arrived[0])
        return table.to_receiver(meeting.result)

    def _p2p_plan(self, op: SendOp | RecvOp, table: PairTable) -> Plan:
        """All sends of the pairing as one plan, listed as the collapsed engine lists them (by
        the lanes of the class whose op completes the meeting)."""
        sending = isinstance(op, SendOp)
        key = (table, op.bytes, sending)
        hit = self._plans.get(key)
        if hit is None:
            src, dst = table.src_ranks, table.dst_ranks
            if not sending:
                src, dst = src[table.src_lane], dst[table.src_lane]
            device = self.device_of
            pairs = [(device(int(a)), device(int(b))) for a, b in zip(src, dst)]
            hit = self._plans[key] = self.network.p2p_plan(op.bytes, pairs)
        return hit

    def _time(self, plan: Plan) -> float:
        """``plan``'s time alone, once per plan object (it walks every link of its loads)."""
        hit = self._plan_times.get(id(plan))
        if hit is None or hit[0] is not plan:
            hit = self._plan_times[id(plan)] = (plan, plan.time(self.network.topology))
        return hit[1]

    def _alone(self, plan: Plan, factor: tuple[Lanes, Lanes], extra_s: float) -> np.ndarray:
        """Per group: the plan's time alone, stretched by the group's own (network, scale-up)
        link factors."""
        size = max(np.size(f) for f in factor)
        pairs = np.stack([np.broadcast_to(f, size) for f in factor], axis=1)
        values, inverse = np.unique(pairs, axis=0, return_inverse=True)
        topology = self.network.topology
        times = np.array([(plan.scaled(net, intra).time(topology)
                           if net != 1.0 or intra != 1.0 else self._time(plan)) + extra_s
                          for net, intra in values.tolist()])
        return times[inverse.reshape(-1)]

    def _transfer(self, plan: Plan, factor: tuple[Lanes, Lanes], start: Lanes, extra_s: float):
        """Per group: when ``plan`` ends for groups that start at ``start`` (see the module
        docstring for how contention is charged when they do not all start together)."""
        env = self.env
        now = env.now
        net, intra = (f if isinstance(f, float) else float(np.max(f)) for f in factor)
        scaled = plan.scaled(net, intra) if net != 1.0 or intra != 1.0 else plan
        uniform = all(isinstance(f, float) for f in factor)
        together = uniform and isinstance(start, float)
        if self.flows is None or not scaled.loads:
            alone = self._time(scaled) + extra_s
            if together:
                yield env.timeout(alone if start == now else max(start + alone - now, 0.0))
                return start + alone
            end = settle(start + (alone if uniform else self._alone(plan, factor, extra_s)))
            yield env.timeout(max(float(np.max(end)) - now, 0.0))
            return end
        yield self.flows.transfer(scaled.loads)
        elapsed = env.now - now
        yield env.timeout(scaled.latency_s + max(scaled.intra_s, elapsed) - elapsed + extra_s)
        if together:
            return env.now + (start - now)
        own = 0.0 if uniform else (
            self._alone(plan, factor, extra_s) - (self._time(scaled) + extra_s))
        return settle(env.now + ((start - now) + own))

    # --- running --------------------------------------------------------------------------
    def start(self) -> None:
        """Create the processes in the environment (which the caller runs)."""
        for st in self.states:
            for ops in stream_runs(st.ops, st.previous):
                if ops[0].stream is Stream.COMPUTE:
                    st.first_compute = ops[0].id
                self.env.process(self._stream(st, ops))

    def finished(self, events: int, wall_time_s: float) -> Replay:
        """The records once the environment has run out of events; a deadlock is an error."""
        stuck = [st for st in self.states if not all(st.done)]
        if stuck:
            st = stuck[0]
            op = st.ops[st.done.index(False)]
            raise RuntimeError(f"deadlock: rank class {st.cls.index} never finished op {op.id} "
                               f"({op.name}); the trace's collectives or send/recv do not match")
        finish = np.zeros(self.trace.world_size)
        timelines = []
        for st in self.states:
            lane_finish = np.broadcast_to(latest(st.end), len(st.cls.ranks))
            finish[list(st.cls.ranks)] = lane_finish
            timelines.append(self._timeline(st, int(np.argmax(lane_finish))))
        return Replay(timelines=tuple(timelines), class_of=self.class_of, events=events,
                      wall_time_s=wall_time_s, rank_finish_s=finish)

    def _timeline(self, st: _LaneClass, lane: int) -> ClassTimeline:
        """The timeline of one lane (the class's slowest rank, which it then represents)."""
        def at(value: Lanes) -> float:
            return value if isinstance(value, float) else float(value[lane])

        end = tuple(at(e) for e in st.end)
        ready = []
        for op in st.ops:
            before = [end[d] for d in op.deps]
            if st.previous[op.id] >= 0:
                before.append(end[st.previous[op.id]])
            if op.id == st.first_compute:
                before.append(at(st.stall_s))
            ready.append(max(before, default=0.0))
        records = op_records(st.cls.index, st.ops, ready, end, self.record)
        ranks = st.cls.ranks
        slowest = RankClass(st.cls.index, st.cls.program,
                            (ranks[lane],) + ranks[:lane] + ranks[lane + 1:])
        return ClassTimeline(rank_class=slowest, ready_s=tuple(ready), end_s=end,
                             stream_predecessor=tuple(st.previous),
                             send_posted_s={k: at(v) for k, v in st.send_posted.items()},
                             records=records)


def _per_rank(values: Mapping[int, float], world: int, default: float) -> np.ndarray | None:
    """rank -> value as an array (None: no rank has one)."""
    if not values:
        return None
    out = np.full(world, default)
    out[list(values)] = list(values.values())
    return out


def _slowest(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None or b is None:
        return b if a is None else a
    return np.maximum(a, b)

"""Run-time state of a step replay: per rank class, per stream, per rendezvous."""

from __future__ import annotations

import math

import simpy

from clustersim.simulator.classes import RankClass
from clustersim.simulator.cost.interfaces import ComputeCost, Instances
from clustersim.simulator.interference import DeviceActivity, Interference
from clustersim.simulator.op_records import op_records
from clustersim.simulator.records import ClassTimeline
from clustersim.workloads.trace import Op


class Rendezvous:
    __slots__ = ("needed", "arrived", "event", "posted")

    def __init__(self, env: simpy.Environment, needed: frozenset[int]):
        self.needed = needed
        self.arrived: set[int] = set()
        self.event = env.event()
        self.posted: dict[int, float] = {}


class ClassState:
    """Run-time state of one rank class."""

    __slots__ = ("cls", "compute", "ops", "finish", "arrive", "previous", "waiters", "activity",
                 "seq", "signature", "instances",
                 "compute_slow", "link_slow", "nic_slow", "nvlink_slow", "launch_s", "stall_s",
                 "issue_s", "send_posted", "group_classes", "blocked", "fixed", "evented")

    def __init__(self, cls: RankClass, ops: tuple[Op, ...], condition: tuple[float, ...],
                 interference: Interference, compute: ComputeCost, issue_s: float):
        self.cls = cls
        self.compute = compute
        """The compute model of this class's device."""
        self.issue_s = issue_s
        """Its host's time to issue one kernel eagerly (``NodeSpec.eager_issue_s``)."""
        self.ops = ops
        self.finish: list[float] = [math.nan] * len(ops)
        self.arrive: list[float] = [0.0] * len(ops)
        """When each op was ready to start (its deps and its stream predecessor done)."""
        self.previous: list[int] = [-1] * len(ops)
        """The op before it on its stream (-1: first, or on the unordered pp stream)."""
        self.waiters: dict[int, simpy.Event] = {}
        self.blocked: dict[int, list[StreamRun]] = {}
        self.fixed: dict[tuple, float | None] = {}
        """Folded replay: a collective's duration by what decides it (None: it shares)."""
        """Folded replay: op id -> the streams waiting for its end to be known."""
        self.evented: frozenset[int] = frozenset()
        """Folded replay: ops that run as events although they share nothing: collectives
        whose kernels hold SMs and the compute they may overlap (``held_overlap.py``)."""
        self.activity = DeviceActivity(interference)
        self.seq: dict[str, int] = {}
        self.signature: dict[str, tuple[int, ...]] = {}
        self.group_classes: dict[str, frozenset[int]] = {}
        self.instances: dict[str, Instances] = {}
        (self.compute_slow, self.link_slow, self.nic_slow, self.nvlink_slow, self.launch_s,
         self.stall_s) = condition
        self.send_posted: dict[int, float] = {}
        """recv op id -> when the matching send was posted (before that it is bubble)."""

    def timeline(self, every: bool) -> ClassTimeline:
        """``every``: a record of every op (else of compute ops only)."""
        return ClassTimeline(rank_class=self.cls, ready_s=tuple(self.arrive),
                             end_s=tuple(self.finish), stream_predecessor=tuple(self.previous),
                             send_posted_s=self.send_posted,
                             records=op_records(self.cls.index, self.ops, self.arrive,
                                                self.finish, every))


class StreamRun:
    """Folded replay: the ops of one stream (or one pp op) and how far they are known."""

    __slots__ = ("ops", "next", "end")

    def __init__(self, ops: list[Op], begin: float):
        self.ops = ops
        self.next = 0
        """Index of its first op whose end is not known yet."""
        self.end = begin
        """When its last known op ends (its start before the first)."""

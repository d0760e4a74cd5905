"""Exact event logs of the step engine on tiny hand-written traces: who did what, when.

The cost models here are plain objects that answer the engine's three interfaces
(``simulator/cost/interfaces.py``) with round numbers: a compute op takes the milliseconds its
name ends with (``c0:10`` takes 10 ms), a collective or a send moves data for a fixed time, a
copy takes a fixed time. Interference is off unless a test turns it on, so every time below
follows from the trace by hand.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from clustersim.hardware_specs import load_catalog
from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator.cost.collectives import Algorithm, Plan, Protocol
from clustersim.simulator.engine import NetworkMode
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, GroupSet, Phase, Program, RecvOp,
    SendOp, Stream, Trace,
)

MS = 1e-3
QUIET = SimulationOptions(comm_slowdown_when_overlapped=0.0, compute_slowdown_when_overlapped=0.0)


class NamedCompute:
    def op_time(self, op):
        return float(op.name.split(":")[1]) * MS


class OneLink:
    """Every link carries 1 GB/s."""

    def capacity(self, link):
        return 1e9


class FixedNetwork:
    """A collective moves data for ``collective_ms`` on the scale-up links, a send for
    ``send_ms``; with ``over_link`` a collective instead pushes its bytes through one shared
    network link of 1 GB/s (so the flow model can share it)."""

    def __init__(self, collective_ms=4.0, send_ms=2.0, over_link=False):
        self.topology = OneLink()
        self.collective_ms, self.send_ms, self.over_link = collective_ms, send_ms, over_link

    def plan(self, kind, nbytes, instances, routing=None):
        if self.over_link:
            return Plan(Algorithm.RING, Protocol.SIMPLE, 0.0, 0.0, ((("nic", 0), nbytes),))
        return Plan(Algorithm.RING, Protocol.SIMPLE, 0.0, self.collective_ms * MS, ())

    def p2p_plan(self, nbytes, pairs):
        return Plan(Algorithm.DIRECT, Protocol.SIMPLE, 0.0, self.send_ms * MS, ())


class FixedMemory:
    capacity_bytes = 80e9

    def copy_time(self, kind, nbytes):
        return 7 * MS


def compute(i, name, deps=(), phase=Phase.FORWARD):
    return ComputeOp(i, name, phase, (), deps)


def all_reduce(i, deps=(), group="dp", stream=Stream.DP, nbytes=4e6):
    return CollectiveOp(i, f"{group}_all_reduce", CollectiveKind.ALL_REDUCE, nbytes, group,
                        stream, deps)


def trace(*programs, groups=None) -> Trace:
    world = sum(len(p.ranks) for p in programs)
    groups = groups or {"dp": ((tuple(range(world))),)}
    return Trace(world_size=world, programs=tuple(programs),
                 group_sets={name: GroupSet(name, g) for name, g in groups.items()},
                 model_flops=1e12, tokens=1000)


def replay(t, options=QUIET, faults=Faults(), network=None):
    sim = StepSimulation(t, _cluster(len(t.programs[0].ranks) * len(t.programs)), options, faults,
                         compute=NamedCompute(), network=network or FixedNetwork(),
                         memory=FixedMemory())
    return sim.run()


@functools.cache
def _cluster(n):
    return load_catalog().cluster(device="h100-sxm", num_devices=max(n, 2))


def log(result):
    """(class, op, stream, start ms, end ms, category) in the order ops finished, per class."""
    return [(r.rank_class, r.name, r.stream, round(r.start / MS, 9), round(r.end / MS, 9),
             r.category) for r in result.records]


def ms(breakdown):
    out = {"compute": breakdown.compute_s, "bubble": breakdown.bubble_s,
           "optimizer": breakdown.optimizer_s, "offload": breakdown.offload_s,
           "other": breakdown.other_s, **breakdown.exposed_comm_s}
    return {k: round(v / MS, 9) for k, v in out.items() if v}


def test_streams_overlap_and_a_dependency_waits_for_the_collective():
    """c1 runs beside the all-reduce; c2 needs both, so it waits 1 ms of exposed DP time."""
    t = trace(Program("stage0", (0, 1), (
        compute(0, "c0:10"), all_reduce(1, (0,)), compute(2, "c1:3", (0,)),
        compute(3, "c2:1", (1, 2)))))
    result = replay(t)
    assert log(result) == [
        (0, "c0:10", "compute", 0, 10, "forward"),
        (0, "c1:3", "compute", 10, 13, "forward"),
        (0, "dp_all_reduce", "dp", 10, 14, "dp"),
        (0, "c2:1", "compute", 14, 15, "forward"),
    ]
    assert result.step_time_s == pytest.approx(15 * MS)
    assert ms(result.breakdown) == {"compute": 14, "dp": 1}


def test_a_collective_waits_for_every_rank_class_of_its_group():
    """Stage a reaches the all-reduce at 10 ms, stage b at 30 ms: it runs [30, 34] for both,
    and a's 20 ms of waiting is exposed DP communication on its breakdown."""
    t = trace(Program("a", (0,), (compute(0, "c0:10"), all_reduce(1, (0,)))),
              Program("b", (1,), (compute(0, "c0:30"), all_reduce(1, (0,)))))
    result = replay(t)
    assert log(result) == [
        (0, "c0:10", "compute", 0, 10, "forward"),
        (0, "dp_all_reduce", "dp", 10, 34, "dp"),
        (1, "c0:30", "compute", 0, 30, "forward"),
        (1, "dp_all_reduce", "dp", 30, 34, "dp"),
    ]
    assert [c.finish_s / MS for c in result.classes] == pytest.approx([34, 34])
    assert result.critical_class == 0   # a tie goes to the lower index
    assert ms(result.classes[0].breakdown) == {"compute": 10, "dp": 24}
    assert ms(result.classes[1].breakdown) == {"compute": 30, "dp": 4}


def test_a_receive_waits_as_bubble_until_its_send_is_posted():
    """Stage 1 posts its receive at 0; stage 0 sends after 10 ms of compute; the 2 ms transfer
    ends at 12. Stage 1's first 10 ms are bubble, the next 2 exposed PP communication; its
    receive's record runs from when the data could start to arrive (10), as timelines draw it."""
    pp = {"pp": ((0, 1),)}
    t = trace(Program("stage0", (0,), (compute(0, "f0:10"),
                                       SendOp(1, "send", "pp", 1, 1e6, 7, deps=(0,)))),
              Program("stage1", (1,), (RecvOp(0, "recv", "pp", 0, 1e6, 7),
                                       compute(1, "f1:10", (0,)))), groups=pp)
    result = replay(t)
    assert log(result) == [
        (0, "f0:10", "compute", 0, 10, "forward"),
        (0, "send", "pp", 10, 12, "pp"),
        (1, "recv", "pp", 10, 12, "pp"),
        (1, "f1:10", "compute", 12, 22, "forward"),
    ]
    assert ms(result.classes[1].breakdown) == {"compute": 10, "bubble": 10, "pp": 2}
    assert ms(result.classes[0].breakdown) == {"compute": 10, "pp": 2}
    assert result.step_time_s == pytest.approx(22 * MS) and result.critical_class == 1


def test_an_offload_copy_runs_on_its_own_stream_and_the_optimizer_waits_for_it():
    t = trace(Program("stage0", (0, 1), (
        compute(0, "b0:5", phase=Phase.BACKWARD),
        CopyOp(1, "grads_to_host", CopyKind.DEVICE_TO_HOST, 1e9, deps=(0,)),
        compute(2, "b1:3", (0,), phase=Phase.BACKWARD),
        compute(3, "adam:2", (1, 2), phase=Phase.OPTIMIZER))))
    result = replay(t)
    assert log(result) == [
        (0, "b0:5", "compute", 0, 5, "backward"),
        (0, "b1:3", "compute", 5, 8, "backward"),
        (0, "grads_to_host", "copy", 5, 12, "other"),
        (0, "adam:2", "compute", 12, 14, "optimizer"),
    ]
    assert ms(result.breakdown) == {"compute": 8, "optimizer": 2, "offload": 4}


def test_a_straggler_splits_off_and_its_group_waits_for_it():
    """Rank 1 computes at half speed: it becomes its own class, rank 0 waits at the
    all-reduce, and the step follows the straggler."""
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:10"), all_reduce(1, (0,)),
                                         compute(2, "c1:1", (1,)))))
    result = replay(t, faults=Faults(compute_slowdown={1: 2.0}))
    assert log(result) == [
        (0, "c0:10", "compute", 0, 10, "forward"),
        (0, "dp_all_reduce", "dp", 10, 24, "dp"),
        (0, "c1:1", "compute", 24, 25, "forward"),
        (1, "c0:10", "compute", 0, 20, "forward"),
        (1, "dp_all_reduce", "dp", 20, 24, "dp"),
        (1, "c1:1", "compute", 24, 26, "forward"),
    ]
    assert [c.ranks for c in result.classes] == [1, 1] and result.critical_class == 1


def test_a_degraded_link_stretches_every_transfer_it_takes_part_in():
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:10"), all_reduce(1, (0,)))))
    result = replay(t, faults=Faults(link_slowdown={0: 1.5}))
    assert [(r.rank_class, r.name, round(r.end / MS, 9)) for r in result.records
            if r.stream == "dp"] == [(0, "dp_all_reduce", 16), (1, "dp_all_reduce", 16)]


@pytest.mark.parametrize("mode, ends", [(NetworkMode.FLOW, [8, 8]),
                                        (NetworkMode.ANALYTIC, [4, 4])])
def test_two_transfers_on_one_link_share_it_under_the_flow_model(mode, ends):
    """Two 4 MB transfers start together on one 1 GB/s link: 4 ms each alone, 8 ms together
    under max-min sharing; the analytic model ignores the contention."""
    t = trace(Program("stage0", (0, 1), (all_reduce(0, group="dp"),
                                         all_reduce(1, group="tp", stream=Stream.TP))),
              groups={"dp": ((0, 1),), "tp": ((0, 1),)})
    options = SimulationOptions(comm_slowdown_when_overlapped=0.0,
                                compute_slowdown_when_overlapped=0.0, network=mode)
    result = replay(t, options, network=FixedNetwork(over_link=True))
    assert sorted(round(r.end / MS, 9) for r in result.records) == ends


def test_a_transfer_that_starts_during_compute_is_stretched_by_the_comm_slowdown():
    """With comm_slowdown 0.5, an all-reduce that starts while c1 computes takes 1.5 x 4 ms."""
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:10"), all_reduce(1, (0,)),
                                         compute(2, "c1:10", (0,)))))
    options = SimulationOptions(comm_slowdown_when_overlapped=0.5,
                                compute_slowdown_when_overlapped=0.0)
    assert [(r.name, round(r.start / MS, 9), round(r.end / MS, 9))
            for r in replay(t, options).records] == [
        ("c0:10", 0, 10), ("dp_all_reduce", 10, 16), ("c1:10", 10, 20)]


def test_events_are_counted_exactly():
    """Two compute ops share nothing, so both ends are known at once, without an event each:
    the end-of-step process's start, the event that every end is known, one timeout to the
    last end and the process's end are the four events."""
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:1"), compute(1, "c1:1", (0,)))))
    assert replay(t).events == 4


def test_mismatched_collectives_are_a_deadlock_naming_the_op():
    t = trace(Program("a", (0,), (compute(0, "c0:1"), all_reduce(1, (0,)))),
              Program("b", (1,), (compute(0, "c0:1"),)))
    with pytest.raises(RuntimeError, match=r"deadlock: rank class 0 never finished op 1 "
                                           r"\(dp_all_reduce\)"):
        replay(t)


def test_the_same_trace_gives_the_same_log():
    t = trace(Program("a", (0,), (compute(0, "c0:10"), all_reduce(1, (0,)))),
              Program("b", (1,), (compute(0, "c0:10"), all_reduce(1, (0,)))))
    assert log(replay(t)) == log(replay(t))


def test_the_engine_uses_only_simpys_public_api():
    """SimPy's private attributes (``env._eid``, ``env._queue``) change between releases."""
    sources = (Path(__file__).resolve().parents[1] / "simulator").rglob("*.py")
    private = {p.name: re.findall(r"\benv\._\w+", p.read_text()) for p in sources}
    assert {name: uses for name, uses in private.items() if uses} == {}

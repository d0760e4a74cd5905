"""Invariants of the engine, the trace and the memory model, over strategies hypothesis draws.

Every example is a small job (at most 8 GPUs, a few layers) so a run takes well under a second;
the examples are derandomized (``tests/conftest.py``), so a failure reproduces on every run,
and ``HYPOTHESIS_PROFILE=thorough`` draws many more at random.
"""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch
from dataclasses import replace

import pytest
import simpy
from hypothesis import assume, given, strategies as st

from clustersim.hardware_specs import SpecError, load_catalog
from clustersim.simulator import Faults, SimulationOptions, StepSimulation
from clustersim.simulator import lanes as lanes_module
from clustersim.simulator.engine import NetworkMode
from clustersim.simulator.flows import FlowNetwork
from clustersim.workloads import Recompute, Schedule, Strategy
from clustersim.workloads.builder import build_trace
from clustersim.workloads.trace import RecvOp, SendOp

from tests.conftest import tiny_job

CATALOG = load_catalog()


@st.composite
def jobs(draw, max_world: int = 8):
    """A valid job of at most ``max_world`` GPUs (invalid draws are rejected)."""
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    assume(tp * pp * dp <= max_world)
    interleaved = pp > 1 and draw(st.booleans())
    strategy = Strategy(
        tp=tp, pp=pp, dp=dp,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        zero=draw(st.sampled_from([0, 1, 2, 3])) if dp > 1 else 0,
        recompute=draw(st.sampled_from(list(Recompute))),
        schedule=Schedule.INTERLEAVED if interleaved else Schedule.ONE_F_ONE_B,
        virtual_stages=2 if interleaved else 1)
    micro = draw(st.sampled_from([1, 2]))
    per_replica = micro * draw(st.sampled_from([1, 2, 4]))
    try:
        return tiny_job(strategy, global_batch=dp * per_replica, micro_batch=micro,
                        seq_len=draw(st.sampled_from([256, 512])), layers=4 * pp,
                        hidden=draw(st.sampled_from([256, 512])), heads=8)
    except SpecError:
        assume(False)


def _cluster(job, gpu="h100-sxm"):
    return CATALOG.cluster(device=gpu, num_devices=job.strategy.world_size)


def _run(job, lanes=True, **options):
    return StepSimulation(build_trace(job), _cluster(job), SimulationOptions(**options),
                          lanes=lanes).run()


@given(jobs(), st.sampled_from(["h100-sxm", "a100-80gb"]))
def test_no_rank_finishes_before_its_own_compute_and_the_parts_add_up(job, gpu):
    result = StepSimulation(build_trace(job), _cluster(job, gpu)).run()
    assert result.step_time_s >= result.breakdown.compute_s + result.breakdown.optimizer_s
    for c in result.classes:
        b = c.breakdown
        assert c.finish_s >= b.compute_s + b.optimizer_s
        assert b.total_s == pytest.approx(c.finish_s, rel=1e-9)
        assert min(b.bubble_s, b.other_s, *b.exposed_comm_s.values()) >= -1e-12
    assert result.step_time_s == max(c.finish_s for c in result.classes)


@given(jobs())
def test_collapsed_rank_classes_give_the_expanded_step_time(job):
    """Ranks with identical programs on a homogeneous cluster are simulated once; simulating
    every rank on its own must not change the step."""
    collapsed = _run(job, record=False)
    expanded = _run(job, record=False, expand=True, lanes=False)
    assert len(expanded.classes) == job.strategy.world_size
    assert expanded.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12)
    lanes = _run(job, record=False, expand=True)
    assert lanes.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12)
    assert (lanes.rank_finish_s <= lanes.step_time_s).all()


@given(jobs(), st.data())
def test_under_the_analytic_model_lanes_give_every_rank_its_per_rank_finish(job, data):
    """Ranks slowed by factors of their own (compute, links, NICs, NVLink, kernel launches,
    late input): under the analytic network model, following them as lanes of the collapsed classes gives every rank the finish time
    that simulating one class per rank gives."""
    world = job.strategy.world_size
    factors = st.lists(st.sampled_from([1.0, 1.1, 1.5, 2.0]), min_size=world, max_size=world)
    seconds = st.lists(st.sampled_from([0.0, 1e-5, 1e-3]), min_size=world, max_size=world)
    faults = Faults(compute_slowdown=dict(enumerate(data.draw(factors))),
                    link_slowdown=dict(enumerate(data.draw(factors))),
                    nic_slowdown=dict(enumerate(data.draw(factors))),
                    nvlink_slowdown=dict(enumerate(data.draw(factors))),
                    launch_overhead_s=dict(enumerate(data.draw(seconds))),
                    input_stall_s=dict(enumerate(data.draw(seconds))))
    trace, cluster = build_trace(job), _cluster(job)
    options = SimulationOptions(record=False, expand=True, network=NetworkMode.ANALYTIC)
    with patch.object(lanes_module, "SPLIT_PER_PROGRAM", 0):   # lanes that differ, not the split
        lanes = StepSimulation(trace, cluster, options, faults).run()
    per_rank = StepSimulation(trace, cluster, options, faults, lanes=False).run()
    finish = {c.representative: c.finish_s for c in per_rank.classes}
    assert lanes.rank_finish_s.tolist() == pytest.approx([finish[r] for r in range(world)],
                                                         rel=1e-12, abs=0.0)


@given(jobs())
def test_every_byte_sent_between_stages_is_received(job):
    """Each pipeline send has a receive of the same size and tag on its peer's stage."""
    trace = build_trace(job)
    stage_of = {r: i for i, p in enumerate(trace.programs) for r in p.ranks}
    sent, received = Counter(), Counter()
    for i, program in enumerate(trace.programs):
        rank = program.ranks[0]
        for op in program.ops:
            if isinstance(op, (SendOp, RecvOp)):
                peer = stage_of[trace.group_of(op.group, rank)[op.peer]]
                src, dst = (i, peer) if isinstance(op, SendOp) else (peer, i)
                (sent if isinstance(op, SendOp) else received)[(src, dst, op.tag, op.bytes)] += 1
    assert sent == received
    assert bool(sent) == (job.strategy.pp > 1)


@given(jobs(), st.sampled_from([2, 4]))
def test_memory_never_falls_as_the_micro_batch_grows(job, factor):
    """A larger micro-batch (same global batch) holds at least as many activation bytes on
    every stage: 1F1B keeps min(stages ahead, micro-batches) of them in flight."""
    t, s = job.training, job.strategy
    bigger = t.micro_batch * factor
    assume(t.global_batch % (s.dp * bigger) == 0)
    try:
        larger = replace(job, training=replace(t, micro_batch=bigger)).checked(s.world_size)
    except SpecError:
        assume(False)
    for small, large in zip(job.memory(), larger.memory()):
        assert large.memory.activations >= small.memory.activations
        assert large.memory.total >= small.memory.total


transfers = st.lists(
    st.tuples(st.floats(0.0, 5.0),                                     # start (s)
              st.dictionaries(st.sampled_from(["a", "b", "c"]),        # link -> bytes
                              st.floats(1.0, 10.0), min_size=1, max_size=3)),
    min_size=1, max_size=6)


@given(transfers)
def test_links_carry_every_byte_and_never_more_than_their_capacity(batch):
    """Flow model: every transfer completes no sooner than alone on the network, and over any
    span a link moves at most capacity x span bytes (here 1 byte/s per link)."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity=lambda link: 1.0)
    ends: dict[int, float] = {}

    def start(i, at, loads):
        yield env.timeout(at)
        yield net.transfer(tuple(sorted(loads.items())))
        ends[i] = env.now

    for i, (at, loads) in enumerate(batch):
        env.process(start(i, at, loads))
    env.run()
    assert len(ends) == len(batch)
    for i, (at, loads) in enumerate(batch):
        assert ends[i] - at >= max(loads.values()) * (1 - 1e-9)
    for link in "abc":
        on_link = [(at, ends[i], loads[link]) for i, (at, loads) in enumerate(batch)
                   if link in loads]
        for first, _, _ in on_link:
            later = [(end, b) for at, end, b in on_link if at >= first]
            assert sum(b for _, b in later) <= (max(e for e, _ in later) - first) * (1 + 1e-9)


@given(st.lists(st.floats(1.0, 10.0), min_size=1, max_size=6))
def test_a_shared_link_stays_busy_until_its_last_byte(sizes):
    """Transfers that all start together on one link finish, the last of them, exactly when
    the link has moved their bytes: max-min sharing wastes no capacity."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity=lambda link: 2.0)
    ends = []

    def send(nbytes):
        yield net.transfer(((("nic", 0), nbytes),))
        ends.append(env.now)

    for b in sizes:
        env.process(send(b))
    env.run()
    assert len(ends) == len(sizes)
    assert max(ends) == pytest.approx(sum(sizes) / 2.0, rel=1e-9)

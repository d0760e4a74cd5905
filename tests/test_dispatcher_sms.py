"""The SMs an expert-parallel dispatcher's kernels hold slow the compute that overlaps them.

DeepEP's and HybridEP's dispatch and combine run on a fixed number of SMs for as long as they
move data (Megatron-Core ``moe_deepep_num_sms``, default 20; Megatron-Bridge's performance
recipes set ``moe_hybridep_num_sms = 32``); a GEMM beside them runs on the rest.
"""

from __future__ import annotations

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.simulator.cost.collectives import Algorithm, Plan, Protocol
from clustersim.simulator.interference import sm_share_slowdown
from clustersim.workloads import Job, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.dispatch import DEFAULT_SMS, Dispatcher, TokenRouting
from clustersim.workloads.model import from_mapping
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, Program, Stream
from clustersim.workloads.trace_io import op_from_dict, op_to_dict

from tests.test_a2a_overlap import SMALL_MOE
from tests.test_engine_log import MS, FixedNetwork, all_reduce, compute, replay, trace


def test_compute_beside_a_kernel_holding_sms_runs_on_the_rest():
    """32 of H100's 132 SMs held: compute runs on 100, so 132/100 times as long."""
    assert sm_share_slowdown(32, 132) == pytest.approx(132 / 100 - 1)
    assert sm_share_slowdown(0, 132) == 0.0


def test_a_dispatcher_holding_every_sm_is_an_error_naming_the_field():
    with pytest.raises(SpecError, match="strategy.ep_dispatcher_sms"):
        sm_share_slowdown(132, 132)


def _dispatch(i, deps, sms):
    routing = TokenRouting(dispatcher=Dispatcher.DEEPEP, tokens=1000, token_bytes=4096, top_k=8,
                           experts=64, sms=sms)
    return CollectiveOp(i, "ep_dispatch", CollectiveKind.ALL_TO_ALL, 4e6, "ep", Stream.EP, deps,
                        routing=routing)


@pytest.mark.parametrize("sms, end_ms", [(0, 16), (33, 17)])
def test_compute_overlapping_a_dispatch_stretches_by_the_sms_it_holds(sms, end_ms):
    """A 4 ms dispatch starts at 10 ms beside c1 (6 ms alone). Holding 33 of 132 SMs, it slows
    compute by 33/99 = 1/3 while it moves data: in its 4 ms, c1 does 3 ms of work, then the
    other 3 ms alone, ending at 17 ms; a dispatcher holding none leaves c1 at 16 ms."""
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:10"), _dispatch(1, (0,), sms),
                                         compute(2, "c1:6", (0,)))),
              groups={"dp": ((0, 1),), "ep": ((0, 1),)})
    ends = {r.name: round(r.end / MS, 9) for r in replay(t).records}
    assert ends == {"c0:10": 10, "ep_dispatch": 14, "c1:6": end_ms}


class ByKind(FixedNetwork):
    """An all-to-all moves data for 2 ms, any other collective for 8 ms."""

    def plan(self, kind, nbytes, instances, routing=None):
        ms = 2.0 if kind is CollectiveKind.ALL_TO_ALL else 8.0
        return Plan(Algorithm.RING, Protocol.SIMPLE, 0.0, ms * MS, ())


def test_only_the_dispatchs_own_window_is_slowed_by_its_sms():
    """At 10 ms an 8 ms all-reduce (no SMs counted) and a 2 ms dispatch holding 33 of 132 SMs
    start beside c1 (6 ms alone): c1 does 1.5 ms of work in the dispatch's 2 ms and the other
    4.5 ms at full speed, ending at 16.5 ms, though the all-reduce runs on to 18 ms."""
    t = trace(Program("stage0", (0, 1), (compute(0, "c0:10"), all_reduce(1, (0,)),
                                         _dispatch(2, (0,), 33), compute(3, "c1:6", (0,)))),
              groups={"dp": ((0, 1),), "ep": ((0, 1),)})
    ends = {r.name: round(r.end / MS, 9) for r in replay(t, network=ByKind()).records}
    assert ends == {"c0:10": 10, "dp_all_reduce": 18, "ep_dispatch": 12, "c1:6": 16.5}


def test_the_sms_travel_with_the_trace():
    op = _dispatch(3, (1,), 32)
    assert op_from_dict(op_to_dict(op)) == op


def test_deepep_holds_megatron_cores_default_and_a_strategy_can_set_its_own():
    assert DEFAULT_SMS[Dispatcher.DEEPEP] == 20  # transformer_config.py moe_deepep_num_sms
    s = strategy_from_mapping({"dp": 8, "ep": 8, "ep_dispatcher": "deepep",
                               "ep_dispatcher_sms": 32})
    assert s.ep_dispatcher_sms == 32


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep_ll"])
def test_sms_for_another_dispatcher_are_an_error_naming_the_field(dispatcher):
    """NCCL picks its channels (an SM each) at setup, DeepEP's low-latency kernels their own:
    only DeepEP's normal kernels take a count."""
    data = {"dp": 8, "ep": 8, "ep_dispatcher": dispatcher, "ep_dispatcher_sms": 24}
    with pytest.raises(SpecError, match="strategy.ep_dispatcher_sms"):
        Job(from_mapping(SMALL_MOE), TrainingSpec(seq_len=2048, global_batch=64),
            strategy_from_mapping(data)).checked(8)


def test_the_trace_carries_the_dispatchers_sms():
    """A DeepEP run's dispatch and combine hold Megatron-Core's 20 SMs unless told otherwise;
    NCCL's all-to-all holds none that the model counts."""
    def sms(dispatcher, **over):
        data = {"dp": 8, "ep": 8, "ep_dispatcher": dispatcher, **over}
        job = Job(from_mapping(SMALL_MOE), TrainingSpec(seq_len=2048, global_batch=64),
                  strategy_from_mapping(data)).checked(8)
        return {op.routing.sms for op in build_trace(job).programs[0].ops
                if isinstance(op, CollectiveOp) and op.routing is not None}
    assert sms("deepep") == {20}
    assert sms("deepep", ep_dispatcher_sms=32) == {32}
    assert sms("alltoall") == {0}

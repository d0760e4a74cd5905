"""Megatron-Core's 1F1B all-to-all overlap (``moe_a2a_overlap``): the merged schedule pairs
independent passes, hides expert all-to-alls under the other pass's compute, never beats the
busier of the compute stream and the EP stream, holds one layer of activations more than the
plain schedule, and changes nothing where there is no all-to-all to hide."""

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.simulator import simulate
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.memory import layer_activation_bytes, stage_memory
from clustersim.workloads.model import from_mapping
from clustersim.workloads.strategies.pipeline import stage_order, steps
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategy import Schedule, strategy_from_mapping
from clustersim.workloads.trace import CollectiveOp, ComputeOp, Stream

SMALL_MOE = {"name": "small-moe", "layers": 4, "hidden": 1024, "heads": 16, "vocab": 1024,
             "mlp": "swiglu", "ffn_hidden": 2816, "num_experts": 16, "top_k": 4,
             "moe_ffn_hidden": 704}


def _job(overlap: bool, *, ep: int = 8, pp: int = 1, v: int = 1, dp: int = 8,
         model: dict = SMALL_MOE, micro: int = 8) -> Job:
    training = TrainingSpec(seq_len=2048, global_batch=micro * dp)
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    strategy = Strategy(dp=dp, pp=pp, ep=ep, virtual_stages=v, schedule=schedule,
                        moe_a2a_overlap=overlap)
    return Job(from_mapping(model), training, strategy).checked(dp * pp)


@pytest.mark.parametrize("pp, v, micro", [(1, 1, 6), (2, 2, 4), (4, 2, 8), (4, 3, 8)])
def test_merged_pairs_hold_different_micro_batches_whose_forward_ran_before(pp, v, micro):
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    for stage in range(pp):
        plain = stage_order(schedule, pp, v, micro, stage)
        merged = stage_order(schedule, pp, v, micro, stage, merge=True)
        key = lambda s: (s.kind.value, s.micro, s.chunk)  # noqa: E731
        assert sorted(map(key, merged)) == sorted(map(key, plain))
        done = set()
        for step in steps(merged):
            if len(step) == 2:
                forward, backward = step
                assert forward.kind is Pass.FORWARD and backward.kind is Pass.BACKWARD
                assert (forward.micro, forward.chunk) != (backward.micro, backward.chunk)
            for slot in step:
                if slot.kind is Pass.BACKWARD:
                    assert (slot.micro, slot.chunk) in done
            done |= {(s.micro, s.chunk) for s in step if s.kind is Pass.FORWARD}
        assert sum(len(s) == 2 for s in steps(merged)) > 0


def test_the_merged_schedule_runs_one_more_warm_up_forward():
    plain = stage_order(Schedule.ONE_F_ONE_B, 1, 1, 4, 0)
    merged = stage_order(Schedule.ONE_F_ONE_B, 1, 1, 4, 0, merge=True)
    assert [s.kind for s in plain[:2]] == [Pass.FORWARD, Pass.BACKWARD]
    assert [s.kind for s in merged[:3]] == [Pass.FORWARD, Pass.FORWARD, Pass.BACKWARD]
    assert merged[2].merged and not merged[-1].merged


def test_a_merged_pass_computes_while_the_other_passes_all_to_all_is_in_flight():
    trace = build_trace(_job(True))
    ops = trace.programs[0].ops
    position = {op.id: i for i, op in enumerate(ops)}
    dispatch = next(op for op in ops if op.name == "fwd1.layer0.mlp.ep_dispatch")
    experts = next(op for op in ops if op.name == "fwd1.layer0.mlp.experts")
    between = ops[position[dispatch.id] + 1:position[experts.id]]
    # Between the forward's dispatch and the experts that wait for it, the backward of micro-
    # batch 0 puts compute on the stream.
    assert any(isinstance(op, ComputeOp) and op.name.startswith("bwd0.") for op in between)


def test_overlap_hides_expert_all_to_alls_and_never_beats_the_busier_stream(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    plain = simulate(build_trace(_job(False)), cluster)
    merged = simulate(build_trace(_job(True)), cluster)
    assert merged.breakdown.exposed_comm_s["ep"] < 0.5 * plain.breakdown.exposed_comm_s["ep"]
    assert merged.step_time_s < plain.step_time_s
    # The step is at least the compute stream's work and at least the EP stream's, which
    # runs its all-to-alls one after another.
    records = [r for r in merged.records if r.rank_class == merged.critical_class]
    ep_busy = sum(r.end - r.start for r in records if r.stream == Stream.EP.value)
    compute = sum(r.end - r.start for r in records if r.stream == Stream.COMPUTE.value)
    assert merged.step_time_s >= max(compute, ep_busy) * (1 - 1e-9)
    assert merged.step_time_s >= merged.breakdown.compute_s


def test_without_all_to_alls_the_merged_schedule_takes_the_plain_time(catalog):
    # A dense model has nothing to hide: the merged passes run one after the other, and with
    # one pipeline stage the extra warm-up forward changes no time.
    dense = {k: v for k, v in SMALL_MOE.items()
             if k not in ("num_experts", "top_k", "moe_ffn_hidden")}
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    plain_job = _job(False, ep=1, model=dense)
    merged_job = Job(plain_job.model, plain_job.training,
                     Strategy(dp=8, moe_a2a_overlap=True))  # unchecked: needs ep > 1 otherwise
    plain, merged = build_trace(plain_job), build_trace(merged_job)
    assert not any(isinstance(op, CollectiveOp) and op.stream is Stream.EP
                   for op in merged.programs[0].ops)
    assert simulate(merged, cluster).step_time_s == pytest.approx(
        simulate(plain, cluster).step_time_s, rel=1e-12)


@pytest.mark.parametrize("over, message", [
    ({"ep": 1}, "needs ep > 1"),
    ({"recompute": "full"}, "recompute: full"),
    ({"pp": 2, "dp": 4, "ep": 4}, "schedule: interleaved"),
])
def test_overlap_refuses_what_megatron_core_refuses(over, message):
    data = {"dp": 8, "ep": 8, "moe_a2a_overlap": True, **over}
    training = TrainingSpec(seq_len=2048, global_batch=64)
    with pytest.raises(SpecError, match=message) as err:
        Job(from_mapping(SMALL_MOE), training, strategy_from_mapping(data)).checked(
            data["dp"] * data.get("pp", 1))
    assert "strategy.moe_a2a_overlap" in str(err.value)


@pytest.mark.parametrize("pp, v, micro", [(1, 1, 8), (2, 2, 8), (1, 1, 1)])
def test_the_merged_schedule_holds_one_layer_more_not_one_micro_batch(pp, v, micro):
    # Megatron-LM pairs forward layer j with backward layer L - 1 - j and frees each backward
    # layer after its pair (model_chunk_schedule_plan.py): at the peak both passes hold one
    # layer beyond the plain schedule's sets; with one micro-batch there is no pair at all.
    plain, merged = (_job(o, pp=pp, v=v, dp=8 // pp, ep=8 // pp, micro=micro)
                     for o in (False, True))
    plan = stage_plans(plain.model, plain.strategy)[0]
    layer = layer_activation_bytes(plain.model, plain.training, plain.strategy)
    extra = (stage_memory(merged.model, merged.training, merged.strategy, plan).memory.activations
             - stage_memory(plain.model, plain.training, plain.strategy, plan).memory.activations)
    assert extra == pytest.approx(layer if micro > 1 else 0.0, rel=1e-12)

"""DualPipe (DeepSeek-V3 report, arXiv 2412.19437 sec. 3.2.1): every stage runs each micro-batch
of both directions once forward and once backward, its overlapped pairs join passes of opposite
directions, it holds two model stages, and its bubble is smaller than 1F1B's on the same job."""

from collections import Counter

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.simulator import simulate
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.memory import memory_per_stage
from clustersim.workloads.model import from_mapping
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategies.pipeline import dualpipe_order, steps
from clustersim.workloads.strategy import Schedule

SMALL_MOE = {"name": "small-moe", "layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024,
             "mlp": "swiglu", "ffn_hidden": 2816, "num_experts": 16, "top_k": 4,
             "moe_ffn_hidden": 704}


@pytest.mark.parametrize("pp, micro", [(2, 4), (4, 8), (8, 20), (16, 120)])
def test_each_stage_runs_every_micro_batch_of_both_directions_once(pp, micro):
    for stage in range(pp):
        order = dualpipe_order(pp, micro, stage)
        passes = Counter((s.kind.value, s.micro, s.chunk) for s in order)
        expected = {(kind.value, j, j // (micro // 2)) for kind in Pass
                    if kind is not Pass.RECOMPUTE for j in range(micro)}
        assert set(passes) == expected and set(passes.values()) == {1}
        seen = set()
        for step in steps(order):
            if len(step) == 2:
                assert step[0].kind is Pass.FORWARD and step[1].kind is Pass.BACKWARD
                assert step[0].chunk != step[1].chunk          # opposite directions
            for slot in step:
                if slot.kind is Pass.BACKWARD:
                    assert slot.micro in seen
                else:
                    seen.add(slot.micro)


def test_each_stage_holds_two_model_stages_and_the_end_stages_both_ends():
    model = from_mapping(SMALL_MOE)
    plans = stage_plans(model, Strategy(pp=4, dp=4, schedule=Schedule.DUALPIPE))
    assert [p.chunk_layer_ids for p in plans] == [((0, 1), (6, 7)), ((2, 3), (4, 5)),
                                                  ((4, 5), (2, 3)), ((6, 7), (0, 1))]
    assert [(p.has_embedding, p.has_head) for p in plans] == [(True, True), (False, False),
                                                              (False, False), (True, True)]


def _job(schedule: Schedule, model: dict = SMALL_MOE, ep: int = 4) -> Job:
    training = TrainingSpec(seq_len=4096, global_batch=64)
    strategy = Strategy(dp=4, pp=4, ep=ep, schedule=schedule)
    return Job(from_mapping(model), training, strategy).checked(16)


def test_dualpipe_hides_all_to_alls_and_bubble_that_1f1b_exposes(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=16)
    plain = simulate(build_trace(_job(Schedule.ONE_F_ONE_B)), cluster)
    dual = simulate(build_trace(_job(Schedule.DUALPIPE)), cluster)
    assert dual.breakdown.exposed_comm_s["ep"] < 0.5 * plain.breakdown.exposed_comm_s["ep"]
    assert dual.breakdown.bubble_s < plain.breakdown.bubble_s
    assert plain.breakdown.compute_s <= dual.step_time_s < plain.step_time_s


def test_dualpipe_keeps_two_parameter_copies_and_pp_plus_one_micro_batches(catalog):
    plain = memory_per_stage(*_parts(_job(Schedule.ONE_F_ONE_B)))
    dual = memory_per_stage(*_parts(_job(Schedule.DUALPIPE)))
    middle_plain, middle_dual = plain[1].memory, dual[1].memory
    assert middle_dual.weights == pytest.approx(2 * middle_plain.weights)
    # 1F1B's stage 1 holds pp - 1 = 3 micro-batches of its 2 layers; DualPipe pp + 1 = 5 of a
    # 2-layer chunk.
    assert middle_dual.activations == pytest.approx(middle_plain.activations * 5 / 3)


def _parts(job: Job):
    return job.model, job.training, job.strategy


@pytest.mark.parametrize("over, field, message", [
    ({"pp": 3, "dp": 4}, "schedule", "even pp"),
    ({"global_batch": 24}, "schedule", "at least 2\\*pp = 8"),
    ({"zero": 3}, "zero", "ZeRO-3"),
])
def test_dualpipe_refuses_shapes_it_cannot_run(over, field, message):
    pp, dp = over.get("pp", 4), over.get("dp", 4)
    training = TrainingSpec(seq_len=4096, global_batch=over.get("global_batch", 64))
    strategy = Strategy(dp=dp, pp=pp, ep=4, schedule=Schedule.DUALPIPE, zero=over.get("zero", 0))
    with pytest.raises(SpecError, match=message) as err:
        Job(from_mapping(SMALL_MOE), training, strategy).checked(dp * pp)
    assert f"strategy.{field}" in str(err.value)

"""Uneven work: layers per pipeline stage (``layers_per_stage``) and samples per data-parallel
replica (``replica_batch``), validated with errors naming the field, and simulated."""

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import run_step
from clustersim.hardware_specs import SpecError
from clustersim.workloads.builder import build_trace
from clustersim.workloads.model import PRESETS
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategy import Strategy, check_strategy, replica_micro_batches
from clustersim.workloads.training import TrainingSpec

LLAMA3_8B = PRESETS["llama3-8b"]
TRAINING = TrainingSpec(seq_len=4096, global_batch=32, micro_batch=1)


def config(**strategy):
    return config_from_mapping({
        "model": "llama3-8b",
        "training": {"seq_len": 2048, "global_batch": 32, "micro_batch": 2},
        "strategy": {"tp": 8, "pp": 2, "dp": 2, "zero": 1, **strategy},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 32}})


@pytest.mark.parametrize("batch, match", [
    ((16, 8, 8), r"strategy.replica_batch: has 3 entries, expected one per data-parallel "
                 r"replica \(dp = 2\)"),
    ((20, 13), r"strategy.replica_batch: entries must be multiples of training.micro_batch=2, "
               r"got 13"),
    ((20, 14), r"strategy.replica_batch: entries must sum to training.global_batch=32, got 34"),
])
def test_replica_batch_errors_name_the_field_and_the_numbers(batch, match):
    with pytest.raises(SpecError, match=match):
        config(replica_batch=list(batch))


def test_replica_batch_refuses_collectives_issued_per_micro_batch():
    """ZeRO-3 without a pipeline gathers every micro-batch over the replicas: a replica with
    fewer micro-batches would stop meeting the others."""
    s = Strategy(tp=8, dp=4, zero=3, replica_batch=(8, 8, 8, 8))
    with pytest.raises(SpecError, match="replica_batch.*ZeRO-3"):
        check_strategy(s, LLAMA3_8B, TRAINING)


def test_layers_per_stage_errors_name_the_field():
    with pytest.raises(SpecError, match=r"strategy.layers_per_stage: entries must be >= 1 and "
                                        r"sum to model.layers=32, got \[20, 20\]"):
        config(layers_per_stage=[20, 20])


def test_layers_per_stage_sets_what_each_stage_holds():
    cfg = config(layers_per_stage=[12, 20])
    plans = stage_plans(cfg.job.model, cfg.job.strategy)
    assert [p.layers for p in plans] == [12, 20]
    assert plans[1].layer_ids == tuple(range(12, 32))


def test_even_replica_batch_is_the_default_job():
    even, default = config(replica_batch=[16, 16]), config()
    assert build_trace(even.job).programs == build_trace(default.job).programs


@pytest.mark.slow
def test_the_replica_with_most_micro_batches_sets_the_step():
    """[20, 12] samples: the replica with 10 micro-batches is the critical one, and the step
    takes what an even job of 10 micro-batches per replica takes (the gradient reduction
    waits for it; the other replica idles)."""
    uneven = config(replica_batch=[20, 12])
    assert replica_micro_batches(uneven.job.training, uneven.job.strategy) == (10, 6)
    trace = build_trace(uneven.job)
    assert {p.name for p in trace.programs} == {
        "stage0.batch12", "stage0.batch20", "stage1.batch12", "stage1.batch20"}
    heavy = config_from_mapping({
        "model": "llama3-8b", "training": {"seq_len": 2048, "global_batch": 40, "micro_batch": 2},
        "strategy": {"tp": 8, "pp": 2, "dp": 2, "zero": 1},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 32}})
    step = run_step(uneven).result.step_time_s
    assert step == pytest.approx(run_step(heavy).result.step_time_s, rel=0.01)
    assert step > run_step(config()).result.step_time_s * 1.15

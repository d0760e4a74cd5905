"""Calibration with real torch (skipped without the ``calibrate`` extra): the hybrid-parallel
training job computes what a single process computes, and the whole loop runs from the CLI."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from clustersim.hardware_specs import SpecError, load_catalog  # noqa: E402
from clustersim.workloads import Job, Strategy, TrainingSpec  # noqa: E402
from clustersim.workloads.model import from_mapping  # noqa: E402
from clustersim.workloads.training import Precision  # noqa: E402

from clustersim.analysis.calibration.train import Timing, check_runnable, measure  # noqa: E402
from tests.conftest import REPO  # noqa: E402

MODEL = from_mapping({"name": "tiny-gpt", "layers": 2, "hidden": 64, "heads": 2, "vocab": 128,
                      "mlp": "gelu", "position": "learned", "max_positions": 16})
TRAINING = TrainingSpec(seq_len=16, global_batch=8, micro_batch=2, precision=Precision.FP32)


def job(**strategy) -> Job:
    s = Strategy(**strategy)
    return Job(MODEL, TRAINING, s).checked(s.world_size)


@pytest.fixture(scope="module")
def reference():
    return measure(job(), Timing(steps=1, warmup=2))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [dict(dp=2), dict(dp=2, zero=3), dict(tp=2), dict(pp=2)],
                         ids=["dp2", "fsdp2", "tp2", "pp2"])
def test_parallel_job_trains_exactly_like_one_process(reference, strategy):
    """Same seed, same global batch: the loss of every step (after real Adam updates through
    DDP, FSDP, Megatron TP or 1F1B) equals the single-process loss. A wrong gradient
    all-reduce, shard or pipeline send would change it from the second step on."""
    run = measure(job(**strategy), Timing(steps=1, warmup=2))
    assert len(run.losses) == 3 and run.losses[0] == pytest.approx(4.95, abs=0.1)  # ~ln 128
    assert run.losses == pytest.approx(reference.losses, rel=2e-5)
    assert run.losses[2] < run.losses[0]
    assert run.step_time_s > 0 and run.phases_s["optimizer"] > 0


@pytest.mark.parametrize("strategy, field", [
    (dict(dp=2, zero=1), "strategy.zero"), (dict(tp=2, pp=2), "strategy"),
    (dict(pp=2, schedule="gpipe"), "strategy.schedule")])
def test_unsupported_strategies_are_named(strategy, field):
    from clustersim.workloads.strategy import Schedule
    if "schedule" in strategy:
        strategy["schedule"] = Schedule(strategy["schedule"])
    with pytest.raises(SpecError) as err:
        check_runnable(job(**strategy))
    assert err.value.field == field


@pytest.mark.slow
def test_calibrate_all_end_to_end(tmp_path):
    """microbench -> fit -> validate from the command line: a profile the catalog loads, the
    JSON rows and a report with its plot."""
    out = tmp_path / "prof"
    run = subprocess.run(
        [sys.executable, "-m", "clustersim", "calibrate", "all", "--out", str(out), "--quick",
         "--strategies", "dp2,pp2", "--steps", "3", "--warmup", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Measured vs predicted" in run.stdout
    device = load_catalog([out / "profile.yaml"]).device("profile")
    assert device.provenance["torch"] == torch.__version__
    rows = json.loads((out / "validate.json").read_text())
    assert [r["strategy"] for r in rows] == ["dp2", "pp2"]
    for r in rows:
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0
        assert r["error"] == pytest.approx(
            r["predicted_step_time_s"] / r["measured_step_time_s"] - 1)
    assert (out / "report.md").read_text().count("dp2") >= 2
    assert (out / "report.png").stat().st_size > 1000


@pytest.mark.slow
def test_validate_rejects_a_strategy_before_any_real_run():
    profile = REPO / "analysis" / "data" / "calibration" / "2026-11-30-amd-epyc-2-cores" / \
        "profile.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "clustersim", "calibrate", "validate", "--profile", str(profile),
         "--strategies", "dp2,tp2xpp2"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "error: strategy: tp with pp" in run.stderr and "run 1 of" not in run.stderr

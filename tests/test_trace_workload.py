"""Record small, simulate big: real torch GPT steps recorded with torch.profiler on this
project's 2-core development host (analysis/data/traces/2026-12-01-amd-epyc-2-cores), replayed
on its calibrated profile, against the step times measured in the same runs; the re-timing and
scaling rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustersim.analysis.calibration.compare import time_shared
from clustersim.analysis.cli import main
from clustersim.analysis.config import read_yaml
from clustersim.analysis.traces.workload import simulate_trace_config, trace_config_from_mapping
from clustersim.hardware_specs import SpecError
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.retimed import RetimedCompute
from clustersim.workloads.trace import ComputeOp
from clustersim.workloads.trace_import import import_files
from clustersim.workloads.trace_import.scale import scale_data_parallel

pytestmark = pytest.mark.slow  # recorded torch traces replayed end to end

RECORDED = Path(__file__).resolve().parents[1] / "analysis" / "data" / "traces" / \
    "2026-12-01-amd-epyc-2-cores"


def _simulated(name: str) -> float:
    path = RECORDED / f"{name}.yaml"
    return simulate_trace_config(trace_config_from_mapping(read_yaml(path), path.parent)).step_time_s


def _measured(run: str) -> dict:
    return json.loads((RECORDED / run / "measured.json").read_text())


@pytest.mark.parametrize("run", ["dp1", "dp2"])
def test_recorded_step_within_10_percent_of_the_measured_step(run):
    """Measured: median of the untraced steps interleaved with the traced ones."""
    measured = _measured(run)
    simulated = _simulated(run)
    assert simulated == pytest.approx(measured["measured_step_time_s"], rel=0.10)
    # And the replay reproduces the very step it was recorded from.
    traced = measured["traced_steps_s"][measured["traced_step_kept"]]
    assert simulated == pytest.approx(traced, rel=0.05)


def test_prediction_of_an_untraced_data_parallel_degree_within_15_percent():
    """dp2's recording scaled to 4 replicas (time-sharing 2 cores) against the real dp4 run
    with the same per-replica batch (global batch 32)."""
    measured = _measured("dp4")
    assert measured["training"]["global_batch"] == 32 and measured["world_size"] == 4
    assert _simulated("dp4_from_dp2") == pytest.approx(measured["measured_step_time_s"], rel=0.15)


def test_cli_simulates_a_trace_workload(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", str(RECORDED / "dp4_from_dp2.yaml"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["workload"] == "trace" and data["world_size"] == 4
    assert data["source"]["framework"] == "torch 2.13.0+cpu" and data["step_time_s"] > 0


def test_retiming_moves_compute_with_the_device_rates():
    trace = import_files([RECORDED / "dp1"]).trace
    catalog_cfg = trace_config_from_mapping(read_yaml(RECORDED / "dp1.yaml"), RECORDED)
    device = catalog_cfg.cluster.device
    same = RetimedCompute(ComputeModel(device), ComputeModel(device))
    half = RetimedCompute(ComputeModel(time_shared(device, 2.0)), ComputeModel(device))
    gemm = next(o for o in trace.programs[0].ops if isinstance(o, ComputeOp) and o.kernels
                and o.kernels[0].op_class.value == "matmul")
    gap = next(o for o in trace.programs[0].ops if o.name == "host gap")
    assert same.op_time(gemm) == gemm.measured_s
    # Half the rates: twice the kernel time, less the fixed launch gap the model adds.
    assert half.op_time(gemm) == pytest.approx(2 * gemm.measured_s, rel=0.01)
    assert half.op_time(gap) == pytest.approx(2 * gap.measured_s)   # CPU host = device
    h100 = catalog_cfg.catalog.device("h100-sxm")
    on_gpu = RetimedCompute(ComputeModel(h100), ComputeModel(device))
    assert on_gpu.op_time(gap) == gap.measured_s                     # host overhead stays
    assert on_gpu.op_time(gemm) < gemm.measured_s / 100


def test_scaling_rules():
    dp2 = import_files([RECORDED / "dp2"]).trace
    big, warnings = scale_data_parallel(dp2, 64)
    assert big.world_size == 64 and [p.ranks[:2] for p in big.programs] == [(0, 2), (1, 3)]
    assert big.group_sets["dp"].groups == (tuple(range(64)),)
    assert any("extrapolating" in w for w in warnings)
    assert scale_data_parallel(dp2, 16)[1] == ()
    with pytest.raises(SpecError, match="no collective.*record at least 2 ranks"):
        scale_data_parallel(import_files([RECORDED / "dp1"]).trace, 2)


def test_config_errors_name_the_field(tmp_path):
    data = read_yaml(RECORDED / "dp2.yaml")
    with pytest.raises(SpecError, match="cluster.num_gpus: the trace runs 2 ranks"):
        trace_config_from_mapping({**data, "cluster": {**data["cluster"], "num_gpus": 3}},
                                  RECORDED)
    with pytest.raises(SpecError, match="workload.recorded_on: unknown device"):
        trace_config_from_mapping({**data, "workload": {**data["workload"],
                                                        "recorded_on": "nope"}}, RECORDED)
    with pytest.raises(SpecError, match="model.*or workload.trace"):
        trace_config_from_mapping({**data, "model": "gpt3"}, RECORDED)


def test_recorded_pipeline_pairs_its_sends_and_replays_its_traced_step():
    """pp2 (1F1B, gloo isend/irecv): 4 activations forward and 4 gradients back, each send
    matched by its receive; the replay within 10% of the traced step (the untraced steps of
    that run were faster: see analysis/data/traces/README.md)."""
    from clustersim.workloads.trace import RecvOp, SendOp
    trace = import_files([RECORDED / "pp2"]).trace
    for prog in trace.programs:
        sends = [o for o in prog.ops if isinstance(o, SendOp)]
        recvs = [o for o in prog.ops if isinstance(o, RecvOp)]
        assert len(sends) == len(recvs) == 4
        assert {o.bytes for o in sends + recvs} == {4 * 128 * 256 * 4}   # micro-batch x s x h x fp32
    measured = _measured("pp2")
    traced = measured["traced_steps_s"][measured["traced_step_kept"]]
    assert _simulated("pp2") == pytest.approx(traced, rel=0.10)

"""Chakra JSON: our traces exported and imported again simulate to the same step; foreign
Chakra files (the feeder form and the protobuf-as-JSON form) import with their node types and
data dependencies; a public Chakra trace imports and simulates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from clustersim.analysis.calibration.compare import calibration_config, parse_strategy
from clustersim.analysis.config import load_config
from clustersim.hardware_specs import SpecError
from clustersim.simulator import simulate
from clustersim.workloads.builder import build_trace
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, ComputeOp, RecvOp, SendOp
from clustersim.workloads.trace_import import import_files
from clustersim.workloads.trace_import.chakra_export import export_chakra
from clustersim.workloads.trace_io import trace_to_dict

DATA = Path(__file__).resolve().parents[1] / "analysis" / "data" / "traces"


def _round_trip(trace, tmp_path, every_rank=False):
    files = export_chakra(trace, tmp_path / "et", every_rank=every_rank)
    back = import_files([tmp_path / "et"]).trace
    return files, back


@pytest.mark.parametrize("strategy", ["dp2", "pp2", "tp2", "fsdp2"])
def test_generated_trace_round_trips_to_the_same_step(strategy, tmp_path):
    config = calibration_config(parse_strategy(strategy), "cpu-core")
    trace = build_trace(config.job)
    files, back = _round_trip(trace, tmp_path)
    assert len(files) == len(trace.programs)
    before = simulate(trace, config.cluster).step_time_s
    after = simulate(back, config.cluster).step_time_s
    assert after == before
    mine, theirs = trace_to_dict(trace), trace_to_dict(back)
    theirs["meta"].pop("source")
    assert theirs == mine


def test_every_rank_layout_and_chakra_fields(tmp_path):
    config = calibration_config(parse_strategy("pp2"), "cpu-core")
    trace = build_trace(config.job)
    files, back = _round_trip(trace, tmp_path, every_rank=True)
    assert [f.name for f in files] == ["chakra.0.json", "chakra.1.json"]
    nodes = json.loads(files[0].read_text())["workload_graph"]
    types = {n["NodeType"] for n in nodes}
    assert {4, 5} <= types                   # COMP_NODE, COMM_SEND_NODE (stage 0 sends)
    send = next(n for n in nodes if n["NodeType"] == 5)
    assert send["comm_dst"] == 1 and send["comm_size"] > 0
    assert simulate(back, config.cluster).step_time_s == simulate(trace, config.cluster).step_time_s


def test_recorded_trace_round_trips_with_measured_times(tmp_path):
    rec = import_files([DATA / "2026-12-01-amd-epyc-2-cores" / "dp2"]).trace
    _, back = _round_trip(rec, tmp_path)
    cluster = calibration_config(parse_strategy("dp2"), "cpu-core").cluster
    a = simulate(rec, cluster).step_time_s
    assert a > 1.0 and simulate(back, cluster).step_time_s == a


def test_foreign_forms_types_and_dependencies(tmp_path):
    feeder = {"workload_graph": [
        {"Id": 1, "Name": "fwd", "NodeType": 4, "data_deps": [], "runtime": 100, "is_cpu_op": False},
        {"Id": 2, "Name": "ar", "NodeType": 7, "data_deps": [1], "comm_type": 0,
         "comm_size": 1 << 20, "is_cpu_op": False},
        {"Id": 3, "Name": "opt", "NodeType": 4, "data_deps": [2], "runtime": 50,
         "is_cpu_op": False}]}
    proto = [{"attr": [{"name": "schema", "stringVal": "1.0.2-chakra.0.0.4"}]}] + [
        {"id": "1", "name": "fwd", "type": "COMP_NODE", "durationMicros": "100",
         "attr": [{"name": "num_ops", "int64Val": "1000000"}]},
        {"id": "2", "name": "ag", "type": "COMM_COLL_NODE", "dataDeps": ["1"],
         "attr": [{"name": "comm_type", "int64Val": "2"}, {"name": "comm_size", "int64Val": "4096"}]}]
    a = tmp_path / "feeder.0.json"
    a.write_text(json.dumps(feeder))
    b = tmp_path / "proto.0.json"
    b.write_text("".join(json.dumps(x, indent=1) for x in proto))
    ta = import_files([a], world_size=4).trace
    ops = ta.programs[0].ops
    assert isinstance(ops[1], CollectiveOp) and ops[1].kind is CollectiveKind.ALL_REDUCE
    assert ops[1].deps == (0,) and ops[2].deps == (1,) and ops[0].measured_s == pytest.approx(1e-4)
    tb = import_files([b], world_size=2).trace
    assert tb.programs[0].ops[1].kind is CollectiveKind.ALL_GATHER
    assert tb.programs[0].ops[0].kernels[0].flops == 1e6


def test_missing_dependency_and_cycle_are_named(tmp_path):
    bad = {"workload_graph": [{"Id": 5, "Name": "x", "NodeType": 4, "data_deps": [4], "runtime": 1}]}
    p = tmp_path / "bad.0.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"node 5 \(x\).*depends on node 4, which the file does not"):
        import_files([p])
    cyc = {"workload_graph": [{"Id": 1, "Name": "a", "NodeType": 4, "data_deps": [2], "runtime": 1},
                              {"Id": 2, "Name": "b", "NodeType": 4, "data_deps": [1], "runtime": 1}]}
    p.write_text(json.dumps(cyc))
    with pytest.raises(SpecError, match="node 1 \\(a\\).*dependency cycle"):
        import_files([p])


def test_public_chakra_trace_imports_and_simulates():
    """mlcommons/chakra tests/data/json_trace.tar.gz (MIT), trimmed: see its README."""
    path = DATA / "chakra-public" / "chakra.0.json"
    imported = import_files([path], world_size=8)
    trace = imported.trace
    assert trace.meta["source"]["files"][0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "6 communication nodes carry no comm_size" in imported.warnings[0]
    recorded = sum(op.measured_s for op in trace.programs[0].ops if isinstance(op, ComputeOp))
    cluster = load_config("llama3_8b_fsdp").catalog.cluster(device="h100-sxm", num_devices=8)
    step = simulate(trace, cluster).step_time_s
    # Ops run one at a time in dependency order with their recorded runtimes.
    assert step == pytest.approx(recorded, rel=0.05)
    assert not any(isinstance(o, (SendOp, RecvOp)) for o in trace.programs[0].ops)

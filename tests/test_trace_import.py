"""Importing PyTorch profiler traces: what a rank's timeline becomes, and the clear errors for
traces that cannot be a step (a collective some rank never posts, a missing rank, a cut file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustersim.analysis.cli import main
from clustersim.hardware_specs import OpClass, SpecError, load_catalog
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.retimed import RetimedCompute
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, ComputeOp, RecvOp, SendOp
from clustersim.workloads.trace_import import import_files
from clustersim.workloads.trace_import.op_work import kernel_of


def _op(name, ts, dur, dims=(), types=(), tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": list(dims), "Input type": list(types), **args}}


def kineto(rank: int, world: int, events: list, **extra) -> dict:
    return {"schemaVersion": 1, "traceEvents": events, **extra,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                "pg_config": [{"pg_name": "0", "ranks": list(range(world))}]}}


def step(rank: int, world: int = 2, allreduces: int = 1) -> dict:
    """A forward GEMM, a gradient all-reduce (gloo: finished by the worker thread), the next
    op waiting for it, and an optimizer op."""
    ev = [_op("aten::mm", 0, 100, [[512, 256], [256, 768]], ["float", "float"]),
          _op("aten::add_", 150, 10, [[512, 768], [512, 768]], ["float", "float"])]
    for i in range(allreduces):
        ev.append(_op("c10d::allreduce_", 200 + i, 1, [[[1000]]], ["TensorList"]))
        ev.append(_op("gloo:all_reduce", 201 + i, 499, [[1000]], ["float"], tid=2,
                      cat="user_annotation"))
    ev.append(_op("aten::gelu", 800, 50, [[512, 768]], ["float"]))
    return kineto(rank, world, ev, framework="torch 2.13.0+cpu", host_name="test-host")


def write(tmp: Path, name: str, data) -> Path:
    p = tmp / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_gemm_and_attention_work_from_shapes():
    k = kernel_of("aten::mm", [[512, 256], [256, 768]], ["float", "float"])
    assert (k.op_class, k.flops, k.m, k.n, k.k) == (OpClass.MATMUL, 2 * 512 * 256 * 768, 512, 768, 256)
    a = kernel_of("aten::_scaled_dot_product_flash_attention_for_cpu",
                  [[4, 4, 128, 64]] * 3 + [[]], ["float"] * 3 + ["Scalar"], ["", "", "", "0.0", "True"])
    assert a.op_class is OpClass.ATTENTION and a.flops == 4 * 4 * 4 * 128 * 128 * 64 * 0.5
    assert kernel_of("aten::view", [[4, 4]], ["float"]) is None


def test_a_rank_timeline_becomes_ops_with_waits_and_gaps(tmp_path):
    files = [write(tmp_path, f"rank{r}.json", step(r)) for r in (0, 1)]
    trace = import_files(files).trace
    ops = trace.programs[0].ops
    coll = next(o for o in ops if isinstance(o, CollectiveOp))
    assert coll.kind is CollectiveKind.ALL_REDUCE and coll.bytes == 4000 and coll.group == "dp"
    # The collective follows the op that posted it; gelu (after gloo finished at 700 us) waits
    # for it; the idle 700..800 us is a host gap; 100..150 us is one too.
    gelu = next(o for o in ops if o.name == "aten::gelu")
    gaps = [o for o in ops if o.name == "host gap"]
    assert [round(g.measured_s * 1e6) for g in gaps] == [50, 100]
    assert coll.id in gaps[1].deps and gelu.measured_s == pytest.approx(50e-6)
    mm = ops[0]
    assert isinstance(mm, ComputeOp) and mm.kernels[0].op_class is OpClass.MATMUL
    src = trace.meta["source"]
    assert src["format"] == "kineto" and src["framework"] == "torch 2.13.0+cpu"
    assert src["host"] == "test-host" and len(src["files"][0]["sha256"]) == 64


def test_a_collective_one_rank_never_posts_is_named(tmp_path):
    files = [write(tmp_path, "rank0.json", step(0, allreduces=2)),
             write(tmp_path, "rank1.json", step(1, allreduces=1))]
    with pytest.raises(SpecError, match=r"collective #1 of process group \[0, 1\] "
                                        r"\(all_reduce of 4000 B.*rank 1 never posts it"):
        import_files(files)


def test_a_missing_rank_is_named_and_world_size_lets_one_file_stand_for_all(tmp_path):
    one = write(tmp_path, "rank0.json", step(0, world=4))
    with pytest.raises(SpecError, match="rank 1 is missing"):
        import_files([one])
    trace = import_files([one], world_size=4).trace
    assert trace.world_size == 4 and trace.programs[0].ranks == (0, 1, 2, 3)


def test_truncated_file_and_unmatched_send_are_errors_not_tracebacks(tmp_path, capsys):
    text = json.dumps(step(0))
    cut = write(tmp_path, "rank0.json", text[: len(text) // 2])
    assert main(["trace", "import", str(cut), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err and "rank0.json" in err
    send = kineto(0, 2, [_op("c10d::send", 0, 5, [[[10]]], ["TensorList"],
                             **{"Concrete Inputs": ["", "", "1", "0"]})])
    recv = kineto(1, 2, [_op("aten::mm", 0, 5, [[2, 2], [2, 2]], ["float", "float"])])
    files = [write(tmp_path, "a0.json", send), write(tmp_path, "a1.json", recv)]
    with pytest.raises(SpecError, match="rank 0 sends 1 messages to rank 1, which receives 0"):
        import_files(files)


def test_send_and_recv_pair_up(tmp_path):
    send = kineto(0, 2, [_op("c10d::send", 0, 5, [[[10]]], ["TensorList"],
                             **{"Concrete Inputs": ["", "", "1", "0"]})])
    recv = kineto(1, 2, [_op("c10d::recv_", 0, 5, [[[10]]], ["TensorList"],
                             **{"Concrete Inputs": ["", "", "0", "0"]})])
    trace = import_files([write(tmp_path, "a0.json", send), write(tmp_path, "a1.json", recv)]).trace
    s, r = trace.programs[0].ops[0], trace.programs[1].ops[0]
    assert isinstance(s, SendOp) and isinstance(r, RecvOp) and (s.peer, r.peer) == (1, 0)
    assert s.bytes == r.bytes == 40 and s.tag == r.tag == 0


def test_gpu_trace_streams_nccl_and_memcpy(tmp_path):
    """CUDA: compute kernels, an NCCL kernel sized by its record_param_comms, a copy."""
    ev = [_op("aten::mm", 0, 20, [[64, 64], [64, 64]], ["c10::BFloat16"] * 2, **{"External id": 1}),
          _op("cudaLaunchKernel", 5, 3, cat="cuda_runtime", correlation=10),
          _op("record_param_comms", 30, 10, **{"Collective name": "allreduce",
                                               "In msg nelems": 1024, "Out msg nelems": 1024,
                                               "dtype": "BFloat16", "Process Group Ranks": "[0]"}),
          _op("cudaLaunchKernel", 32, 3, cat="cuda_runtime", correlation=11),
          _op("sm90_gemm", 10, 40, cat="kernel", stream=7, correlation=10, **{"External id": 1}),
          _op("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 30, cat="kernel", stream=20,
              correlation=11),
          _op("Memcpy HtoD (Pageable -> Device)", 90, 5, cat="gpu_memcpy", bytes=4096),
          _op("sm90_gemm", 100, 40, cat="kernel", stream=7, correlation=12)]
    data = kineto(0, 1, ev, deviceProperties=[{"name": "NVIDIA H100 80GB HBM3"}])
    trace = import_files([write(tmp_path, "gpu.json", data)]).trace
    kinds = [type(o).__name__ for o in trace.programs[0].ops]
    assert kinds.count("CollectiveOp") == 1 and "CopyOp" in kinds
    coll = next(o for o in trace.programs[0].ops if isinstance(o, CollectiveOp))
    assert coll.bytes == 2048
    gemm = trace.programs[0].ops[0]
    assert gemm.kernels[0].flops == 2 * 64 ** 3 and gemm.measured_s == pytest.approx(40e-6)
    assert trace.meta["source"]["device"] == "NVIDIA H100 80GB HBM3"
    # Re-timed for an A100: slower by the ratio of the two devices' modelled GEMM times.
    catalog = load_catalog()
    h100, a100 = (ComputeModel(catalog.device(n)) for n in ("h100-sxm", "a100-80gb"))
    ratio = a100.kernels_time(gemm.kernels) / h100.kernels_time(gemm.kernels)
    assert RetimedCompute(a100, h100).op_time(gemm) == pytest.approx(gemm.measured_s * ratio)
    assert ratio > 1.2


@pytest.mark.parametrize("damage, code", [
    (lambda d: d["distributedInfo"].update(rank="zero"), 2),
    (lambda d: d.update(traceEvents={"a": 1}), 2),
    (lambda d: d["traceEvents"][0].update(ts="soon"), 2),
    # Unreadable shapes leave the op without kernels; a stray value is skipped.
    (lambda d: d["traceEvents"][0]["args"].update({"Input Dims": "512x256"}), 0),
    (lambda d: d["traceEvents"].append("not an event"), 0),
])
def test_damaged_fields_are_one_line_errors(damage, code, tmp_path, capsys):
    data = step(0, world=1, allreduces=0)
    damage(data)
    path = write(tmp_path, "rank0.json", data)
    assert main(["trace", "import", str(path), "--out", str(tmp_path / "t.json")]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and (code == 0 or "rank0.json" in err)

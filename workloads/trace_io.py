"""Trace <-> JSON. The JSON mirrors the dataclasses of ``workloads.trace`` (schema v1):

``{"version": 1, "world_size": N, "model_flops": F, "tokens": T, "meta": {...},
  "group_sets": {name: [[ranks...], ...]},
  "programs": [{"name", "ranks", "static_memory_bytes", "peak_memory_bytes",
                "ops": [{"type": "compute"|"collective"|"send"|"recv"|"copy"|"memory", "id",
                         "name", "stream", "deps", ...type-specific fields}]}]}``
Compute ops carry their kernels (name, op_class, flops, bytes, m, n, k, batch, dtype,
launches).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustersim.hardware_specs import Dtype, OpClass, SpecError
from clustersim.hardware_specs.textfile import load_json
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, Dispatcher, GroupSet, HostOp,
    MemoryOp, Op, Phase, Program, RecvOp, SendOp, Stream, TokenRouting, Trace, validate,
)

_TYPE = {ComputeOp: "compute", CollectiveOp: "collective", SendOp: "send", RecvOp: "recv",
         CopyOp: "copy", HostOp: "host", MemoryOp: "memory"}


def _kernel_dict(k: Kernel) -> dict:
    out = {"name": k.name, "op_class": k.op_class.value, "flops": k.flops, "bytes": k.bytes,
           "m": k.m, "n": k.n, "k": k.k, "batch": k.batch, "dtype": k.dtype.value}
    return (out | ({"launches": k.launches} if k.launches != 1 else {})
            | ({"exps": k.exps} if k.exps else {})
            | ({"diagonals": k.diagonals} if k.diagonals != 1 else {}))


def op_to_dict(op: Op) -> dict:
    """One op as JSON (also what the Chakra export keeps of fields Chakra has no place for)."""
    out: dict[str, Any] = {"type": _TYPE[type(op)], "id": op.id, "name": op.name,
                           "stream": op.stream.value, "deps": list(op.deps)}
    if isinstance(op, ComputeOp):
        out.update(phase=op.phase.value, kernels=[_kernel_dict(k) for k in op.kernels])
        if op.measured_s is not None:
            out["measured_s"] = op.measured_s
    elif isinstance(op, CollectiveOp):
        out.update(kind=op.kind.value, bytes=op.bytes, group=op.group,
                   per_rank_copies=op.per_rank_copies)
        if op.routing is not None:
            r = op.routing
            out["routing"] = {"dispatcher": r.dispatcher.value, "tokens": r.tokens,
                              "token_bytes": r.token_bytes, "top_k": r.top_k,
                              "experts": r.experts, "groups": r.groups,
                              "groups_per_token": r.groups_per_token, "sms": r.sms}
    elif isinstance(op, (SendOp, RecvOp)):
        out.update(group=op.group, peer=op.peer, bytes=op.bytes, tag=op.tag)
    elif isinstance(op, CopyOp):
        out.update(kind=op.kind.value, bytes=op.bytes)
    elif isinstance(op, HostOp):
        out.update(launches=op.launches)
    elif isinstance(op, MemoryOp):
        out.update(delta_bytes=op.delta_bytes)
    return out


def trace_to_dict(trace: Trace) -> dict:
    return {
        "version": trace.version, "world_size": trace.world_size,
        "model_flops": trace.model_flops, "tokens": trace.tokens, "meta": dict(trace.meta),
        "group_sets": {n: [list(g) for g in gs.groups] for n, gs in trace.group_sets.items()},
        "programs": [{"name": p.name, "ranks": list(p.ranks),
                      "static_memory_bytes": p.static_memory_bytes,
                      "peak_memory_bytes": p.peak_memory_bytes,
                      "ops": [op_to_dict(op) for op in p.ops]} for p in trace.programs],
    }


def _kernel(d: dict) -> Kernel:
    return Kernel(d["name"], OpClass(d["op_class"]), float(d["flops"]), float(d["bytes"]),
                  int(d.get("m", 0)), int(d.get("n", 0)), int(d.get("k", 0)),
                  int(d.get("batch", 1)), Dtype(d.get("dtype", "bf16")),
                  int(d.get("launches", 1)), float(d.get("exps", 0.0)),
                  int(d.get("diagonals", 1)))


def _routing(d: dict | None) -> TokenRouting | None:
    if d is None:
        return None
    return TokenRouting(dispatcher=Dispatcher(d["dispatcher"]), tokens=float(d["tokens"]),
                        token_bytes=float(d["token_bytes"]), top_k=int(d["top_k"]),
                        experts=int(d["experts"]), groups=int(d.get("groups", 1)),
                        groups_per_token=int(d.get("groups_per_token", 1)),
                        sms=int(d.get("sms", 0)))


def op_from_dict(d: dict) -> Op:
    """The inverse of :func:`op_to_dict`."""
    common = dict(id=int(d["id"]), name=str(d["name"]), deps=tuple(int(x) for x in d.get("deps", [])))
    kind = d["type"]
    if kind == "compute":
        return ComputeOp(phase=Phase(d["phase"]), kernels=tuple(_kernel(k) for k in d["kernels"]),
                         stream=Stream(d.get("stream", "compute")),
                         measured_s=None if d.get("measured_s") is None else float(d["measured_s"]),
                         **common)
    if kind == "collective":
        return CollectiveOp(kind=CollectiveKind(d["kind"]), bytes=float(d["bytes"]),
                            group=str(d["group"]), stream=Stream(d["stream"]),
                            per_rank_copies=bool(d.get("per_rank_copies", False)),
                            routing=_routing(d.get("routing")), **common)
    if kind in ("send", "recv"):
        cls = SendOp if kind == "send" else RecvOp
        return cls(group=str(d["group"]), peer=int(d["peer"]), bytes=float(d["bytes"]),
                   tag=int(d["tag"]), stream=Stream(d.get("stream", Stream.PP.value)), **common)
    if kind == "copy":
        return CopyOp(kind=CopyKind(d["kind"]), bytes=float(d["bytes"]),
                      stream=Stream(d.get("stream", "copy")), **common)
    if kind == "host":
        return HostOp(launches=int(d["launches"]), **common)
    if kind == "memory":
        return MemoryOp(delta_bytes=float(d["delta_bytes"]),
                        stream=Stream(d.get("stream", "compute")), **common)
    raise SpecError("trace.op.type", f"unknown op type {kind!r}")


def trace_from_dict(data: dict) -> Trace:
    if not isinstance(data, dict):
        raise SpecError("trace", f"expected a JSON object with world_size, programs and "
                                 f"group_sets, got {type(data).__name__}")
    try:
        trace = Trace(
            world_size=int(data["world_size"]),
            programs=tuple(Program(p["name"], tuple(int(r) for r in p["ranks"]),
                                   tuple(op_from_dict(o) for o in p["ops"]),
                                   float(p.get("static_memory_bytes", 0.0)),
                                   float(p.get("peak_memory_bytes", 0.0)))
                           for p in data["programs"]),
            group_sets={n: GroupSet(n, tuple(tuple(int(r) for r in g) for g in groups))
                        for n, groups in data["group_sets"].items()},
            model_flops=float(data.get("model_flops", 0.0)),
            tokens=float(data.get("tokens", 0.0)),
            meta=dict(data.get("meta", {})),
            version=int(data.get("version", 0)),
        )
    except KeyError as err:
        raise SpecError("trace", f"malformed trace JSON: missing key {err}") from None
    except (TypeError, ValueError) as err:
        raise SpecError("trace", f"malformed trace JSON: {err}") from None
    return validate(trace)


def save_trace(trace: Trace, path: Path) -> None:
    path.write_text(json.dumps(trace_to_dict(trace)))


def load_trace(path: Path) -> Trace:
    data = load_json(path, "trace")
    try:
        return trace_from_dict(data)
    except SpecError as err:
        raise SpecError(err.field, f"{path}: {err.message}") from None

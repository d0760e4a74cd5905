"""Chakra execution traces (MLCommons, ``schema/protobuf/et_def.proto``) in JSON -> a Trace.

Two JSON forms are read, one file per rank (``NAME.<rank>.json``):
- the feeder form (``{"workload_graph": [{"Id", "Name", "NodeType", "data_deps", "runtime",
  "is_cpu_op", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag"}]}``) that
  Chakra's JSON feeder reads, which :mod:`chakra_export` writes;
- the protobuf messages as JSON (Chakra's ``jsonizer``: a GlobalMetadata object, then one
  object per node with ``id``, ``name``, ``type``, ``ctrlDeps``/``dataDeps``,
  ``durationMicros`` and typed ``attr`` entries), concatenated or as a list.

Node types (et_def.proto ``NodeType``): COMP_NODE (4) is a compute op timed by its recorded
duration (``runtime``/``duration_micros``, microseconds) and re-timed by its ``num_ops`` and
``tensor_size``; COMM_COLL_NODE (7) a collective (``comm_type`` from ``CollectiveCommType``,
``comm_size`` bytes); COMM_SEND_NODE/COMM_RECV_NODE (5, 6) point-to-point with ``comm_src``,
``comm_dst``, ``comm_tag``; MEM_LOAD/MEM_STORE (2, 3) host<->device copies; METADATA (1) is
skipped. Dependencies: data and control edges; nodes run in a topological order (ties by id),
compute nodes one at a time (as ASTRA-sim's single compute resource does), collectives on one
communication stream. A node whose dependency the file lacks, or a cycle, is an error naming it.
A collective without ``comm_size`` cannot be re-costed: it keeps its recorded duration (a
warning says how many).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping, Sequence

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads.axes import Axis
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, GroupSet, Op, Phase, Program,
    RecvOp, SendOp, Stream, Trace, validate,
)
from clustersim.workloads.trace_io import op_from_dict

NODE_TYPES = {"METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3, "COMP_NODE": 4,
              "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COMM_TYPES = {0: CollectiveKind.ALL_REDUCE, 2: CollectiveKind.ALL_GATHER,
              5: CollectiveKind.BROADCAST, 6: CollectiveKind.ALL_TO_ALL,
              7: CollectiveKind.REDUCE_SCATTER, 8: CollectiveKind.REDUCE_SCATTER}
"""et_def.proto ``CollectiveCommType`` -> ours (REDUCE, GATHER, SCATTER, BARRIER: none)."""
COMM_TYPE_NAMES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
                   "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7,
                   "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
EXTENSION = "clustersim"
"""Top-level key of our own additions (ignored by Chakra's feeder): stream, kernels, groups."""
OWN_OP = "clustersim_op"
"""Node key with our op's own fields (stream, kernels, phase, routing...), for an exact return."""
US = 1e-6


def parse_objects(text: str, file: str) -> list:
    """One JSON value, or several concatenated (the jsonizer writes one per message)."""
    decoder, pos, out = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise SpecError(file, f"not JSON at character {err.pos}: {err.msg} "
                            "(truncated file?)") from None
        out.append(value)


def _attr_value(a: Mapping):
    for key, v in a.items():
        if key in ("name", "docString", "doc_string"):
            continue
        if isinstance(v, Mapping) and "values" in v:
            return v["values"]
        return v
    return None


def _normalise(node: Mapping, file: str) -> dict:
    """Either JSON form -> {id, name, type, data, ctrl, runtime_us, attrs...}."""
    if "Id" in node or "NodeType" in node:
        out = {"id": node.get("Id"), "name": str(node.get("Name", "")),
               "type": node.get("NodeType"), "data": node.get("data_deps", []),
               "ctrl": node.get("ctrlDeps", node.get("ctrl_deps", [])),
               "runtime_us": node.get("runtime")}
        attrs = {k: v for k, v in node.items() if k not in ("Id", "Name", "NodeType", "data_deps",
                                                              "ctrlDeps", "ctrl_deps", "runtime")}
    else:
        out = {"id": node.get("id"), "name": str(node.get("name", "")), "type": node.get("type"),
               "data": node.get("dataDeps", node.get("data_deps", [])),
               "ctrl": node.get("ctrlDeps", node.get("ctrl_deps", [])),
               "runtime_us": node.get("durationMicros", node.get("duration_micros"))}
        attrs = {str(a.get("name")): _attr_value(a) for a in node.get("attr", [])
                 if isinstance(a, Mapping)}
    try:
        out["id"] = int(out["id"])
        t = out["type"]
        out["type"] = NODE_TYPES[t] if isinstance(t, str) else int(t)
        out["data"] = [int(d) for d in out["data"] or []]
        out["ctrl"] = [int(d) for d in ([out["ctrl"]] if isinstance(out["ctrl"], (int, str))
                                        else out["ctrl"] or [])]
        out["runtime_us"] = None if out["runtime_us"] is None else float(out["runtime_us"])
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"{file}: node {node.get('Id', node.get('id'))!r}",
                        "expected an integer id, a node type and integer dependencies") from None
    out["attrs"] = attrs
    return out


def read_nodes(text: str, file: str) -> tuple[list[dict], dict]:
    """The nodes of one rank's file, and our extension block (empty for foreign files)."""
    values = parse_objects(text, file)
    if len(values) == 1 and isinstance(values[0], Mapping) and "workload_graph" in values[0]:
        graph = values[0]["workload_graph"]
        ext = values[0].get(EXTENSION, {})
    else:
        flat = [v for x in values for v in (x if isinstance(x, list) else [x])]
        graph = [v for v in flat if isinstance(v, Mapping) and ("id" in v or "type" in v)]
        ext = {}
    if not isinstance(graph, list) or not graph:
        raise SpecError(file, "no Chakra nodes (expected workload_graph or node objects)")
    return [_normalise(n, file) for n in graph if isinstance(n, Mapping)], ext


def _order(nodes: list[dict], file: str) -> list[dict]:
    """Topological order, ties by id; missing dependencies and cycles are errors."""
    by_id = {}
    for n in nodes:
        if n["id"] in by_id:
            raise SpecError(f"{file}: node {n['id']}", "appears twice")
        by_id[n["id"]] = n
    for n in nodes:
        for d in n["data"]:
            if d not in by_id:
                raise SpecError(f"{file}: node {n['id']} ({n['name'][:60]})", f"depends on node "
                                f"{d}, which the file does not contain (truncated trace?)")
        n["ctrl"] = [d for d in n["ctrl"] if d in by_id]
    waiting = {n["id"]: len(set(n["data"]) | set(n["ctrl"])) for n in nodes}
    users: dict[int, list[int]] = {}
    for n in nodes:
        for d in set(n["data"]) | set(n["ctrl"]):
            users.setdefault(d, []).append(n["id"])
    ready = [i for i, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(by_id[i])
        for u in users.get(i, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):
        stuck = min(i for i, w in waiting.items() if w > 0)
        raise SpecError(f"{file}: node {stuck} ({by_id[stuck]['name'][:60]})",
                        "is part of a dependency cycle")
    return out


def _int(n: dict, key: str, default=None):
    v = n["attrs"].get(key, default)
    return None if v is None else int(float(v))


def _compute(n: dict, deps, position: int, stream: Stream) -> ComputeOp:
    a = n["attrs"]
    if a.get("num_ops") or a.get("tensor_size"):
        flops, nbytes = float(a.get("num_ops") or 0), float(a.get("tensor_size") or 0)
        cls = OpClass(a["op_class"]) if "op_class" in a else (
            OpClass.MATMUL if flops else OpClass.ELEMENTWISE)
        kernels = (Kernel(n["name"], cls, flops, nbytes),)
    else:
        kernels = ()
    measured = None if n["runtime_us"] is None else n["runtime_us"] * US
    if not kernels and measured is None:
        measured = 0.0
    return ComputeOp(position, n["name"], Phase(a.get("phase", "forward")), kernels, deps,
                     stream, measured_s=measured)


def program_from_nodes(nodes: list[dict], ext: Mapping, rank: int, file: str,
                       warnings: list[str]) -> tuple[list[Op], set[str]]:
    """Ops of one rank in topological order; the group sets they name."""
    ordered = _order(nodes, file)
    position = {n["id"]: i for i, n in enumerate(ordered)}
    ops: list[Op] = []
    used: set[str] = set()
    unsized = 0
    for i, n in enumerate(ordered):
        a = n["attrs"]
        stream_of = a.get(OWN_OP, {}).get("stream") if isinstance(a.get(OWN_OP), Mapping) \
            else None
        previous = a.get("stream_predecessor")
        deps = sorted({position[d] for d in n["data"]} |
                      {position[d] for d in n["ctrl"] if stream_of is None or d != previous})
        deps = tuple(deps)
        where = f"{file}: node {n['id']} ({n['name'][:60]})"
        t = n["type"]
        own = a.get(OWN_OP)
        if isinstance(own, Mapping):
            op = op_from_dict({**own, "id": i, "name": n["name"], "deps": list(deps)})
            if isinstance(op, (CollectiveOp, SendOp, RecvOp)):
                used.add(op.group)
            ops.append(op)
        elif t == 1:
            ops.append(ComputeOp(i, n["name"], Phase.FORWARD, (), deps, measured_s=0.0))
        elif t == 4 or (t in (5, 6, 7) and not a.get("comm_size")):
            unsized += t != 4
            stream = Stream(stream_of) if stream_of else (Stream.COMPUTE if t == 4 else Stream.DP)
            ops.append(_compute(n, deps, i, stream))
        elif t == 7:
            kind = COMM_TYPES.get(_int(n, "comm_type", 0))
            if kind is None:
                raise SpecError(where, f"collective type {a.get('comm_type')} (et_def.proto "
                                "CollectiveCommType) has no counterpart here")
            group = str(a.get("comm_group", Axis.DP.value))
            used.add(group)
            ops.append(CollectiveOp(i, n["name"], kind, float(a["comm_size"]), group,
                                    Stream(stream_of or Stream.DP.value), deps))
        elif t in (5, 6):
            send = t == 5
            peer = _int(n, "comm_dst" if send else "comm_src")
            if peer is None:
                raise SpecError(where, "a send/recv without comm_dst/comm_src")
            group = str(a.get("comm_group", "world"))
            used.add(group)
            cls = SendOp if send else RecvOp
            ops.append(cls(i, n["name"], group, peer, float(a["comm_size"]),
                           _int(n, "comm_tag", 0), Stream(stream_of or "pp"), deps))
        elif t in (2, 3):
            kind = CopyKind.HOST_TO_DEVICE if t == 2 else CopyKind.DEVICE_TO_HOST
            ops.append(CopyOp(i, n["name"], kind, float(a.get("tensor_size") or 0.0),
                              Stream(stream_of or "copy"), deps))
        else:
            raise SpecError(where, f"unknown node type {t}")
    if unsized:
        warnings.append(f"{file}: {unsized} communication nodes carry no comm_size: they keep "
                        "their recorded duration and are not re-costed on the target network")
    return ops, used


def trace_from_chakra(files: Sequence[tuple[str, str]], *, world_size: int | None = None,
                      meta: dict | None = None, warnings: list[str] | None = None) -> Trace:
    """``files``: (name, text) per rank, in rank order unless their extension names ranks."""
    warnings = warnings if warnings is not None else []
    programs, group_sets, ext0 = [], {}, {}
    covered: list[int] = []
    for index, (name, text) in enumerate(files):
        nodes, ext = read_nodes(text, name)
        ext0 = ext0 or ext
        ranks = tuple(int(r) for r in ext.get("ranks", [index]))
        ops, used = program_from_nodes(nodes, ext, ranks[0], name, warnings)
        programs.append(Program(str(ext.get("program", f"rank{ranks[0]}")), ranks, tuple(ops),
                                float(ext.get("static_memory_bytes", 0.0)),
                                float(ext.get("peak_memory_bytes", 0.0))))
        covered += ranks
        for g, groups in ext.get("group_sets", {}).items():
            group_sets[g] = GroupSet(g, tuple(tuple(int(r) for r in x) for x in groups))
        for g in used - set(group_sets):
            group_sets[g] = None
    world = int(ext0.get("world_size", 0)) or world_size or len(files)
    if world_size is not None and not ext0:
        if len(files) != 1:
            raise SpecError("--world-size", "stands for one rank's file of a symmetric job")
        programs = [Program(programs[0].name, tuple(range(world)), programs[0].ops)]
    elif not ext0 and len(files) < world:
        raise SpecError(files[0][0], f"{len(files)} files for {world} ranks")
    for g in [g for g, v in group_sets.items() if v is None]:
        group_sets[g] = GroupSet(g, (tuple(range(world)),))
    out = Trace(world_size=world, programs=tuple(programs), group_sets=group_sets,
                model_flops=float(ext0.get("model_flops", 0.0)),
                tokens=float(ext0.get("tokens", 0.0)),
                meta=dict(meta or ext0.get("meta", {})))
    return validate(out)

"""Our Trace -> Chakra JSON in the feeder form (one file per program, or per rank), so
ASTRA-sim users can run the same workload in both simulators.

Each op becomes a node of the matching et_def.proto type with Chakra's own fields: compute ops
COMP_NODE with ``num_ops`` (FLOPs) and ``tensor_size`` (bytes) and, for a measured op, its
``runtime`` in microseconds; collectives COMM_COLL_NODE with ``comm_type`` and ``comm_size``;
sends and receives COMM_SEND_NODE/COMM_RECV_NODE with ``comm_src``, ``comm_dst``, ``comm_tag``;
copies MEM_LOAD_NODE/MEM_STORE_NODE; memory events METADATA_NODE. Our dependencies are
``data_deps``; a stream's order is a ``ctrlDeps`` edge to the op before it on the stream
(except the pp stream, whose sends and receives are posted as soon as their data is ready).
Fields Chakra has no place for (streams, kernel shapes, routing) ride along under
``clustersim_op``, and the group sets under the file's ``clustersim`` key; Chakra's feeder
ignores both, and our importer reads them back exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

from clustersim.hardware_specs import SpecError
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, HostOp, MemoryOp, Op, Program,
    RecvOp, SendOp, Stream, Trace,
)
from clustersim.workloads.trace_import.chakra import COMM_TYPE_NAMES, EXTENSION, NODE_TYPES, OWN_OP
from clustersim.workloads.trace_io import op_to_dict

COMM_TYPE_OF = {CollectiveKind.ALL_REDUCE: "ALL_REDUCE", CollectiveKind.ALL_GATHER: "ALL_GATHER",
                CollectiveKind.REDUCE_SCATTER: "REDUCE_SCATTER",
                CollectiveKind.ALL_TO_ALL: "ALL_TO_ALL", CollectiveKind.BROADCAST: "BROADCAST",
                CollectiveKind.RING_EXCHANGE: "ALL_TO_ALL"}
MAX_FILES = 4096
"""More files than this is a mistake (every rank of a 10k-GPU job): export per program."""


def _node(op: Op, ctrl: list[int]) -> dict:
    node = {"Id": op.id, "Name": op.name, "data_deps": list(op.deps), "ctrlDeps": ctrl}
    own = {k: v for k, v in op_to_dict(op).items() if k not in ("id", "name", "deps")}
    if isinstance(op, ComputeOp):
        node.update(NodeType=NODE_TYPES["COMP_NODE"], is_cpu_op=False,
                    num_ops=int(op.flops), tensor_size=int(sum(k.bytes for k in op.kernels)))
        if op.measured_s is not None:
            node["runtime"] = round(op.measured_s * 1e6)
    elif isinstance(op, CollectiveOp):
        node.update(NodeType=NODE_TYPES["COMM_COLL_NODE"], is_cpu_op=False,
                    comm_type=COMM_TYPE_NAMES[COMM_TYPE_OF[op.kind]], comm_size=int(op.bytes))
    elif isinstance(op, (SendOp, RecvOp)):
        send = isinstance(op, SendOp)
        node.update(NodeType=NODE_TYPES["COMM_SEND_NODE" if send else "COMM_RECV_NODE"],
                    is_cpu_op=False, comm_size=int(op.bytes), comm_tag=op.tag,
                    comm_src=-1 if send else op.peer, comm_dst=op.peer if send else -1)
    elif isinstance(op, CopyOp):
        load = op.kind is CopyKind.HOST_TO_DEVICE
        node.update(NodeType=NODE_TYPES["MEM_LOAD_NODE" if load else "MEM_STORE_NODE"],
                    is_cpu_op=False, tensor_size=int(op.bytes))
    elif isinstance(op, HostOp):  # the host's own work: a CPU compute node
        node.update(NodeType=NODE_TYPES["COMP_NODE"], is_cpu_op=True)
    elif isinstance(op, MemoryOp):
        node.update(NodeType=NODE_TYPES["METADATA_NODE"], is_cpu_op=False)
    node[OWN_OP] = own
    return node


def program_nodes(program: Program) -> list[dict]:
    last: dict[Stream, int] = {}
    nodes = []
    for op in program.ops:
        before = last.get(op.stream)
        ctrl = [] if op.stream is Stream.PP or before is None else [before]
        node = _node(op, ctrl)
        if ctrl:
            node["stream_predecessor"] = before
        nodes.append(node)
        last[op.stream] = op.id
    return nodes


def to_chakra(trace: Trace, program: Program) -> dict:
    return {"workload_graph": program_nodes(program), EXTENSION: {
        "world_size": trace.world_size, "program": program.name, "ranks": list(program.ranks),
        "static_memory_bytes": program.static_memory_bytes,
        "peak_memory_bytes": program.peak_memory_bytes,
        "group_sets": {n: [list(g) for g in gs.groups] for n, gs in trace.group_sets.items()},
        "model_flops": trace.model_flops, "tokens": trace.tokens, "meta": dict(trace.meta)}}


def export_chakra(trace: Trace, folder: Path, stem: str = "chakra",
                  every_rank: bool = False) -> list[Path]:
    """Write ``folder/stem.<rank>.json``: one per program (named by its first rank), or one per
    rank (``every_rank``, the layout ASTRA-sim reads). Returns the files written."""
    count = trace.world_size if every_rank else len(trace.programs)
    if count > MAX_FILES:
        raise SpecError("--every-rank", f"would write {count} files (over {MAX_FILES}); "
                        "export one file per program instead")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for program in trace.programs:
        ranks = program.ranks if every_rank else program.ranks[:1]
        for r in ranks:
            data = to_chakra(trace, program)
            if every_rank:
                data[EXTENSION]["ranks"] = [r]
            path = folder / f"{stem}.{r}.json"
            path.write_text(json.dumps(data))
            written.append(path)
    return written

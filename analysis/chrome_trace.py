"""Chrome/Perfetto trace export: a process per rank class, a thread per stream it used.

Format: the Trace Event Format's JSON object form (``{"traceEvents": [...]}``) with complete
events (``ph: "X"``, ``ts``/``dur`` in microseconds, ``args`` shown when an event is selected)
and metadata events naming processes and threads, as chrome://tracing and Perfetto's JSON
importer read it. Only streams that ran something get a track.
"""

from __future__ import annotations

import json
from pathlib import Path

from clustersim.simulator.result import StepResult
from clustersim.workloads.trace import (
    CollectiveOp, ComputeOp, CopyOp, HostOp, Op, RecvOp, SendOp, Stream, Trace,
)

STREAM_ORDER = tuple(s.value for s in Stream)
"""Threads of a rank class in display order: compute, one per parallel axis, host copies, the
host's kernel issue."""

TRACK_NAMES = {Stream.COMPUTE.value: "compute", Stream.PP.value: "PP send/recv",
               Stream.COPY.value: "host copies (offload)", Stream.HOST.value: "host issue (eager)",
               **{s.value: f"{s.value.upper()} communication" for s in Stream
                  if s not in (Stream.COMPUTE, Stream.PP, Stream.COPY, Stream.HOST)}}


def op_args(op: Op, trace: Trace) -> dict:
    """What Perfetto shows for a selected event: FLOPs and HBM traffic of compute, bytes and
    group of a transfer."""
    if isinstance(op, ComputeOp):
        return {"phase": op.phase.value, "gflop": round(op.flops / 1e9, 3),
                "hbm_mb": round(sum(k.bytes for k in op.kernels) / 1e6, 3),
                "kernels": len(op.kernels)}
    if isinstance(op, CollectiveOp):
        size = len(trace.group_sets[op.group].groups[0])
        return {"collective": op.kind.value, "bytes": op.bytes, "group": op.group,
                "group_size": size}
    if isinstance(op, (SendOp, RecvOp)):
        return {"bytes": op.bytes, "group": op.group, "peer_position": op.peer}
    if isinstance(op, CopyOp):
        return {"copy": op.kind.value, "bytes": op.bytes}
    if isinstance(op, HostOp):
        return {"launches": op.launches}
    return {}


def chrome_trace(result: StepResult, trace: Trace | None = None) -> dict:
    """The step as a Trace Event Format object; with ``trace`` each event carries its op's
    FLOPs or bytes and group as ``args``."""
    tids = {s: i for i, s in enumerate(STREAM_ORDER)}
    programs = {c.index: c.program for c in result.classes}
    ops = {p.name: p.ops for p in trace.programs} if trace is not None else {}
    events: list[dict] = []
    used: set[tuple[int, str]] = set()
    for r in result.records:
        event = {"ph": "X", "name": r.name, "cat": r.category, "pid": r.rank_class,
                 "tid": tids.get(r.stream, len(STREAM_ORDER)),
                 "ts": r.start * 1e6, "dur": max(0.0, (r.end - r.start) * 1e6)}
        program_ops = ops.get(programs.get(r.rank_class))
        if program_ops is not None:
            event["args"] = op_args(program_ops[r.op_id], trace)
        events.append(event)
        used.add((r.rank_class, r.stream))
    meta: list[dict] = []
    for c in result.classes:
        meta.append({"ph": "M", "name": "process_name", "pid": c.index, "tid": 0,
                     "args": {"name": f"{c.program} x{c.ranks} (class {c.index}, "
                                      f"rank {c.representative})"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": c.index, "tid": 0,
                     "args": {"sort_index": c.index}})
        for stream in STREAM_ORDER:
            if (c.index, stream) in used:
                meta.append({"ph": "M", "name": "thread_name", "pid": c.index,
                             "tid": tids[stream], "args": {"name": TRACK_NAMES[stream]}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": result.step_time_s}}


def write_chrome_trace(result: StepResult, path: Path, trace: Trace | None = None) -> None:
    path.write_text(json.dumps(chrome_trace(result, trace)))

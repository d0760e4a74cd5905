"""Where a rank class's time went: its compute stream's idle gaps charged along the critical path.

Every instant the compute stream is idle is waiting for something. The gap before a compute op
is charged to the op that ended it (the dep or stream predecessor that finished last), the part
of that op's own wait before it was even ready to the op that held *it* back, and so on down the
chain. A collective or a send charges its axis (exposed TP/CP/EP/PP/DP communication); a recv
charges pipeline bubble while the matching send had not been posted and PP communication after;
a host copy charges offload, the host issuing kernels eagerly charges host; anything else is
"other". The parts sum to the class's finish time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from clustersim.simulator.records import ClassTimeline
from clustersim.simulator.result import AXES, Breakdown, charged_axis
from clustersim.workloads.trace import (
    CollectiveOp, CopyOp, HostOp, Op, Phase, RecvOp, SendOp, Stream,
)

_TINY_S = 1e-12
"""Gaps shorter than this are rounding, not waiting."""


def blocker(ops: Sequence[Op], timeline: ClassTimeline, op_id: int) -> int:
    """The dep (or stream predecessor) that finished last before ``op_id`` could start."""
    end = timeline.end_s
    best, latest = -1, -math.inf
    for d in ops[op_id].deps:  # the first of equal ends wins; the predecessor comes last
        if end[d] > latest:
            best, latest = d, end[d]
    previous = timeline.stream_predecessor[op_id]
    if previous >= 0 and (best < 0 or end[previous] > latest):
        best = previous
    return best


def _charge(ops: Sequence[Op], timeline: ClassTimeline, op_id: int, a: float, b: float,
            parts: dict[str, float]) -> None:
    """Charge the wait [a, b] to the op that ended it, and the part before that op was even
    ready to the op that held it back, and so on down the chain."""
    ready = timeline.ready_s
    while op_id >= 0 and b - a > _TINY_S:
        op = ops[op_id]
        own = max(a, ready[op_id])
        if own < b:
            if isinstance(op, RecvOp):
                posted = timeline.send_posted_s.get(op_id, own)
                waiting = min(max(posted - own, 0.0), b - own)
                parts["bubble"] += waiting
                parts[charged_axis(op)] += b - own - waiting
            elif isinstance(op, (CollectiveOp, SendOp)):
                parts[charged_axis(op)] += b - own
            elif isinstance(op, CopyOp):
                parts["offload"] += b - own
            elif isinstance(op, HostOp):
                parts["host"] += b - own
            else:
                parts["other"] += b - own
        b = min(b, ready[op_id])
        op_id = blocker(ops, timeline, op_id)
    if b - a > _TINY_S:
        parts["other"] += b - a


def breakdown(ops: Sequence[Op], timeline: ClassTimeline, until_s: float = math.inf) -> Breakdown:
    """The breakdown of one rank class's step (see the module docstring). With ``until_s``,
    only what its compute ops ending by then and the waits before them add (no tail): the
    part of the step up to that op, so two such prefixes differ by what happened between."""
    parts = {a: 0.0 for a in AXES} | {"bubble": 0.0, "offload": 0.0, "host": 0.0, "other": 0.0}
    compute = optimizer = 0.0
    prev_end = 0.0
    compute_stream = Stream.COMPUTE.value
    for rec in (r for r in timeline.records if r.stream == compute_stream):
        if rec.end > until_s:
            break
        if rec.start - prev_end > _TINY_S:
            _charge(ops, timeline, blocker(ops, timeline, rec.op_id), prev_end, rec.start, parts)
        busy = rec.end - rec.start
        if rec.category == Phase.OPTIMIZER.value:
            optimizer += busy
        else:
            compute += busy
        prev_end = rec.end
    finish = timeline.finish_s
    if until_s == math.inf and finish - prev_end > _TINY_S:
        end = timeline.end_s
        last = max(range(len(ops)), key=lambda i: end[i])
        _charge(ops, timeline, last, prev_end, finish, parts)
    exposed = {a: parts[a] for a in AXES}
    return Breakdown(compute, exposed, parts["bubble"], optimizer, parts["other"],
                     parts["offload"], parts["host"])

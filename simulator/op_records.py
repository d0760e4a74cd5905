"""A rank class's per-op records, drawn from when each op was ready and when it ended.

Every op starts when it is ready (its deps and its stream predecessor done: a collective waits
for its group, a send/recv for its peer, inside its own time), so a replay needs to keep only
the two times per op; the records are made once, when a timeline asks for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from clustersim.simulator.records import OpRecord
from clustersim.simulator.result import charged_axis
from clustersim.workloads.trace import (
    CollectiveOp, ComputeOp, HostOp, MemoryOp, Op, RecvOp, SendOp,
)


_END = attrgetter("end")


def category(op: Op) -> str:
    """What a record says an op was: a compute op's phase, a communication op's axis."""
    if isinstance(op, ComputeOp):
        return op.phase._value_  # the member's value (enum's documented sunder name), unwrapped
    if isinstance(op, (CollectiveOp, SendOp, RecvOp)):
        return charged_axis(op)
    if isinstance(op, HostOp):
        return "host"
    return "memory" if isinstance(op, MemoryOp) else "other"


def op_records(rank_class: int, ops: Sequence[Op], ready: Sequence[float],
               end: Sequence[float], every: bool) -> tuple[OpRecord, ...]:
    """Records of ``ops`` (of every op when ``every``, else of compute ops only) in the order
    they ended (op order on a tie)."""
    records = [OpRecord(rank_class, op.id, op.name, op.stream._value_, ready[op.id],
                        end[op.id], category(op))
               for op in ops if every or isinstance(op, ComputeOp)]
    records.sort(key=_END)
    return tuple(records)

"""Measured communication inside one node: alpha-beta fits by operation, from calibration.

Where a node's devices talk through something NCCL's latency tables do not describe (gloo over
loopback TCP or shared memory between CPU processes, say), ``clustersim calibrate fit`` times
each collective over message and world sizes and fits ``t = steps x latency + traffic /
bandwidth`` with the ring algorithm's steps and per-rank traffic (all-reduce: 2(n-1) steps and
2(n-1)/n of the buffer; all-gather and reduce-scatter: n-1 and (n-1)/n; send/recv: one step
and the whole message). Implementations differ by operation (gloo's all-gather is not its
all-reduce), hence one fit per operation.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.units import Quantity


class CommOp(enum.Enum):
    """Communication operations calibration measures (values match the trace's kinds)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


@dataclass(frozen=True, kw_only=True, slots=True)
class AlphaBeta:
    """One operation's fit: ``steps x latency_s + traffic / bandwidth``."""

    latency_s: float
    """Per algorithm step."""
    bandwidth: float
    """Bytes/s each rank moves along the ring."""

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "bandwidth": self.bandwidth}


def read_measured_comm(f: Fields) -> Mapping[CommOp, AlphaBeta]:
    """``{all_reduce: {latency: 150 us, bandwidth: 1.2 GB/s}, ...}``"""
    out = {}
    for op in CommOp:
        if f.has(op.value):
            g = f.sub(op.value)
            out[op] = AlphaBeta(latency_s=g.quantity("latency", Quantity.TIME, positive=False),
                                bandwidth=g.quantity("bandwidth", Quantity.BANDWIDTH))
            g.done()
    f.done()
    return out

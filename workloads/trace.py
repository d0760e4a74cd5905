"""The Trace: what every rank does in one training step, with no hardware in it (schema v1).

This is the contract between ``workloads`` (which emits traces) and ``simulator`` (which replays
them). Anything that produces a Trace - our generators, an imported profile - can be simulated.

- A **program** is the op list shared by a set of ranks (e.g. every rank of one pipeline
  stage); the simulator runs each distinct program once per rank class, with a multiplicity.
- **Ops** run on a **stream**. Ops of one stream run in list order (like a CUDA stream); ``deps``
  name ops (of the same program) that must finish first, usually on other streams. An op's id is
  its position in the program; deps point to earlier ops, so the graph is acyclic. Ops on the
  pp stream are the exception to stream order: each send/recv is posted as soon as its deps are
  done (non-blocking isend/irecv).
- **Group sets** partition the ranks along one axis (named after ``workloads.axes.Axis``; a
  collective's stream says which axis its time is charged to). A collective names the set;
  each rank takes part in the group of the set that contains it. A send/recv names the set and
  the peer's position in the rank's group (pp: the stage index).
- All sizes in bytes, all work in FLOPs. ``validate`` checks a trace before it is simulated.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from clustersim.hardware_specs import OpClass, SpecError
from clustersim.workloads.axes import Axis
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.dispatch import Dispatcher, TokenRouting

TRACE_VERSION = 1


class Stream(enum.Enum):
    """Where an op runs: the compute stream, one communication stream per parallel axis (named
    as the axis), or the host-copy stream."""

    COMPUTE = "compute"
    TP = Axis.TP.value
    CP = Axis.CP.value
    EP = Axis.EP.value
    PP = Axis.PP.value
    DP = Axis.DP.value
    SPATIAL = Axis.SPATIAL.value
    COPY = "copy"
    """Host <-> device copies (offload)."""
    HOST = "host"
    """The host thread issuing the rank's kernels in program order (eager runs only:
    ``HostOp``)."""

    @classmethod
    def of(cls, axis: Axis) -> Stream:
        """The communication stream of ``axis``."""
        return cls(axis.value)

    @property
    def axis(self) -> Axis | None:
        """The parallel axis whose communication runs here (None: compute, copies)."""
        return _AXIS_BY_VALUE.get(self.value)


_AXIS_BY_VALUE = {a.value: a for a in Axis}


class Phase(enum.Enum):
    """What a compute op is for; the step breakdown reports them apart."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"


class CollectiveKind(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    RING_EXCHANGE = "ring_exchange"
    """Every rank sends ``bytes`` to its ring successor and receives as much (ring attention)."""


class CopyKind(enum.Enum):
    DEVICE_TO_HOST = "d2h"
    HOST_TO_DEVICE = "h2d"
    HOST_COMPUTE = "host_compute"
    """Memory-bound work on the host (the offloaded optimizer step): ``bytes`` of host traffic."""


@dataclass(frozen=True, slots=True)
class ComputeOp:
    id: int
    name: str
    phase: Phase
    kernels: tuple[Kernel, ...]
    deps: tuple[int, ...] = ()
    stream: Stream = Stream.COMPUTE
    measured_s: float | None = None
    """Seconds the op took on the device that recorded it (an imported profile); the simulator
    re-times it for the target device (``simulator/cost/retimed.py``). None: timed from its
    kernels."""

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)


@dataclass(frozen=True, slots=True)
class CollectiveOp:
    """``bytes`` follows nccl-tests: the full buffer (all-reduce: the tensor; all-gather: the
    gathered output; reduce-scatter: the input; all-to-all: what one rank sends in all)."""

    id: int
    name: str
    kind: CollectiveKind
    bytes: float
    group: str
    stream: Stream
    deps: tuple[int, ...] = ()
    per_rank_copies: bool = False
    """The result lands in a list of per-rank tensors: one copy kernel per rank after the
    collective (PyTorch's all_gather with a tensor list, as DeepSpeed ZeRO-3 used it)."""
    routing: TokenRouting | None = None
    """Expert-parallel dispatch or combine (all-to-all): how its tokens fan out."""


@dataclass(frozen=True, slots=True)
class _PointToPoint:
    id: int
    name: str
    group: str
    peer: int
    """Position of the other side within this rank's group of ``group``."""
    bytes: float
    tag: int
    """Matches a send with its recv."""
    stream: Stream = Stream.PP
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SendOp(_PointToPoint):
    """Sends ``bytes`` to the peer; completes with the matching recv."""


@dataclass(frozen=True, slots=True)
class RecvOp(_PointToPoint):
    """Receives ``bytes`` from the peer."""


@dataclass(frozen=True, slots=True)
class CopyOp:
    id: int
    name: str
    kind: CopyKind
    bytes: float
    stream: Stream = Stream.COPY
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HostOp:
    """The host issuing the next op's ``launches`` kernels one by one, as eager PyTorch does
    without CUDA graphs. Host ops run in program order on the host stream, so the host runs
    ahead of the device freely; the op they issue depends on them. A host op's ``deps`` are
    device work the host waits for first: a device-to-host sync (dropless MoE routing reading
    its token counts)."""

    id: int
    name: str
    launches: int
    stream: Stream = Stream.HOST
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MemoryOp:
    """A change of live memory (positive: allocation, negative: free); takes no time."""

    id: int
    name: str
    delta_bytes: float
    stream: Stream = Stream.COMPUTE
    deps: tuple[int, ...] = ()


Op = ComputeOp | CollectiveOp | SendOp | RecvOp | CopyOp | HostOp | MemoryOp


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    ranks: tuple[int, ...]
    ops: tuple[Op, ...]
    static_memory_bytes: float = 0.0
    """Memory held for the whole step (weights, gradients, optimizer state, buffers, reserve)."""
    peak_memory_bytes: float = 0.0
    """Peak memory per device from the analytic memory model (static + activations)."""


@dataclass(frozen=True, slots=True)
class GroupSet:
    name: str
    groups: tuple[tuple[int, ...], ...]
    index: Mapping[int, int] = field(init=False, repr=False, compare=False)
    """rank -> position of its group in ``groups`` (derived)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {r: i for i, g in enumerate(self.groups) for r in g})

    def group_of(self, rank: int) -> tuple[int, ...]:
        return self.groups[self.index[rank]]


@dataclass(frozen=True, slots=True)
class Trace:
    world_size: int
    programs: tuple[Program, ...]
    group_sets: Mapping[str, GroupSet]
    model_flops: float = 0.0
    """Model FLOPs of the step (no recompute), for MFU."""
    tokens: float = 0.0
    """Tokens processed by the step."""
    meta: Mapping[str, object] = field(default_factory=dict)
    version: int = TRACE_VERSION

    def group_of(self, set_name: str, rank: int) -> tuple[int, ...]:
        return self.group_sets[set_name].group_of(rank)


def validate(trace: Trace) -> Trace:
    """Check a trace before simulating it: ranks covered once, groups partition consistently,
    deps point backwards to existing ops (so the op graph is acyclic), peers exist."""
    if trace.version != TRACE_VERSION:
        raise SpecError("trace.version", f"expected {TRACE_VERSION}, got {trace.version}")
    seen: dict[int, str] = {}
    for prog in trace.programs:
        for r in prog.ranks:
            if not 0 <= r < trace.world_size:
                raise SpecError(f"trace.programs.{prog.name}", f"rank {r} outside world size "
                                f"{trace.world_size}")
            if r in seen:
                raise SpecError(f"trace.programs.{prog.name}", f"rank {r} also in {seen[r]}")
            seen[r] = prog.name
    if len(seen) != trace.world_size:
        raise SpecError("trace.programs", f"cover {len(seen)} of {trace.world_size} ranks")
    for gs in trace.group_sets.values():
        members = [r for g in gs.groups for r in g]
        if len(members) != len(set(members)):
            raise SpecError(f"trace.group_sets.{gs.name}", "a rank appears in two groups")
    for prog in trace.programs:
        checked: set[str] = set()
        for position, op in enumerate(prog.ops):
            where = f"trace.programs.{prog.name}.op[{position}]"
            if op.id != position:
                raise SpecError(where, f"has id {op.id}; op ids must be their positions")
            for d in op.deps:
                if not 0 <= d < position:
                    raise SpecError(where, f"depends on op {d}, which does not come before it "
                                    "(dependencies must point backwards: the graph is acyclic)")
            if isinstance(op, (CollectiveOp, SendOp, RecvOp)):
                gs = trace.group_sets.get(op.group)
                if gs is None:
                    raise SpecError(where, f"names unknown group set {op.group!r}")
                if op.group not in checked:
                    checked.add(op.group)
                    missing = [r for r in prog.ranks if r not in gs.index]
                    if missing:
                        raise SpecError(where, f"rank {missing[0]} is in no group of {op.group!r}")
                if isinstance(op, (SendOp, RecvOp)):
                    size = len(gs.group_of(prog.ranks[0]))
                    if not 0 <= op.peer < size:
                        raise SpecError(where, f"peer {op.peer} outside group of size {size}")
    return trace


def kernel_classes(ops: Iterable[Op]) -> set[OpClass]:
    return {k.op_class for op in ops if isinstance(op, ComputeOp) for k in op.kernels}

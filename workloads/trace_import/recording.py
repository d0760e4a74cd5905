"""One rank's recorded step as a time-ordered list of items, the form every importer reduces
its format to before :mod:`assemble` turns the ranks into a Trace.

Times are seconds from any origin common to one rank (ranks need not share clocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.trace import CollectiveKind, CopyKind, Phase


@dataclass(frozen=True, kw_only=True, slots=True)
class ComputeItem:
    """A measured op on the compute stream (a top-level CPU op, or a GPU kernel)."""

    name: str
    start_s: float
    end_s: float
    kernels: tuple[Kernel, ...] = ()
    phase: Phase = Phase.FORWARD


@dataclass(frozen=True, kw_only=True, slots=True)
class _Communication:
    name: str
    bytes: float
    """nccl-tests convention for collectives (see ``trace.CollectiveOp``); the message for
    send/recv."""
    start_s: float
    """When the rank posted it."""
    end_s: float | None = None
    """When it completed on this rank, where the recording says so."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveItem(_Communication):
    kind: CollectiveKind
    ranks: tuple[int, ...]
    """Global ranks of its process group, in group order."""
    group_name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PointToPointItem(_Communication):
    send: bool
    peer: int
    """Global rank of the other side."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CopyItem:
    name: str
    kind: CopyKind
    bytes: float
    start_s: float
    end_s: float


Item = ComputeItem | CollectiveItem | PointToPointItem | CopyItem


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRecording:
    """What one rank did in the recorded step."""

    rank: int
    world_size: int
    """Ranks of the job, as the recording states it (1 when it does not)."""
    items: tuple[Item, ...]
    file: str
    """Where it came from (for error messages)."""
    facts: dict = field(default_factory=dict)
    """Provenance the format carries: device, framework, host, date."""

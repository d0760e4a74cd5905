"""The program of one pipeline stage while it is built: its op list, and what every parallel
strategy reads to emit its part (the job, the stage, one device's kernels)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from clustersim.workloads.axes import Axis
from clustersim.workloads.dispatch import TokenRouting
from clustersim.workloads.job import Job
from clustersim.workloads.layer_ops import Kernel, LayerOps
from clustersim.workloads.model import TransformerSpec
from clustersim.workloads.stages import StagePlan
from clustersim.workloads.strategy import Strategy
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, ComputeOp, CopyKind, CopyOp, HostOp, Op, Phase, RecvOp, SendOp,
    Stream,
)


@dataclass
class OpList:
    """Appends ops to one program, tracking the last compute op for dependencies. When
    ``eager``, each op's kernels are first issued by the host (a ``HostOp`` before it, which
    it depends on): the host issues them in program order."""

    ops: list[Op] = field(default_factory=list)
    last_compute: int | None = None
    eager: bool = False
    _graph: list[int] | None = None
    """Inside ``graph``: the host op that launches the graph, once the first op made it."""

    def _id(self) -> int:
        return len(self.ops)

    def _issued(self, name: str, launches: int, deps: tuple[int, ...],
                host_waits: tuple[int, ...] = ()) -> tuple[int, ...]:
        """``deps`` and, when eager, the host op that issues the next op's ``launches``
        kernels after waiting for ``host_waits`` (a device-to-host sync). Inside ``graph``
        the first op's host op launches the graph (one launch), and every later op of it
        follows that launch."""
        if not self.eager or not launches:
            return deps
        if self._graph:
            return deps + (self._graph[0],)
        op_id = self._id()
        self.ops.append(HostOp(op_id, f"{name}.issue",
                               1 if self._graph is not None else launches, deps=host_waits))
        if self._graph is not None:
            self._graph.append(op_id)
        return deps + (op_id,)

    @contextmanager
    def graph(self, captured: bool = True) -> Iterator[None]:
        """The ops emitted inside replay from one CUDA graph (when ``captured``): the host
        launches it once, whatever kernels and collectives it holds."""
        if not captured or self._graph is not None:
            yield
            return
        self._graph = []
        try:
            yield
        finally:
            self._graph = None

    def compute(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                deps: tuple[int, ...] = (), *, graphed: bool = False,
                host_waits: tuple[int, ...] = ()) -> int:
        """``graphed``: its kernels replay from one CUDA graph (one launch when eager); an
        eager host issues them after ``host_waits`` end (a device-to-host sync before them)."""
        launches = 1 if graphed else sum(k.launches for k in kernels)
        deps = self._issued(name, launches, tuple(sorted(set(deps))), host_waits)
        op_id = self._id()
        self.ops.append(ComputeOp(op_id, name, phase, kernels, deps))
        self.last_compute = op_id
        return op_id

    def collective(self, name: str, kind: CollectiveKind, nbytes: float, axis: Axis,
                   deps: tuple[int, ...] = (), *, group: str | None = None,
                   per_rank_copies: bool = False, routing: TokenRouting | None = None,
                   host_waits: tuple[int, ...] = ()) -> int:
        """A collective on ``axis``'s stream over the group set named after the axis, or over
        ``group`` (a partition that belongs to the axis, see ``workloads.axes``); an eager host
        issues it after ``host_waits`` end (a device-to-host sync before it)."""
        deps = self._issued(name, 1, tuple(sorted(set(deps))), host_waits)
        op_id = self._id()
        self.ops.append(CollectiveOp(op_id, name, kind, nbytes, group or axis.value,
                                     Stream.of(axis), deps, per_rank_copies, routing))
        return op_id

    def send(self, name: str, peer: int, nbytes: float, tag: int, deps: tuple[int, ...]) -> int:
        deps = self._issued(name, 1, deps)
        op_id = self._id()
        self.ops.append(SendOp(op_id, name, Axis.PP.value, peer, nbytes, tag, deps=deps))
        return op_id

    def recv(self, name: str, peer: int, nbytes: float, tag: int) -> int:
        deps = self._issued(name, 1, ())
        op_id = self._id()
        self.ops.append(RecvOp(op_id, name, Axis.PP.value, peer, nbytes, tag, deps=deps))
        return op_id

    def copy(self, name: str, kind: CopyKind, nbytes: float, deps: tuple[int, ...]) -> int:
        deps = self._issued(name, 1, deps)
        op_id = self._id()
        self.ops.append(CopyOp(op_id, name, kind, nbytes, deps=deps))
        return op_id

    def after_compute(self) -> tuple[int, ...]:
        """The last compute op, as a dependency (nothing before the first)."""
        return () if self.last_compute is None else (self.last_compute,)


@dataclass(frozen=True, slots=True)
class StageProgram:
    """One pipeline stage's program under construction."""

    job: Job
    plan: StagePlan
    ops: OpList
    kernels: LayerOps
    """One device's kernels for a layer, the embedding, the head and the optimizer."""

    @property
    def model(self) -> TransformerSpec:
        return self.job.model

    @property
    def strategy(self) -> Strategy:
        return self.job.strategy

    @property
    def element_bytes(self) -> float:
        """Bytes of one activation (and gathered parameter) element: 2, or 4 in FP32."""
        return self.job.training.precision.activation_bytes

    @property
    def activation_bytes(self) -> float:
        """One micro-batch's hidden states on this device's sequence shard (before sequence
        parallelism splits them): what TP collectives and pipeline sends carry."""
        return self.kernels.tokens * self.job.model.hidden * self.element_bytes


Steps = Generator[None, None, int]
"""A pass's emission, paused after each op that another pass's compute may hide (an expert
all-to-all); it returns the pass's last op."""


def drain(steps: Steps) -> int:
    """Emit a pass to its end; its last op."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def interleave(first: Steps, second: Steps) -> None:
    """Emit two independent passes turn by turn, switching at every pause: the compute stream
    then runs one pass's compute while the other's all-to-all is in flight. With no pause the
    passes come one after the other, as without interleaving."""
    active = [first, second]
    while active:
        for steps in tuple(active):
            try:
                next(steps)
            except StopIteration:
                active.remove(steps)

"""The inputs and outputs of one long-horizon run: plain, picklable values.

A :class:`RunPlan` carries everything a run needs and nothing it must compute: step times come
from the step engine beforehand (healthy, with fewer replicas, with a straggler or a degraded
link), so a run only plays failures, checkpoints and recoveries against them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from clustersim.hardware_specs.failures import Distribution, FailureCause, HazardSpec
from clustersim.simulator.longrun.checkpointing import CheckpointCost
from clustersim.simulator.longrun.recovery import RecoveryPolicy


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTable:
    """Step time as a function of one variable, linear between measured points."""

    xs: tuple[float, ...]
    step_s: tuple[float, ...]

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.step_s
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
        x0, x1 = xs[i], xs[i + 1]
        return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)

    def to_dict(self) -> dict:
        return {"x": list(self.xs), "step_time_s": list(self.step_s)}


@dataclass(frozen=True, kw_only=True, slots=True)
class CauseClock:
    """Failures of one cause on every node of the job."""

    cause: FailureCause
    rate_per_node_s: float
    hazard: HazardSpec
    domain_nodes: int = 1
    """Nodes a correlated failure takes down (1: never correlated)."""
    correlated_probability: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class DegradationPlan:
    """Stragglers or degraded links: how often, how bad, how long, and what they cost a step."""

    rate_per_node_s: float
    slowdown: Distribution
    duration: Distribution
    step: StepTable
    """Step time against the slowdown factor of one rank."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPlan:
    step_time_s: float
    """Healthy step time: the unit of work (one healthy step)."""
    horizon_s: float
    """The window the study reports on (e.g. 54 days)."""
    budget_steps: float
    """Healthy-step equivalents to train; the run goes on until they are done (infinite: it
    stops at the horizon)."""
    nodes: int
    dp: int
    replicas_of_node: tuple[tuple[int, ...], ...]
    """Data-parallel replicas whose ranks sit on each node."""
    clocks: tuple[CauseClock, ...]
    checkpoint: CheckpointCost
    interval_s: float
    """Training time between checkpoints."""
    recovery: RecoveryPolicy
    stragglers: DegradationPlan | None = None
    links: DegradationPlan | None = None
    replicas_step: StepTable | None = None
    """Step time against the number of live data-parallel replicas (elastic, replica_ft)."""
    peer_offset: int = 1
    """In-memory checkpoints: node n's copies live on nodes n + k * offset."""
    peer_replicas: int = 1
    sharding_groups: tuple[tuple[int, ...], ...] = ()
    """REFT: the nodes whose host memory shares each sharding group's shards and parity."""
    tolerated_failures: int = 0
    """REFT: lost nodes per sharding group the parity rebuilds."""
    rejoin_transfer_s: float = 0.0
    """replica_ft: copying a live replica's state into a replacement."""

    @property
    def unexpected_rate_s(self) -> float:
        """Unexpected interruptions per second of the whole job."""
        return sum(c.rate_per_node_s for c in self.clocks if not c.cause.planned) * self.nodes


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in a run (what the events CSV holds)."""

    time_s: float
    kind: str
    """failure, planned, straggler, link, rejoin."""
    cause: str
    component: str
    downtime_s: float
    """Time the job (or, replica_ft, the survivors) stopped for it, as planned at the event."""
    lost_work_s: float
    """Training rolled back, in healthy-step seconds."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of one run's timeline: ``state`` is train, save or down."""

    start_s: float
    end_s: float
    state: str
    speed: float
    """Work rate relative to the healthy job (1 = full speed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """What one run measured in the horizon window, and when it finished its budget."""

    index: int
    wall_s: float
    useful_s: float
    """Training kept at the end, in healthy-step seconds (the ETTR numerator)."""
    lost_s: float
    checkpoint_s: float
    down_s: float
    slowdown_s: float
    """Extra training time from running slower than healthy (stragglers, fewer replicas)."""
    interruptions: int
    planned: int
    by_cause: dict[str, int]
    time_to_train_s: float
    events: tuple[Event, ...] = ()
    timeline: tuple[Segment, ...] = field(default=(), repr=False)

    @property
    def ettr(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s > 0 else 0.0

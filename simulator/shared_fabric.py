"""Several jobs on one fabric: their steps replayed together, their transfers sharing links.

Each job keeps its own step engine (:class:`StepSimulation`: its trace, rank classes, compute
and memory models); what they share is one SimPy environment, one network model of the whole
cluster (the jobs' devices are devices of that cluster, so their collectives cross its real
NICs, leaf and spine links) and one :class:`FlowNetwork`. A transfer of job A and one of job B
on the same leaf uplink then share it max-min, exactly as two transfers of one job do. Every job
is also replayed alone on the same devices, so what it loses to the others is the difference.

All jobs start their first step at time 0, and a job that finishes before the others runs its
next steps until they finish too (as jobs that train for hours do): every job's first step
shares the fabric with the others from its start to its end. The loss reported is that of the
first step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import simpy

from clustersim.hardware_specs import ClusterSpec, SpecError
from clustersim.hardware_specs.topology import Link, LinkKind
from clustersim.simulator.cost.measured import MeasuredNetwork
from clustersim.simulator.cost.network import NetworkModel
from clustersim.simulator.engine import NetworkMode, SimulationOptions, StepSimulation
from clustersim.simulator.flows import FlowNetwork
from clustersim.simulator.result import AXES, StepResult
from clustersim.workloads.trace import Trace

HOT_LINKS = 8
"""Links listed in a result, busiest first."""
REPEATS = 100
"""Steps a job runs after its first while another job's first step is still running (a job
over a hundred times shorter than another stops loading the fabric after that)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricJob:
    """One job of a shared cluster."""

    name: str
    trace: Trace
    cluster: ClusterSpec
    """The job's own view: its device count, devices per node, device type and memory."""
    devices: tuple[int, ...]
    """Device of the shared cluster that runs each of the job's devices (``cluster.device_of``
    of a rank indexes this)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkUse:
    """Traffic of one network link during the shared step."""

    kind: str
    """nic_tx, nic_rx, leaf_up, leaf_down, pod_up or pod_down (``topology.LinkKind``)."""
    index: int
    capacity_bps: float
    busy_s: float
    """Time the link needs for every byte it carried at its full capacity."""
    utilisation: float
    """``busy_s`` over the longest step of the shared run."""
    jobs: tuple[str, ...]
    """Jobs that sent bytes over it."""

    def to_dict(self) -> dict:
        return {"link": f"{self.kind}[{self.index}]", "capacity_gbps": self.capacity_bps * 8 / 1e9,
                "busy_s": self.busy_s, "utilisation": self.utilisation, "jobs": list(self.jobs)}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOutcome:
    name: str
    together: StepResult
    alone: StepResult
    """The same job on the same devices with the fabric to itself."""

    @property
    def lost_s(self) -> float:
        """Step time the job loses to the other jobs."""
        return self.together.step_time_s - self.alone.step_time_s

    def to_dict(self) -> dict:
        exposed = {a: self.together.breakdown.exposed_comm_s.get(a, 0.0)
                   - self.alone.breakdown.exposed_comm_s.get(a, 0.0) for a in AXES}
        return {"name": self.name, "step_time_s": self.together.step_time_s,
                "alone_step_time_s": self.alone.step_time_s, "lost_s": self.lost_s,
                "lost_fraction": self.lost_s / self.alone.step_time_s,
                "tokens_per_s": self.together.tokens_per_s, "mfu": self.together.mfu,
                "extra_exposed_comm_s": exposed, "together": self.together.to_dict(),
                "alone": self.alone.to_dict()}


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedFabricResult:
    jobs: tuple[JobOutcome, ...]
    hot_links: tuple[LinkUse, ...]
    """The busiest links of the shared run, busiest first (at most ``HOT_LINKS``)."""
    shared_links: int
    """Links that carried bytes of more than one job."""

    def to_dict(self) -> dict:
        return {"jobs": [j.to_dict() for j in self.jobs],
                "hot_links": [l.to_dict() for l in self.hot_links],
                "shared_links": self.shared_links}


class _JobFlows:
    """One job's door to the shared flow network: it counts the bytes the job puts on each
    link (for the hot-link table) and hands the transfer on."""

    def __init__(self, shared: FlowNetwork):
        self.shared = shared
        self.bytes: dict[Link, float] = defaultdict(float)

    def transfer(self, loads: tuple[tuple[Link, float], ...]) -> simpy.Event:
        for link, b in loads:
            self.bytes[link] += b
        return self.shared.transfer(loads)


def _check(jobs: Sequence[FabricJob], fabric: ClusterSpec) -> None:
    """Every job on as many devices as it has ranks' devices, all of them the cluster's, no
    device in two jobs."""
    taken: dict[int, str] = {}
    for i, job in enumerate(jobs):
        problem = ""
        if len(job.devices) != job.cluster.num_devices:
            problem = f"{len(job.devices)} devices for a job of {job.cluster.num_devices}"
        elif outside := [d for d in job.devices if not 0 <= d < fabric.num_devices]:
            problem = f"device {outside[0]} is not one of the cluster's {fabric.num_devices}"
        elif clash := [d for d in job.devices if d in taken]:
            problem = f"device {clash[0]} is also {taken[clash[0]]}'s"
        if problem:
            raise SpecError(f"jobs[{i}]", f"{job.name}: {problem}")
        taken.update(dict.fromkeys(job.devices, job.name))


def _replay(jobs: Sequence[FabricJob], fabric: ClusterSpec, options: SimulationOptions,
            network) -> tuple[list[StepResult], list[_JobFlows]]:
    """Replay the first step of every job of ``jobs`` together in one environment over one
    flow network; a job that finishes its step before the others starts its next one (and so
    on, up to ``REPEATS``), so that the others share the fabric with it to their end."""
    env = simpy.Environment()
    shared = FlowNetwork(env, network.topology.capacity)
    doors = [_JobFlows(shared) for _ in jobs]

    def step(job: FabricJob, door: _JobFlows) -> StepSimulation:
        sim = StepSimulation(job.trace, job.cluster, options, network=network, env=env,
                             flows=door, devices=job.devices)  # type: ignore[arg-type]
        sim.start()
        return sim

    sims = [step(job, door) for job, door in zip(jobs, doors)]
    ends = [simpy.AllOf(env, sim.processes) for sim in sims]
    everyone = simpy.AllOf(env, ends)

    def next_steps(job: FabricJob, door: _JobFlows, end: simpy.Event):
        yield end
        for _ in range(REPEATS):
            if everyone.triggered:
                return
            yield simpy.AllOf(env, step(job, door).processes)

    for job, door, end in zip(jobs, doors, ends):
        env.process(next_steps(job, door, end))
    events = 0
    while env.peek() != float("inf"):
        env.step()
        events += 1
    return [sim.summary(sim.finished(events, 0.0)) for sim in sims], doors


def _hot_links(jobs: Sequence[FabricJob], doors: Sequence[_JobFlows], capacity,
               makespan: float) -> tuple[tuple[LinkUse, ...], int]:
    busy: dict[Link, float] = defaultdict(float)
    users: dict[Link, list[str]] = defaultdict(list)
    for job, door in zip(jobs, doors):
        for link, b in door.bytes.items():
            busy[link] += b / capacity(link)
            users[link].append(job.name)
    ranked = sorted(busy, key=lambda l: (-busy[l], l[0], l[1]))[:HOT_LINKS]
    hot = tuple(LinkUse(kind=LinkKind(l[0]).name.lower(), index=l[1], capacity_bps=capacity(l),
                        busy_s=busy[l], utilisation=busy[l] / makespan if makespan else 0.0,
                        jobs=tuple(users[l])) for l in ranked)
    return hot, sum(1 for names in users.values() if len(names) > 1)


def simulate_shared(jobs: Sequence[FabricJob], fabric: ClusterSpec,
                    options: SimulationOptions = SimulationOptions()) -> SharedFabricResult:
    """One step of every job of ``jobs`` together on ``fabric``, and each alone."""
    if options.network is not NetworkMode.FLOW:
        raise SpecError("simulation.network", "jobs share a fabric only under the flow model "
                        "(network: flow)")
    if options.expand:
        raise SpecError("simulation.expand", "a shared fabric runs rank classes (expand: false)")
    _check(jobs, fabric)
    model = MeasuredNetwork if fabric.node.measured_comm else NetworkModel
    network = model(fabric, options.algorithms)
    together, doors = _replay(jobs, fabric, options, network)
    alone = [_replay([job], fabric, options, network)[0][0] for job in jobs]
    makespan = max(r.step_time_s for r in together)
    hot, shared = _hot_links(jobs, doors, network.topology.capacity, makespan)
    return SharedFabricResult(
        jobs=tuple(JobOutcome(name=j.name, together=t, alone=a)
                   for j, t, a in zip(jobs, together, alone)),
        hot_links=hot, shared_links=shared)

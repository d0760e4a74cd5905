"""Balancing a job over a heterogeneous cluster (``cluster.groups``), as HAP does.

HAP (Zhang et al., "HAP: SPMD DNN Training on Heterogeneous GPU Clusters with Automated Program
Synthesis", EuroSys'24, arXiv 2401.05965) gives each device a sharding ratio B_i of the work
(sum_i B_i = 1, B_i >= 0) and chooses the ratios by linear programming to minimise the
iteration time, which the slowest device's share of the computation (plus communication) sets:
min max_i B_i x t_i. A device that computes faster takes a larger share. It reports up to
2.41x over the baselines it compares with on heterogeneous clusters.

Here the shares are whole units the trace can run: layers per pipeline stage and micro-batches
per data-parallel replica. The planner
1. times one micro-batch of every layer, and of each stage's embedding/head work, on each
   group's device with the engine's own compute model (the ops of the even job's trace);
2. with a pipeline whose stages sit on different groups, splits the layers into contiguous
   stages minimising the slowest stage (each stage timed on the slowest device it runs on),
   among the splits whose every stage fits its smallest device's memory;
3. gives the micro-batches to the replicas minimising max_r (n_r + pp - 1) x t_r, the 1F1B
   step of replica r whose stages take t_r per micro-batch (the integer form of HAP's min-max;
   handing each next micro-batch to the replica that would finish it first is optimal for
   this objective), at least one each;
4. simulates the balanced plan, the naive even split on every device, and the job on the
   fastest group alone (data parallelism shrunk to its devices, the same global batch), and
   checks every group's memory in each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from clustersim.hardware_specs import ClusterSpec, SpecError
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.workloads import Job
from clustersim.workloads.axes import Axis
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.memory import stage_memory
from clustersim.workloads.stages import StagePlan, stage_plans
from clustersim.workloads.trace import ComputeOp, Trace

from clustersim.analysis.config import RunConfig
from clustersim.analysis.step import StepReport, run_step

HAP_CITATION = ("HAP, Zhang et al., EuroSys'24 (arXiv 2401.05965): sharding ratios by linear "
                "programming; up to 2.41x on heterogeneous clusters")
HAP_MAX_SPEEDUP = 2.41
"""HAP's largest speed-up on heterogeneous clusters, as its abstract states it."""

_LAYER_OP = re.compile(r"^(?:fwd|bwd|recompute)0\.layer(\d+)\.")
_MICRO_ZERO = re.compile(r"^(?:fwd|bwd|recompute)0\.")


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupCosts:
    """One micro-batch on one device of a group, by the engine's compute model."""

    device: str
    num_devices: int
    layer_s: tuple[float, ...]
    """Forward, backward (and recompute) of each layer."""
    stage_extra_s: tuple[float, ...]
    """Each stage's work outside its layers (embedding, LM head and loss)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BalancePlan:
    groups: tuple[GroupCosts, ...]
    layers_per_stage: tuple[int, ...]
    """Empty: the even split (every stage on the same group)."""
    replica_batch: tuple[int, ...]
    replica_devices: tuple[str, ...]
    """The device(s) each replica runs on (``a100-80gb``, or ``a100-80gb+h100-sxm``)."""
    balanced: StepReport
    even: StepReport
    fastest_only: StepReport
    fastest_group: int

    @property
    def speedup_over_even(self) -> float:
        return self.even.result.step_time_s / self.balanced.result.step_time_s

    @property
    def speedup_over_fastest(self) -> float:
        return self.fastest_only.result.step_time_s / self.balanced.result.step_time_s

    def to_dict(self) -> dict:
        runs = {"balanced": self.balanced, "even": self.even, "fastest_only": self.fastest_only}
        return {
            "groups": [{"gpu": g.device, "num_gpus": g.num_devices,
                        "layers_s_per_micro_batch": sum(g.layer_s)} for g in self.groups],
            "layers_per_stage": list(self.layers_per_stage),
            "replica_batch": list(self.replica_batch),
            "replica_devices": list(self.replica_devices),
            "fastest_group": self.fastest_group,
            "step_time_s": {k: r.result.step_time_s for k, r in runs.items()},
            "fits_in_memory": {k: r.result.fits_in_memory for k, r in runs.items()},
            "speedup_over_even": self.speedup_over_even,
            "speedup_over_fastest_only": self.speedup_over_fastest,
            "reference": HAP_CITATION,
        }


def even_job(job: Job) -> Job:
    return replace(job, strategy=replace(job.strategy, layers_per_stage=(), replica_batch=()))


def group_costs(job: Job, cluster: ClusterSpec, trace: Trace) -> tuple[GroupCosts, ...]:
    """Per-micro-batch times on each group's device of the even job's stages (``trace``)."""
    out = []
    for g in cluster.device_groups:
        model = ComputeModel(g.device)
        layer = [0.0] * job.model.layers
        extra = [0.0] * job.strategy.pp
        for stage, program in enumerate(trace.programs):
            for op in program.ops:
                if not isinstance(op, ComputeOp) or not _MICRO_ZERO.match(op.name):
                    continue
                hit = _LAYER_OP.match(op.name)
                if hit and int(hit.group(1)) < job.model.layers:
                    layer[int(hit.group(1))] += model.op_time(op)
                else:
                    extra[stage] += model.op_time(op)
        out.append(GroupCosts(device=g.device.name, num_devices=g.num_devices,
                              layer_s=tuple(layer), stage_extra_s=tuple(extra)))
    return tuple(out)


def rank_groups(job: Job, cluster: ClusterSpec) -> list[list[set[int]]]:
    """[replica][stage] -> the groups that rank set runs on."""
    s = job.strategy
    layout = ParallelLayout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)
    out = [[set() for _ in range(s.pp)] for _ in range(s.dp)]
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        out[c[Axis.DP]][c[Axis.PP]].add(cluster.group_of_rank(rank))
    return out


def _stage_s(costs, groups: set[int], stage: int, layers: range) -> float:
    """A stage's time per micro-batch on the slowest of ``groups``."""
    return max(sum(costs[g].layer_s[i] for i in layers) + costs[g].stage_extra_s[stage]
               for g in groups)


def split_layers(costs, stage_groups: list[set[int]], layers: int,
                 fits=lambda stage, start, end: True) -> tuple[int, ...]:
    """Contiguous layers per stage (>= 1 each) minimising the slowest stage, among the splits
    whose every stage ``fits`` (layers ``start:end`` on ``stage``'s smallest device): dynamic
    programming over (stage, layers placed so far)."""
    pp = len(stage_groups)
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(pp + 1)]
    cut = [[0] * (layers + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for s in range(1, pp + 1):
        for end in range(s, layers - (pp - s) + 1):
            for start in range(s - 1, end):
                if best[s - 1][start] == inf or not fits(s - 1, start, end):
                    continue
                t = max(best[s - 1][start],
                        _stage_s(costs, stage_groups[s - 1], s - 1, range(start, end)))
                if t < best[s][end]:
                    best[s][end], cut[s][end] = t, start
    if best[pp][layers] == inf:
        raise SpecError("strategy.pp", f"no split of the {layers} layers over {pp} stages fits "
                        "every stage's devices")
    sizes, end = [], layers
    for s in range(pp, 0, -1):
        sizes.append(end - cut[s][end])
        end = cut[s][end]
    return tuple(reversed(sizes))


def _fits_memory(job: Job, cluster: ClusterSpec, stage_groups: list[set[int]]):
    """Whether layers ``start:end`` on a stage fit its smallest device (the memory model of
    ``workloads/memory.py``, at the even job's micro-batches)."""
    s = job.strategy
    capacity = [min(cluster.groups[g].device.memory_bytes for g in groups)
                for groups in stage_groups]
    pp = s.pp

    def fits(stage: int, start: int, end: int) -> bool:
        plan = StagePlan(stage=stage, chunk_layers=(end - start,), has_embedding=stage == 0,
                         has_head=stage == pp - 1, chunk_layer_ids=(tuple(range(start, end)),))
        need = stage_memory(job.model, job.training, s, plan).memory.required
        return need <= capacity[stage]
    return fits


def share_micro_batches(per_micro_s: list[float], total: int, pp: int, unit: int) -> list[int]:
    """Micro-batches per replica (multiples of ``unit``, at least one unit each) minimising
    max_r (n_r + pp - 1) x t_r: each next unit goes to the replica that would finish first."""
    if total < unit * len(per_micro_s):
        raise SpecError("training.global_batch", f"{total} micro-batches cannot give each of "
                        f"{len(per_micro_s)} replicas {unit}")
    n = [unit] * len(per_micro_s)
    for _ in range((total - sum(n)) // unit):
        r = min(range(len(n)), key=lambda i: ((n[i] + unit + pp - 1) * per_micro_s[i], i))
        n[r] += unit
    return n


def fastest_only(config: RunConfig, index: int) -> RunConfig:
    """The job on group ``index`` alone: its devices, dp shrunk to them, the same batch."""
    cluster, job = config.cluster, even_job(config.job)
    g, s = cluster.groups[index], job.strategy
    per_replica = s.tp * s.cp * s.pp
    if g.num_devices % per_replica:
        raise SpecError(f"cluster.groups[{index}].num_gpus", f"{g.num_devices} does not hold "
                        f"whole replicas of tp*cp*pp = {per_replica} devices")
    strategy = replace(s, dp=g.num_devices // per_replica)
    alone = replace(cluster.group_view(index), num_devices=g.num_devices)
    job = Job(job.model, job.training, strategy).checked(g.num_devices)
    return replace(config, job=job, cluster=alone, name=f"{config.name} ({g.device.name} only)")


def plan(config: RunConfig, limit: bool = True) -> BalancePlan:
    """Balance ``config``'s job over its device groups and simulate the three plans."""
    cluster = config.cluster
    if not cluster.groups:
        raise SpecError("cluster.groups", "the balancing planner needs a mixed cluster "
                        "(cluster.groups with two or more device groups)")
    job = even_job(config.job)
    s, t = job.strategy, job.training
    costs = group_costs(job, cluster, build_trace(job))
    groups = rank_groups(job, cluster)
    stage_groups = [set().union(*(groups[r][st] for r in range(s.dp))) for st in range(s.pp)]
    layers: tuple[int, ...] = ()
    if s.pp > 1 and s.virtual_stages == 1 and len({frozenset(g) for g in stage_groups}) > 1:
        layers = split_layers(costs, stage_groups, job.model.layers,
                              _fits_memory(job, cluster, stage_groups))
    sizes = layers or tuple(p.layers for p in stage_plans(job.model, s))
    starts = [sum(sizes[:i]) for i in range(s.pp)]
    per_micro = [max(_stage_s(costs, groups[r][st], st, range(starts[st], starts[st] + sizes[st]))
                     for st in range(s.pp)) for r in range(s.dp)]
    unit = s.pp if s.virtual_stages > 1 else 1
    micro = share_micro_batches(per_micro, t.global_batch // t.micro_batch, s.pp, unit)
    batch = tuple(n * t.micro_batch for n in micro)
    strategy = replace(s, layers_per_stage=layers,
                       replica_batch=batch if len(set(batch)) > 1 else ())
    balanced = replace(config, job=Job(job.model, t, strategy).checked(cluster.num_devices))
    fastest = min(range(len(costs)), key=lambda g: (sum(costs[g].layer_s), g))
    return BalancePlan(
        groups=costs, layers_per_stage=layers, replica_batch=batch,
        replica_devices=tuple("+".join(costs[g].device for g in sorted(set().union(*stages)))
                              for stages in groups),
        balanced=run_step(balanced, limit=limit),
        even=run_step(replace(config, job=job), limit=limit),
        fastest_only=run_step(fastest_only(config, fastest), limit=limit),
        fastest_group=fastest)

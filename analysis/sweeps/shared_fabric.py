"""A cluster shared by several jobs: the config, the run, and the table people read.

    name: two_teams_4to1
    cluster: {gpu: a100-80gb, num_gpus: 128, fabric: fat-tree-hdr-4to1}   # the whole cluster
    placement: scattered          # how the scheduler places the jobs: packed | scattered | rail_aligned
    jobs:
      - {name: team-a, gpus: 64, model: llama3_8b, training: {...}, strategy: {...}}
      - {name: team-b, gpus: 64, model: llama3_8b, training: {...}, strategy: {...}}
    simulation: {...}             # as in a one-job config, for every job

Each job is checked as a one-job config would be (its errors name ``jobs[i].<field>``) on its
share of the cluster (``hardware_specs/allocation.py``); the step engine replays all of them
together (``simulator/shared_fabric.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustersim.hardware_specs import ClusterSpec, SpecError
from clustersim.hardware_specs.allocation import JobPlacement, allocate
from clustersim.hardware_specs.fields import Fields
from clustersim.simulator.shared_fabric import FabricJob, SharedFabricResult, simulate_shared
from clustersim.workloads.builder import build_trace

from clustersim.analysis.config import (
    RunConfig, cluster_catalog, config_from_mapping, config_path, name_of, parse_cluster, read_yaml,
)
from clustersim.analysis.limits import LAYER_PASS_BUDGET, check_budget, layer_passes
from clustersim.analysis.step import simulation_options
from clustersim.analysis.tables import render

SHARED_SECTIONS = ("name", "description", "cluster", "placement", "jobs", "simulation")
JOB_FIELDS = ("name", "gpus", "model", "training", "strategy")


def is_shared(data: Mapping[str, Any]) -> bool:
    """A config with a ``jobs`` list describes a shared cluster."""
    return isinstance(data, Mapping) and "jobs" in data


@dataclass(frozen=True)
class SharedConfig:
    name: str
    fabric: ClusterSpec
    placement: JobPlacement
    jobs: tuple[RunConfig, ...]
    devices: tuple[tuple[int, ...], ...]
    """Devices of ``fabric`` each job runs on."""
    simulation: Mapping[str, Any]


def shared_from_mapping(data: Mapping[str, Any], base_dir: Path | None = None,
                        catalog_dirs: Iterable[str | Path] = (), name: str = "") -> SharedConfig:
    top = Fields(data, "").only(SHARED_SECTIONS)
    cluster_f = top.sub("cluster", required=True)
    cluster_raw = dict(top.raw("cluster"))
    fabric = parse_cluster(cluster_f, cluster_catalog(cluster_f, base_dir, catalog_dirs))
    placement = top.choice("placement", JobPlacement, JobPlacement.PACKED)
    items = top.items("jobs")
    if not items:
        raise SpecError("jobs", "expected a list of at least one job")
    sizes = []
    for i, item in enumerate(items):
        f = Fields(item, f"jobs[{i}]").only(JOB_FIELDS)
        sizes.append(f.integer("gpus", minimum=1))
    allocations = allocate(sizes, fabric.devices_per_node, fabric.num_devices, placement)
    jobs, names = [], set()
    for i, (item, alloc) in enumerate(zip(items, allocations)):
        job_name = name_of(Fields(item, f"jobs[{i}]")) or f"job{i}"
        if job_name in names:
            raise SpecError(f"jobs[{i}].name", f"{job_name!r} names two jobs")
        names.add(job_name)
        cluster = {k: v for k, v in cluster_raw.items() if k not in ("num_gpus", "gpus_per_node")}
        one = {k: item[k] for k in ("model", "training", "strategy") if k in item}
        one["cluster"] = {**cluster, "num_gpus": len(alloc.devices),
                          "gpus_per_node": alloc.per_node}
        try:
            config = config_from_mapping(one, base_dir, catalog_dirs)
        except SpecError as err:
            raise err.under(f"jobs[{i}]") from None
        jobs.append(RunConfig(job=config.job, cluster=config.cluster, catalog=config.catalog,
                              name=job_name, sections={}))
    simulation = top.raw("simulation", {})
    top.text("description", "")
    title = name_of(top) or name
    top.done()
    return SharedConfig(name=title, fabric=fabric, placement=placement, jobs=tuple(jobs),
                        devices=tuple(a.devices for a in allocations), simulation=simulation)


def load_shared(path: str | Path, catalog_dirs: Iterable[str | Path] = ()) -> SharedConfig:
    path = config_path(path)
    return shared_from_mapping(read_yaml(path), path.parent, catalog_dirs, name=path.stem)


def run_shared(config: SharedConfig, limit: bool = True) -> SharedFabricResult:
    """One step of every job together, and each alone on the same devices."""
    options = simulation_options(RunConfig(job=config.jobs[0].job, cluster=config.fabric,
                                           catalog=config.jobs[0].catalog,
                                           sections={"simulation": config.simulation}))
    if limit:
        work = sum(layer_passes(c.job) for c in config.jobs)
        check_budget(2 * work, LAYER_PASS_BUDGET,
                     "the jobs' layer passes, together and alone (micro-batches x layers x cp)",
                     "--no-limit")
    jobs = [FabricJob(name=c.name, trace=build_trace(c.job), cluster=c.cluster, devices=d)
            for c, d in zip(config.jobs, config.devices)]
    return simulate_shared(jobs, config.fabric, options)


def _nodes(devices: tuple[int, ...], per_node: int) -> str:
    nodes = sorted({d // per_node for d in devices})
    if nodes == list(range(nodes[0], nodes[-1] + 1)):
        return f"{nodes[0]}-{nodes[-1]}" if len(nodes) > 1 else str(nodes[0])
    return ",".join(map(str, nodes[:6])) + (",..." if len(nodes) > 6 else "")


def shared_table(config: SharedConfig, result: SharedFabricResult) -> str:
    """Per-job step time together and alone, and the busiest links."""
    fabric = config.fabric
    rows = []
    for c, devices, outcome in zip(config.jobs, config.devices, result.jobs):
        s = c.job.strategy
        extra = outcome.to_dict()["extra_exposed_comm_s"]
        worst = max(extra, key=lambda a: abs(extra[a]))
        rows.append([c.name, c.cluster.num_devices, _nodes(devices, fabric.devices_per_node),
                     f"TP{s.tp} PP{s.pp} DP{s.dp}", f"{outcome.alone.step_time_s * 1e3:.1f}",
                     f"{outcome.together.step_time_s * 1e3:.1f}",
                     f"{outcome.lost_s * 1e3:+.1f}",
                     f"{100 * outcome.lost_s / outcome.alone.step_time_s:+.1f}%",
                     f"{worst} {extra[worst] * 1e3:+.1f}" if extra[worst] else "-"])
    jobs = render(["job", "GPUs", "nodes", "strategy", "alone ms", "together ms", "lost ms",
                   "lost", "extra exposed ms"], rows,
                  title=f"{config.name}: {len(config.jobs)} jobs on {fabric.num_devices} "
                        f"{fabric.device.name} ({fabric.fabric.name}), placement "
                        f"{config.placement.value}")
    links = render(["link", "Gb/s", "busy ms", "of step", "jobs"],
                   [[f"{l.kind}[{l.index}]", f"{l.capacity_bps * 8 / 1e9:,.0f}",
                     f"{l.busy_s * 1e3:.2f}", f"{100 * l.utilisation:.1f}%", ", ".join(l.jobs)]
                    for l in result.hot_links],
                   title=f"Busiest links ({result.shared_links} links carry more than one job)")
    return f"{jobs}\n\n{links}"

"""A run config whose workload is a recorded trace instead of a model:

    workload:
      trace: traces/gpt_dp2/trace.json  # our trace JSON (``clustersim trace import``), or the
                                        # Kineto/Chakra files themselves (a file or a folder)
      recorded_on: profile              # catalog device it was recorded on (default: the
                                        # trace's meta source.recorded_on); re-times compute
      world_size: 8                     # one rank's raw file standing for a symmetric job
      dp: 16                            # data-parallel replicas to simulate (default: recorded)
      host_cores: 2                     # CPU devices: the host's cores; ranks beyond them
                                        # time-share cores, in the recording (its ranks) and in
                                        # the simulated run (default: a core per rank)
    cluster: {gpu: ..., num_gpus: ...}  # as for a model; num_gpus = the simulated ranks
    simulation: {...}                   # as for a model

The step replays the trace on the cluster: compute ops take their measured time re-timed by the
ratio of the recording and target devices' rates (``simulator/cost/retimed.py``), collectives
and sends are re-costed by the target's network model, replicas follow
``workloads/trace_import/scale.py``'s rules. Measured times already contain whatever slowed
compute while communication ran, so the engine adds no compute interference on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clustersim.hardware_specs import Catalog, ClusterSpec, DeviceKind, SpecError, load_catalog
from clustersim.hardware_specs.fields import Fields
from clustersim.simulator import StepResult
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.retimed import RetimedCompute
from clustersim.simulator.engine import StepSimulation
from clustersim.workloads.trace import Trace
from clustersim.workloads.trace_import import import_files
from clustersim.workloads.trace_import.scale import scale_data_parallel
from clustersim.workloads.trace_io import load_trace

from clustersim.analysis.config import parse_cluster

WORKLOAD_FIELDS = ("trace", "recorded_on", "world_size", "dp", "host_cores", "tokens")
TOP_FIELDS = ("workload", "cluster", "simulation", "name", "description")


@dataclass(frozen=True)
class TraceRunConfig:
    trace: Trace
    cluster: ClusterSpec
    catalog: Catalog
    recorded_on: str | None
    name: str = ""
    host_cores: int | None = None
    warnings: tuple[str, ...] = ()
    sections: Mapping[str, Any] = field(default_factory=dict)


def load_workload_trace(path: Path, world_size: int | None) -> tuple[Trace, tuple[str, ...]]:
    """Our trace JSON as it is; anything else through the importers."""
    if path.is_file() and path.suffix == ".json":
        head = path.open("rb").read(4096)
        if b'"programs"' in head and b'"group_sets"' in head or b'"version"' in head[:64]:
            return load_trace(path), ()
    imported = import_files([path], world_size=world_size)
    return imported.trace, imported.warnings


def is_trace_workload(data: Mapping) -> bool:
    return isinstance(data, Mapping) and "workload" in data


def trace_config_from_mapping(data: Mapping, base_dir: Path | None = None,
                              catalog_dirs: Iterable[str | Path] = ()) -> TraceRunConfig:
    if "model" in data:
        raise SpecError("workload", "give either model (with training and strategy) or "
                        "workload.trace, not both")
    top = Fields(data, "").only(TOP_FIELDS)
    w = top.sub("workload", required=True).only(WORKLOAD_FIELDS)
    text = w.text("trace")
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.exists():
        raise SpecError(w.at("trace"), f"no such file or folder: {path}")
    world = w.integer("world_size", minimum=1) if w.has("world_size") else None
    trace, warnings = load_workload_trace(path, world)
    if w.has("dp"):
        trace, more = scale_data_parallel(trace, w.integer("dp", minimum=1), w.at("dp"))
        warnings += more
    if w.has("tokens"):
        trace = replace(trace, tokens=w.number("tokens", minimum=0.0))
    source = trace.meta.get("source", {}) if isinstance(trace.meta.get("source"), Mapping) else {}
    recorded_on = w.text("recorded_on", "") or source.get("recorded_on") or None
    host_cores = w.integer("host_cores", minimum=1) if w.has("host_cores") else None
    cluster_f = top.sub("cluster", required=True)
    dirs = list(catalog_dirs)
    extra = cluster_f.raw("catalog", [])
    for d in [extra] if isinstance(extra, str) else list(extra):
        p = Path(str(d)).expanduser()
        dirs.append(p if p.is_absolute() or base_dir is None else base_dir / p)
    catalog = load_catalog(dirs)
    cluster = parse_cluster(cluster_f, catalog)
    if cluster.num_devices != trace.world_size:
        raise SpecError("cluster.num_gpus", f"the trace runs {trace.world_size} ranks "
                        f"(workload.dp scales it); got {cluster.num_devices}")
    if recorded_on is not None:
        catalog.get("devices", recorded_on, "workload.recorded_on")
    elif any(getattr(op, "measured_s", None) is not None for p in trace.programs for op in p.ops):
        warnings += ("the trace does not say which catalog device recorded it "
                     "(workload.recorded_on): measured times are used as they are",)
    sections = {k: top.raw(k) for k in ("simulation", "name") if top.has(k)}
    top.raw("description", "")
    top.done()
    return TraceRunConfig(trace=trace, cluster=cluster, catalog=catalog, recorded_on=recorded_on,
                          name=str(sections.get("name", "")), host_cores=host_cores,
                          warnings=tuple(warnings), sections=sections)


def _shared_device(device, ranks: int, cores: int | None):
    """A CPU core time-shared by the ranks that outnumber the host's cores."""
    from clustersim.analysis.calibration.compare import time_shared
    if cores is None or device.kind is not DeviceKind.CPU or ranks <= cores:
        return device
    return time_shared(device, ranks / cores)


def _shared(cluster: ClusterSpec, ranks: int, cores: int | None) -> ClusterSpec:
    """CPU ranks that outnumber the host's cores share them (``calibration.compare``), and so
    does their measured communication."""
    from clustersim.analysis.calibration.compare import time_shared_comm
    if cores is None or cluster.device.kind is not DeviceKind.CPU or ranks <= cores:
        return cluster
    return replace(cluster, device=_shared_device(cluster.device, ranks, cores),
                   node=time_shared_comm(cluster.node, ranks / cores))


def simulate_trace_config(config: TraceRunConfig) -> StepResult:
    from clustersim.analysis.step import simulation_options
    from clustersim.analysis.config import RunConfig
    options = simulation_options(RunConfig(job=None, cluster=config.cluster,
                                           catalog=config.catalog, sections=config.sections))
    options = replace(options, compute_slowdown_when_overlapped=0.0)
    cluster = _shared(config.cluster, config.trace.world_size, config.host_cores)
    source = None
    if config.recorded_on is not None:
        device = config.catalog.get("devices", config.recorded_on, "workload.recorded_on")
        scaled = config.trace.meta.get("scaled", {})
        recorded = scaled.get("recorded_ranks", config.trace.world_size) \
            if isinstance(scaled, Mapping) else config.trace.world_size
        source = ComputeModel(_shared_device(device, recorded, config.host_cores))
    compute = RetimedCompute(ComputeModel(cluster.device), source)
    try:
        return StepSimulation(config.trace, cluster, options, compute=compute).run()
    except RuntimeError as err:
        if "deadlock" not in str(err):
            raise
        # A recording whose implied dependencies wait in a circle (a damaged or edited file).
        raise SpecError("workload.trace", str(err)) from None


def trace_summary(config: TraceRunConfig, result: StepResult) -> str:
    from clustersim.hardware_specs.units import format_time
    from clustersim.analysis.tables import key_values
    cluster = config.cluster
    b = result.breakdown
    comm = ", ".join(f"{k} {v:.4f} s" for k, v in b.exposed_comm_s.items() if v > 0) or "none"
    head = key_values([
        ("workload", f"recorded trace, {config.trace.world_size} ranks"
                     + (f", recorded on {config.recorded_on}" if config.recorded_on else "")),
        ("cluster", f"{cluster.num_devices} x {cluster.device.name} in {cluster.num_nodes} "
                    f"{cluster.node.name} node(s), {cluster.fabric.name}"),
        ("step time", format_time(result.step_time_s)),
        ("compute", f"{b.compute_s:.4f} s (optimizer {b.optimizer_s:.4f} s)"),
        ("exposed comm", comm),
        ("simulated", f"{len(result.classes)} rank classes, {result.events:,} events in "
                      f"{result.wall_time_s:.2f} s"),
    ], title=f"clustersim: {config.name or 'trace workload'}")
    return head + "".join(f"\nwarning: {w}" for w in config.warnings)


"""A strategy sweep: enumerate the space, simulate what is worth it in parallel, stream each
finished point to disk, and resume where a previous run stopped.

The points of a folder depend only on what its manifest records, never on the backend or on the
number of workers: each point is one deterministic simulation, and the ranking orders by
throughput with the enumeration index breaking ties.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from clustersim.hardware_specs import ClusterSpec, SpecError
from clustersim.simulator import SimulationOptions, simulate
from clustersim.simulator.engine import cycle_collector_paused
from clustersim.simulator.result import BREAKDOWN_COLUMNS
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace
from clustersim.workloads.strategy import CpAlgorithm, Offload, Recompute, Schedule

from clustersim.analysis.chrome_trace import chrome_trace
from clustersim.analysis.limits import layer_passes
from clustersim.analysis.progress import progress as show_progress
from clustersim.analysis.config import RunConfig, config_from_mapping, config_path, read_yaml
from clustersim.analysis.sweeps.executors import run_tasks
from clustersim.analysis.sweeps.run_store import RunStore, atomic_write, manifest
from clustersim.analysis.sweeps.steady_state import simulate_job
from clustersim.analysis.sweeps.space import (
    GIB, Candidate, Status, SweepSpace, block_layers, enumerate_space, space_from_mapping,
)
from clustersim.analysis.step import StepReport, simulation_options

BEST = "best.json"
BEST_TRACE = "best_trace.json.gz"
STRATEGY_COLUMNS = ("tp", "pp", "dp", "cp", "cp_algorithm", "cp_a2a", "micro_batch", "schedule",
                    "virtual_stages", "sequence_parallel", "recompute", "zero", "offload")


@dataclass(frozen=True)
class LoadedConfig:
    """A config with the YAML it came from (the sweep hashes and stores the YAML)."""

    config: RunConfig
    raw: Mapping


def load_for_sweep(path: str | Path, catalog_dirs: Iterable[str | Path] = ()) -> LoadedConfig:
    path = config_path(path)
    raw = read_yaml(path)
    config = config_from_mapping(raw, path.parent, catalog_dirs)
    config = replace(config, name=config.name or path.stem, source=path)
    return LoadedConfig(config, _absolute_catalogs(raw, path.parent))


def from_mapping(raw: Mapping, base_dir: Path | None = None,
                 catalog_dirs: Iterable[str | Path] = ()) -> LoadedConfig:
    config = config_from_mapping(raw, base_dir, catalog_dirs)
    return LoadedConfig(config, _absolute_catalogs(raw, base_dir))


def _absolute_catalogs(raw: Mapping, base_dir: Path | None) -> Mapping:
    """The YAML with ``cluster.catalog`` made absolute, so the stored copy reads anywhere."""
    cluster = raw.get("cluster")
    if base_dir is None or not isinstance(cluster, Mapping) or "catalog" not in cluster:
        return raw
    dirs = cluster["catalog"]
    dirs = [dirs] if isinstance(dirs, str) else list(dirs)
    absolute = [str((base_dir / Path(str(d)).expanduser()).resolve()) for d in dirs]
    return {**raw, "cluster": {**cluster, "catalog": absolute}}


def strategy_columns(job: Job) -> dict:
    s = job.strategy
    return {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp,
            "cp_algorithm": s.cp_algorithm.value, "cp_a2a": s.cp_a2a,
            "micro_batch": job.training.micro_batch, "schedule": s.schedule.value,
            "virtual_stages": s.virtual_stages, "sequence_parallel": s.sequence_parallel,
            "recompute": s.recompute.value, "zero": s.zero, "offload": s.offload.value}


def candidate_row(c: Candidate) -> dict:
    return {"index": c.index, "key": c.key, "status": c.status.value, "reason": c.reason,
            **strategy_columns(c.job),
            "peak_memory_gib": c.peak_memory_bytes / GIB if c.memory else ""}


METRIC_COLUMNS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", *BREAKDOWN_COLUMNS,
                  "critical_class", "events")


def evaluate(task: tuple[str, Job, ClusterSpec, SimulationOptions]) -> tuple[str, dict]:
    """Simulate one point (runs in a worker): its metrics, or the error that stopped it. A
    long pipeline's step comes from its steady state where that is exact (``steady_state``)."""
    key, job, cluster, options = task
    try:
        with cycle_collector_paused():  # building a long trace is a third faster without it
            r = simulate_job(job, cluster, options)
    except (SpecError, RuntimeError, ValueError, ZeroDivisionError) as err:
        return key, {"error": f"{type(err).__name__}: {err}"}
    metrics = {"step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s,
               "tflops_per_gpu": r.tflops_per_gpu, "mfu": r.mfu, **r.breakdown.columns(),
               "critical_class": r.critical_class, "events": r.events}
    return key, {"error": "", **metrics}


def point_row(c: Candidate, metrics: Mapping) -> dict:
    row = {"index": c.index, "key": c.key, **strategy_columns(c.job),
           "peak_memory_gib": c.peak_memory_bytes / GIB, "error": metrics["error"]}
    row.update({k: metrics.get(k, "") for k in METRIC_COLUMNS})
    return row


@dataclass(frozen=True, kw_only=True)
class SweepOutcome:
    candidates: int
    by_status: dict[str, int]
    reused: int
    simulated: int
    errors: int
    wall_s: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def why_nothing_ranked(self) -> str:
        """Why a sweep ranked nothing, from what became of its candidates."""
        if self.errors:
            return f"{self.errors} simulations failed (see points.csv)"
        if self.by_status.get("does_not_fit", 0):
            return "no strategy that divides the job fits in memory"
        return ("no strategy of the space divides the job (tp must divide the heads, "
                "tp x pp x cp the GPUs, the micro-batches the batch)")


def run_sweep(loaded: LoadedConfig, out: str | Path, *, workers: int = 1,
              dask_address: str | None = None, progress: bool | None = None,
              space: SweepSpace | None = None) -> SweepOutcome:
    """Sweep ``loaded`` into the folder ``out``, reusing every point already there."""
    start = time.perf_counter()
    config = loaded.config
    space = space or space_from_mapping(config.sections.get("sweep"))
    store = RunStore(out)
    store.open(manifest(config, loaded.raw, space.to_dict(), run_seed(config)), loaded.raw)
    candidates = enumerate_space(config.job, config.cluster.num_devices,
                                 config.cluster.smallest_memory_bytes, space)
    store.write_candidates([candidate_row(c) for c in candidates])
    store.repair()
    done = store.read_points()
    by_key = {c.key: c for c in candidates}
    todo = work_order([c for c in candidates if c.status is Status.SIMULATE and c.key not in done],
                      parallel=workers > 1 or bool(dask_address))
    options = replace(simulation_options(config), record=False)
    tasks = [(c.key, c.job, config.cluster, options) for c in todo]
    errors = 0
    bar = show_progress(len(tasks), "sweep", "point", progress)
    try:
        for key, metrics in run_tasks(evaluate, tasks, workers, dask_address):
            store.append_point(point_row(by_key[key], metrics))
            errors += bool(metrics["error"])
            bar.update(1)
    finally:
        bar.close()
    counts: dict[str, int] = {}
    for c in candidates:
        counts[c.status.value] = counts.get(c.status.value, 0) + 1
    outcome = SweepOutcome(candidates=len(candidates), by_status=counts,
                           reused=sum(1 for c in candidates if c.key in done),
                           simulated=len(tasks), errors=errors,
                           wall_s=time.perf_counter() - start)
    write_best(store, config)
    return outcome


def work_order(todo: list[Candidate], parallel: bool) -> list[Candidate]:
    """The order to simulate points in, by their expected cost (``layer_passes``). One worker:
    the cheapest first, so an interrupted sweep has finished as many points as it could.
    Several: the most expensive first (longest processing time first), so that the long
    points do not come last on one worker while the others wait; handed to whichever worker
    is free, this ends within 4/3 of the best possible time (Graham, SIAM J. Appl. Math. 17,
    1969) where cheapest first can leave one worker with the longest point at the end."""
    if parallel:
        return sorted(todo, key=lambda c: (-layer_passes(c.job), c.index))
    return sorted(todo, key=lambda c: (layer_passes(c.job), c.index))


def run_seed(config: RunConfig) -> int:
    """The run's seed, where a section gives one (step simulations draw no random numbers)."""
    for section in ("failures", "simulation"):
        value = config.sections.get(section)
        if isinstance(value, Mapping) and isinstance(value.get("seed"), int):
            return value["seed"]
    return 0


def best_key(store: RunStore) -> str | None:
    """The fastest finished point (ties: lowest enumeration index)."""
    best: tuple[float, int, str] | None = None
    for key, row in store.read_points().items():
        if row["error"]:
            continue
        rank = (-float(row["tokens_per_s"]), int(row["index"]), key)
        best = rank if best is None or rank < best else best
    return None if best is None else best[2]


def job_of_row(config: RunConfig, row: Mapping) -> Job:
    """The job a stored point (or candidate) row describes."""
    s = config.job.strategy
    strategy = replace(s, tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                       cp=int(row["cp"]),
                       cp_algorithm=CpAlgorithm(row.get("cp_algorithm") or "ring"),
                       cp_a2a=int(row.get("cp_a2a") or 0), schedule=Schedule(row["schedule"]),
                       virtual_stages=int(row["virtual_stages"]),
                       sequence_parallel=str(row["sequence_parallel"]) == "True",
                       recompute=Recompute(row["recompute"]), zero=int(row["zero"]),
                       offload=Offload(row["offload"]), layers_per_stage=(),
                       recompute_layers=block_layers(s, Recompute(row["recompute"])))
    training = replace(config.job.training, micro_batch=int(row["micro_batch"]))
    return Job(config.job.model, training, strategy).checked(config.cluster.num_devices)


def write_best(store: RunStore, config: RunConfig) -> str | None:
    """Simulate the best point again with per-op records: its full report and its trace."""
    key = best_key(store)
    if key is None:
        return None
    best = store.path(BEST)
    if best.exists() and json.loads(best.read_text()).get("key") == key:
        return key
    row = store.read_points()[key]
    job = job_of_row(config, row)
    cfg = replace(config, job=job)
    trace = build_trace(job)
    result = simulate(trace, config.cluster, replace(simulation_options(config), record=True))
    report = StepReport(cfg, result, job.memory(), trace)
    with gzip.open(store.path(BEST_TRACE), "wt") as fh:
        json.dump(chrome_trace(result, trace), fh)
    atomic_write(best, json.dumps({"key": key, **report.to_dict()}, indent=2) + "\n")
    return key

"""One step of one config: trace, simulation and memory, joined into the report users read."""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs.fields import Fields, parse_enum
from clustersim.simulator import Faults, SimulationOptions, StepResult, simulate
from clustersim.simulator.cost.collectives import Algorithm
from clustersim.simulator.engine import NetworkMode
from clustersim.workloads.trace import CollectiveKind
from clustersim.workloads.builder import build_trace
from clustersim.workloads.cnn.builder import build_cnn_trace
from clustersim.workloads.memory import GIB, StageMemory
from clustersim.workloads.trace import Trace

from clustersim.analysis.config import RunConfig
from clustersim.analysis.limits import LAYER_PASS_BUDGET, check_budget, layer_passes

DEFAULT_OPTIONS = SimulationOptions()


@dataclass(frozen=True)
class StepReport:
    config: RunConfig
    result: StepResult
    memory: tuple[StageMemory, ...]
    trace: Trace

    def to_dict(self) -> dict:
        job, cluster = self.config.job, self.config.cluster
        out = {
            "name": self.config.name,
            "model": job.model.name,
            "parameters": job.model.parameters,
            "flops_per_step": job.model_flops_per_step,
            "hardware_flops_per_step": job.hardware_flops_per_step,
            "tokens_per_step": job.training.tokens_per_step,
            "micro_batches_per_pipeline": job.micro_batches,
            "cluster": {"gpu": cluster.device.name, "node": cluster.node.name,
                        "num_gpus": cluster.num_devices, "fabric": cluster.fabric.name},
            "strategy": job.strategy.to_dict(),
            "training": job.training.to_dict(),
        }
        for key, value in self.result.to_dict().items():
            out[key] = value
            if key == "peak_memory_gb":   # decimal GB, a stable key; every table prints GiB
                out["peak_memory_gib"] = value * 1e9 / GIB
        out["memory"] = [{"stage": s.stage, "layers": s.layers, **s.memory.to_dict(),
                          "offloaded": s.offloaded_bytes} for s in self.memory]
        out["memory_capacity_bytes"] = cluster.device.memory_bytes
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulationSection:
    """The config's optional ``simulation`` section, read once."""

    options: SimulationOptions
    """What the engine takes."""
    limit: bool
    """``simulation.limit`` (default true): keep the work budget of :mod:`limits`."""


def simulation_section(config: RunConfig) -> SimulationSection:
    f = Fields(config.sections.get("simulation", {}), "simulation")
    forced = f.sub("algorithms")
    algorithms = {parse_enum(CollectiveKind, kind, forced.at(str(kind))):
                  forced.choice(str(kind), Algorithm) for kind in forced.data}
    options = SimulationOptions(
        network=f.choice("network", NetworkMode, NetworkMode.FLOW),
        algorithms=algorithms,
        comm_slowdown_when_overlapped=f.number("comm_slowdown_when_overlapped", None, minimum=0.0)
        if f.has("comm_slowdown_when_overlapped") else None,
        compute_slowdown_when_overlapped=f.number("compute_slowdown_when_overlapped", None,
                                                  minimum=0.0)
        if f.has("compute_slowdown_when_overlapped") else None,
        expand=f.boolean("expand", False),
        record=True,
    )
    section = SimulationSection(options=options, limit=f.boolean("limit", True))
    f.done()
    return section


def simulation_options(config: RunConfig) -> SimulationOptions:
    """Engine options from the config's optional ``simulation`` section."""
    return simulation_section(config).options


def run_step(config: RunConfig, faults: Faults = Faults(),
             options: SimulationOptions | None = None, limit: bool = True) -> StepReport:
    """One step of ``config``; ``limit=False`` (``--no-limit``, or ``simulation.limit: false``
    in the config) lifts the work budget."""
    section = simulation_section(config)
    options = options or section.options
    if limit and section.limit:
        check_budget(layer_passes(config.job, options.one_class_per_rank(config.cluster.device)),
                     LAYER_PASS_BUDGET,
                     "the step's layer passes (micro-batches x layers x cp)",
                     "--no-limit (or simulation.limit: false)")
    trace = build_trace(config.job)
    result = simulate(trace, config.cluster, options, faults)
    return StepReport(config, result, config.job.memory(), trace)


class CnnStepReport(StepReport):
    """A 3D CNN step: samples instead of tokens, the spatial grid instead of TP/PP."""

    def to_dict(self) -> dict:
        job, cluster = self.config.job, self.config.cluster
        out = {"name": self.config.name, "model": job.model.name,
               "parameters": job.model.parameters,
               "flops_per_sample": job.model.training_flops_per_sample,
               "flops_per_step": job.model_flops_per_step,
               "samples_per_step": job.global_batch,
               "micro_batches_per_grid": job.micro_batches,
               "cluster": {"gpu": cluster.device.name, "node": cluster.node.name,
                           "num_gpus": cluster.num_devices, "fabric": cluster.fabric.name},
               "strategy": {"dp": job.dp, "spatial": list(job.grid.split)},
               "training": {"global_batch": job.global_batch, "micro_batch": job.micro_batch,
                            "precision": job.precision.value,
                            "optimizer": job.optimizer.value}}
        out.update(self.result.to_dict())
        out["samples_per_s"] = self.result.tokens_per_s
        out["peak_memory_gib"] = self.result.peak_memory_gb * 1e9 / GIB
        out["memory"] = [{"stage": s.stage, "layers": s.layers, **s.memory.to_dict(),
                          "offloaded": s.offloaded_bytes} for s in self.memory]
        out["memory_capacity_bytes"] = cluster.device.memory_bytes
        return out


def run_cnn_step(config: RunConfig) -> CnnStepReport:
    """One step of a 3D CNN config (``load_cnn_config``): the same trace -> engine path as a
    transformer's step; ``tokens_per_s`` counts samples."""
    trace = build_cnn_trace(config.job)
    result = simulate(trace, config.cluster, simulation_options(config))
    memory = (StageMemory(stage=0, layers=len(config.job.model.layers),
                          memory=config.job.memory(), offloaded_bytes=0.0),)
    return CnnStepReport(config, result, memory, trace)

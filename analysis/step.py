"""One step of one config: trace, simulation and memory, joined into the report users read; and
the same step with the config's ``faults`` (see :func:`step_faults`)."""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.errors import shown

from clustersim.hardware_specs.fields import Fields, parse_enum
from clustersim.hardware_specs.units import Quantity
from clustersim.simulator import Faults, SimulationOptions, StepResult, simulate
from clustersim.simulator.cost.collectives import Algorithm
from clustersim.simulator.engine import NetworkMode
from clustersim.simulator.fault_waits import FaultedStep, faulted_step
from clustersim.workloads.trace import CollectiveKind
from clustersim.workloads.builder import build_trace
from clustersim.workloads.cnn.builder import build_cnn_trace
from clustersim.workloads.memory import GIB, StageMemory
from clustersim.workloads.trace import CollectiveOp, Stream, Trace

from clustersim.analysis.config import RunConfig
from clustersim.analysis.limits import LAYER_PASS_BUDGET, check_budget, layer_passes
from clustersim.analysis.tables import render

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
                        "num_gpus": cluster.num_devices, "fabric": cluster.fabric.name}
            | ({"groups": [{"gpu": g.device.name, "node": g.node.name, "num_gpus": g.num_devices}
                           for g in cluster.groups]} if cluster.groups else {}),
            "strategy": job.strategy.to_dict(),
            "training": job.training.to_dict(),
        }
        for key, value in self.result.to_dict().items():
            out[key] = value
            if key == "peak_memory_gb":   # decimal GB, a stable key; every table prints GiB
                out["peak_memory_gib"] = value * 1e9 / GIB
        out["memory"] = [{"stage": s.stage, "layers": s.layers, **s.memory.to_dict(),
                          "offloaded": s.offloaded_bytes,
                          "offloaded_activations": s.offloaded_activation_bytes}
                         for s in self.memory]
        out["memory_capacity_bytes"] = cluster.smallest_memory_bytes
        out["dp_bytes_per_gpu"] = self.dp_bytes_per_gpu
        return out

    @property
    def dp_bytes_per_gpu(self) -> float:
        """Bytes of data-parallel collectives (gradient reductions, ZeRO gathers) one GPU issues
        per step, nccl-tests' buffer sizes, on the busiest program."""
        return max((sum(op.bytes for op in prog.ops if isinstance(op, CollectiveOp)
                        and op.stream is Stream.DP) for prog in self.trace.programs), default=0.0)


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
        out["memory_capacity_bytes"] = cluster.smallest_memory_bytes
        return out


def run_cnn_step(config: RunConfig) -> CnnStepReport:
    """One step of a 3D CNN config (``load_cnn_config``): the same trace -> engine path as a
    transformer's step; ``tokens_per_s`` counts samples."""
    trace = build_cnn_trace(config.job)
    result = simulate(trace, config.cluster, simulation_options(config))
    memory = (StageMemory(stage=0, layers=len(config.job.model.layers),
                          memory=config.job.memory(), offloaded_bytes=0.0),)
    return CnnStepReport(config, result, memory, trace)


# --- faults: single ranks slow in every step --------------------------------------------------
_FRACTIONS = {"gpu_clock": ("compute_slowdown", "GPU at {:g}x clock"),
              "nic_bandwidth": ("nic_slowdown", "NIC at {:g}x bandwidth"),
              "nvlink_bandwidth": ("nvlink_slowdown", "NVLink at {:g}x bandwidth")}
"""Fractions of nominal speed (0 < f <= 1); the engine takes their inverse as a stretch."""
_TIMES = {"launch_overhead": ("launch_overhead_s", "host launch {:.0f} us per kernel", 1e6),
          "data_loader_stall": ("input_stall_s", "input {:.0f} ms late", 1e3)}


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFaults:
    faults: Faults
    described: tuple[str, ...]
    """One line per fault, e.g. ``rank 17: GPU at 0.7x clock``."""


def step_faults(config: RunConfig) -> StepFaults | None:
    """The config's ``faults`` section (None when it has none): single ranks that are slow in
    every step.

    ```yaml
    faults:
      - {rank: 17, gpu_clock: 0.7}             # a GPU at 70% of its clock: its compute takes 1/0.7
      - {rank: 300, nic_bandwidth: 0.5}        # its NIC (or cable) at half bandwidth
      - {rank: 301, nvlink_bandwidth: 0.25}    # its NVLink at a quarter
      - {rank: 302, launch_overhead: 40 us}    # a slow host: CPU time per kernel launch
      - {rank: 303, data_loader_stall: 150 ms} # its input arrives late every step
    ```
    The step engine runs the job with and without them (the same engine path as the ``failures``
    command's straggler study, ``simulator.engine.Faults``) and
    :mod:`clustersim.simulator.fault_waits` says whose compute or waits grew. Every error names its
    field, e.g. ``faults[0].gpu_clock``.
    """
    if "faults" not in config.sections:
        return None
    raw = config.sections["faults"]
    if not isinstance(raw, list) or not raw:
        raise SpecError("faults", f"expected a list of faults such as [{{rank: 17, gpu_clock: "
                                  f"0.7}}], got {shown(raw)}")
    world = config.job.strategy.world_size
    values: dict[str, dict[int, float]] = {}
    described = []
    for i, entry in enumerate(raw):
        f = Fields(entry, f"faults[{i}]").only(("rank", *_FRACTIONS, *_TIMES))
        rank = f.integer("rank", minimum=0, maximum=world - 1)
        given = [k for k in (*_FRACTIONS, *_TIMES) if f.has(k)]
        if not given:
            raise SpecError(f.at("rank"), "a fault needs one of: "
                            + ", ".join((*_FRACTIONS, *_TIMES)))
        for key in given:
            if key in _FRACTIONS:
                attr, text = _FRACTIONS[key]
                fraction = f.number(key, minimum=1e-3, maximum=1.0)
                value, shown_value = 1.0 / fraction, fraction
            else:
                attr, text, scale = _TIMES[key]
                value = f.quantity(key, Quantity.TIME)
                shown_value = value * scale
            per_rank = values.setdefault(attr, {})
            if rank in per_rank:
                raise SpecError(f.at(key), f"rank {rank} already has a {key} fault")
            per_rank[rank] = value
            described.append(f"rank {rank}: {text.format(shown_value)}")
        f.done()
    return StepFaults(faults=Faults(**values), described=tuple(described))


def run_faulted_step(config: RunConfig, faults: StepFaults,
                     limit: bool = True) -> tuple[StepReport, FaultedStep]:
    """The step with the faults (its report, as ``simulate`` prints it) and its comparison with
    the healthy step."""
    section = simulation_section(config)
    options = section.options
    if limit and section.limit:
        check_budget(2 * layer_passes(config.job,
                                      options.one_class_per_rank(config.cluster.device)),
                     LAYER_PASS_BUDGET,
                     "the step's layer passes (micro-batches x layers x cp), healthy and faulted",
                     "--no-limit (or simulation.limit: false)")
    trace = build_trace(config.job)
    step = faulted_step(trace, config.cluster, faults.faults, options)
    report = StepReport(config, step.faulted, config.job.memory(), trace)
    return report, step


def fault_summary(faults: StepFaults, step: FaultedStep, rows: int = 10) -> str:
    """The text ``simulate`` prints after the step's summary."""
    h, f = step.healthy.step_time_s, step.faulted.step_time_s
    lines = ["", "Faults (every step)"] + [f"  {d}" for d in faults.described]
    lines.append(f"step time {h:.3f} s healthy -> {f:.3f} s with the faults "
                 f"({step.lost_s:+.3f} s, {100 * (f / h - 1):+.1f}%)")
    table = [(g.group, len(g.ranks), ", ".join(g.programs) if len(g.programs) < 4
              else f"{len(g.programs)} stages", g.part if g.part in ("compute", "bubble",
              "optimizer", "other") else f"{g.part} wait", f"+{g.grown_s:.4f}")
             for g in step.grown[:rows]]
    if table:
        lines.append("")
        lines.append(render(("who (vs the healthy step)", "ranks", "stages", "grew", "seconds"),
                            table, title="Where the lost time shows up: compute and waits that "
                                         "grew, largest first"))
        if len(step.grown) > rows:
            lines.append(f"... and {len(step.grown) - rows} smaller (all in --json)")
    else:
        lines.append("no rank's compute or waits grew")
    return "\n".join(lines)

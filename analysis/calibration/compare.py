"""Measured versus predicted: the calibration GPT trained for real under several strategies, and
the simulator run on exactly the same model, batch and strategy with a hardware profile.

The prediction goes through the same path as ``clustersim simulate``: a run config whose
cluster names the profile's device, the trace builder, and the engine, with the node's measured
collective fits (``simulator/cost/measured.py``). On a CPU host, ranks beyond the cores share
them: the device of a rank is then a time-shared core, with the core's rates divided by the
ranks per core (the real job's processes are time-sliced by the OS in the same proportion).
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from clustersim.hardware_specs import DeviceKind, DeviceSpec, NodeSpec, SpecError, load_catalog
from clustersim.hardware_specs.measured_comm import AlphaBeta
from clustersim.simulator import StepResult
from clustersim.simulator.cost.measured import MeasuredNetwork
from clustersim.simulator.engine import StepSimulation
from clustersim.workloads import Job, Strategy
from clustersim.workloads.strategy import Zero3Prefetch
from clustersim.workloads.builder import build_trace

from clustersim.analysis.config import RunConfig, config_from_mapping
from clustersim.analysis.step import simulation_options

CALIBRATION_MODEL = {
    "name": "calib-gpt", "layers": 4, "hidden": 256, "heads": 4, "vocab": 2048, "mlp": "gelu",
    "norm": "layernorm", "position": "learned", "max_positions": 128, "bias": False,
    "tied_embeddings": False,
}
"""A GPT small enough to train a step in about a second on two cores, big enough that its
GEMMs dominate (4.2M parameters; h = 256, 4 layers, 4 heads of 64)."""
CALIBRATION_TRAINING = {"seq_len": 128, "global_batch": 16, "micro_batch": 4, "precision": "fp32"}
DEFAULT_STRATEGIES = ("dp2", "fsdp2", "tp2", "pp2", "dp2xtp2")
"""DDP, ZeRO-3 (FSDP), Megatron TP, 1F1B PP, and DP x TP on 4 ranks. (``pp2xdp2`` runs too; on
a host with fewer cores than ranks its bubbles are filled by the other stage's ranks, which
the time-shared-core model does not see, so it is predicted too slow there.)"""

_TOKEN = re.compile(r"^(fsdp|dp|tp|pp)(\d+)$")


def parse_strategy(text: str, path: str = "--strategies") -> Strategy:
    """``dp2``, ``fsdp2`` (ZeRO-3), ``tp2``, ``pp2``, and products such as ``pp2xdp2``."""
    degrees = {"dp": 1, "tp": 1, "pp": 1}
    zero = 0
    for part in text.lower().split("x"):
        m = _TOKEN.match(part.strip())
        if not m:
            raise SpecError(path, f"{text!r}: expected parts like dp2, fsdp2, tp2, pp2 joined by "
                            "x (e.g. pp2xdp2)")
        axis, degree = m.group(1), int(m.group(2))
        if axis == "fsdp":
            axis, zero = "dp", 3
        if degree < 1 or degrees[axis] != 1:
            raise SpecError(path, f"{text!r}: {axis} given twice or < 1")
        degrees[axis] = degree
    return Strategy(zero=zero, **degrees)


def calibration_config(strategy: Strategy, device: str, catalog: Sequence[str | Path] = (),
                       model: dict | None = None, training: dict | None = None) -> RunConfig:
    """The run config of the calibration job on ``device`` (a catalog or profile entry)."""
    data = {"name": f"calibration-{device}", "model": model or CALIBRATION_MODEL,
            "training": training or CALIBRATION_TRAINING, "strategy": strategy.to_dict(),
            "cluster": {"gpu": device, "num_gpus": strategy.world_size}}
    config = config_from_mapping(data, catalog_dirs=catalog)
    if config.cluster.device.kind is DeviceKind.CPU and strategy.zero3_prefetch is Zero3Prefetch.ALL:
        # FSDP2 prefetches forward gathers only by the host running ahead of the device
        # (``fully_shard``: explicit forward prefetch is opt-in, backward prefetch the default);
        # a CPU rank computes on the thread that would issue them.
        ahead = replace(strategy, zero3_prefetch=Zero3Prefetch.BACKWARD)
        config = replace(config, job=replace(config.job, strategy=ahead))
    return config


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def time_shared(device: DeviceSpec, ranks_per_core: float) -> DeviceSpec:
    """A CPU core shared by ``ranks_per_core`` ranks: each gets that fraction of its rates."""
    if device.kind is not DeviceKind.CPU or ranks_per_core <= 1:
        return device
    share = 1.0 / ranks_per_core
    return replace(device, name=f"{device.name}/{ranks_per_core:g}",
                   peak_flops={d: v * share for d, v in device.peak_flops.items()},
                   memory_bandwidth=device.memory_bandwidth * share)


def time_shared_comm(node: NodeSpec, ranks_per_core: float) -> NodeSpec:
    """Measured communication between processes that share cores: gloo's copies, reductions
    and wake-ups are CPU work too, so each takes ``ranks_per_core`` times as long (on the
    2-core VM, a 2-rank all-reduce added 1.4-2.7x more to a compute loop with 4 processes
    than with 2). What a collective loses inside a step beyond that (``comm_in_training``:
    waiting for the peer and for data out of cache) is time its core gives to the other rank
    on it, so a shared core pays max(ranks per core, in-training factor) times the fit."""
    if ranks_per_core <= 1 or not node.measured_comm:
        return node
    return replace(node, measured_comm={
        op: AlphaBeta(latency_s=f.latency_s * ranks_per_core,
                      bandwidth=f.bandwidth / ranks_per_core)
        for op, f in node.measured_comm.items()},
        comm_in_training=max(1.0, node.comm_in_training / ranks_per_core))


def predict(config: RunConfig, cores: int, threads: int = 1) -> StepResult:
    """The simulated step of ``config``, its CPU devices (and their measured communication)
    shared when ranks outnumber cores."""
    cluster = config.cluster
    share = config.job.strategy.world_size * threads / cores
    if cluster.device.kind is DeviceKind.CPU:
        cluster = replace(cluster, device=time_shared(cluster.device, share),
                          node=time_shared_comm(cluster.node, share))
    options = simulation_options(config)
    sim = StepSimulation(build_trace(config.job), cluster, options,
                         network=MeasuredNetwork(cluster, options.algorithms))
    return sim.run()


def signed_error(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else (predicted - measured) / measured


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """One strategy: what the real job took and what the simulator predicts."""

    strategy: str
    measured_runs_s: tuple[float, ...]
    """Median step time of each repeat of the real job."""
    predicted_step_time_s: float
    baseline_step_time_s: float | None = None
    """Prediction with the uncalibrated catalog entry."""
    phases_s: dict | None = None
    losses: tuple[float, ...] = ()
    foreign_load: tuple[float | None, ...] = ()
    """Cores other processes kept busy during each repeat (mean over its timed steps)."""

    @property
    def measured_step_time_s(self) -> float:
        return statistics.median(self.measured_runs_s)

    @property
    def foreign_cores(self) -> float | None:
        """Mean load of other processes over the repeats, in cores (None: unknown)."""
        known = [x for x in self.foreign_load if x is not None]
        return statistics.fmean(known) if known else None

    @property
    def error(self) -> float:
        """Signed fraction: (predicted - measured) / measured."""
        return signed_error(self.predicted_step_time_s, self.measured_step_time_s)

    @property
    def baseline_error(self) -> float | None:
        return signed_error(self.baseline_step_time_s, self.measured_step_time_s)

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "measured_step_time_s": self.measured_step_time_s,
                "predicted_step_time_s": self.predicted_step_time_s, "error": self.error,
                "baseline_predicted_step_time_s": self.baseline_step_time_s,
                "baseline_error": self.baseline_error,
                "measured_runs_s": list(self.measured_runs_s),
                "foreign_load_cores": list(self.foreign_load),
                "phases_s": self.phases_s or {}, "losses": list(self.losses)}


def compare(strategies: Sequence[str], *, device: str, catalog: Sequence[str | Path],
            measure: Callable[[Job], object], repeats: int = 1, baseline: str | None = None,
            cores: int | None = None, threads: int = 1,
            check: Callable[[Job], None] = lambda _: None,
            progress: Callable[[str], None] = lambda _: None) -> list[Comparison]:
    """Each strategy: predicted with ``device`` (and ``baseline``), then measured ``repeats``
    times with ``measure(job)``, which returns a ``train.Measured``, the strategies taking turns.
    Predictions and ``check`` (can the real job run it?) come first, so a strategy either
    rejects fails before any real run."""
    cores = cores or host_cores()
    plans = []
    for text in strategies:
        strategy = parse_strategy(text)
        config = calibration_config(strategy, device, catalog)
        check(config.job)
        predicted = predict(config, cores, threads).step_time_s
        base = None
        if baseline:
            base = predict(calibration_config(strategy, baseline, catalog), cores,
                           threads).step_time_s
        plans.append((text, config.job, predicted, base))
    runs: dict[str, list] = {text: [] for text, *_ in plans}
    for i in range(repeats):  # round robin: a slow spell of the host hits every strategy alike
        for text, job, _, _ in plans:
            progress(f"{text}: run {i + 1} of {repeats}")
            runs[text].append(measure(job))
    out = []
    for text, _, predicted, base in plans:
        mine = sorted(runs[text], key=lambda r: r.step_time_s)
        out.append(Comparison(
            strategy=text, measured_runs_s=tuple(r.step_time_s for r in runs[text]),
            predicted_step_time_s=predicted, baseline_step_time_s=base,
            phases_s=mine[len(mine) // 2].phases_s, losses=mine[0].losses,
            foreign_load=tuple(getattr(r, "foreign_cores", None) for r in runs[text])))
    return out


def profile_device(path: str | Path) -> str:
    """The single device a profile file defines (its name is what configs refer to)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("--profile", f"no such file: {p}")
    devices = [name for (section, name), origin in load_catalog([p]).origin.items()
               if section == "devices" and Path(origin) == p.resolve()]
    if len(devices) != 1:
        raise SpecError("--profile", f"{p} defines {len(devices)} devices; expected one")
    return devices[0]

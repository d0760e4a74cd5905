"""Turn microbenchmark records into a calibrated hardware profile the catalog loads.

- Compute: every record becomes a point (size, work, time) in the simulator's own accounting
  (``workloads/layer_ops.py``): GEMMs 2mnk FLOPs; causal SDPA 4 b s^2 d heads / 2 FLOPs
  forward and 2.5x that backward (FlashAttention-2, Dao 2023, sec. 4); element-wise kernels
  by the bytes ``layer_ops`` counts for them; the Adam step (its own class: a fused Adam
  streams far faster than a GeLU per byte on CPUs) 28 bytes per FP32 parameter.
  Points are pooled in log-spaced size bins into ``size -> fraction of peak`` curves, each
  bin's fraction being total work over total time (weighted by how often a layer runs each
  kernel), so a layer's summed kernel times match what was measured.
- Communication: per operation, a least-squares fit of ``steps x latency + traffic /
  bandwidth`` (ring steps and traffic, ``simulator/cost/measured.py``) in relative error, with
  one pass that drops outliers (a measurement more than twice off the first fit: scheduler
  noise), to what each collective adds to a loop of compute bursts (``comm_bench``); and the
  device's slowdowns of compute and communication while both run, from an asynchronous
  all-reduce timed during GEMMs (``overlap_slowdowns``).

- In training: a whole step of a reference GPT, timed on every rank at once, against the step
  the fitted curves predict for it; the ratio becomes the device's ``in_training`` factor
  (caches shared with the other ranks, a working set beyond them, autograd's bookkeeping).
  The same GPT tensor-parallel over the ranks, less its predicted compute, over its
  all-reduces' fitted time, is the node's ``comm_in_training``: a collective inside a step
  costs more than between two GEMMs (1.5-2x on the 2-core VM: its buffers and gloo's are out
  of cache, the peer arrives later). Both reference jobs differ in shape from what
  ``validate`` trains.

The profile keeps the base entry's datasheet fields (memory size, TDP, node layout) and
replaces what was measured; it is stamped with the microbenchmark's provenance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import yaml

from clustersim.hardware_specs import DeviceSpec, Dtype, EfficiencyCurve, NodeSpec, OpClass, SpecError
from clustersim.hardware_specs.device import DeviceEfficiency
from clustersim.hardware_specs.efficiency import MEASURED_AS, MEMORY_BOUND
from clustersim.hardware_specs.measured_comm import AlphaBeta, CommOp
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.simulator.cost.measured import measured_time, ring_steps_and_traffic
from clustersim.workloads import Job, Strategy
from clustersim.workloads.builder import build_trace
from clustersim.workloads.model import from_mapping
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, ComputeOp
from clustersim.workloads.training import training_from_mapping

ELEMENT_BYTES = 4.0
"""The microbenchmarks run FP32 tensors (``layer_ops``: FP32 activations are 4 bytes)."""
ELEMENTWISE_PASSES = {
    "layernorm.fwd": 2.0,       # norm1, norm2, final_norm: read x, write y
    "layernorm.bwd": 3.0,       # backward of an element-wise kernel: 1.5x its traffic
    "gelu.fwd": 2.0,            # activation
    "gelu.bwd": 3.0,
    "residual.fwd": 3.0,        # residual1, residual2 (no dropout)
    "layout.fwd": 2.0,          # qkv_layout, attn_out_layout
    "cross_entropy.fwd": 3.0,   # FP32 logits: cast, softmax, loss
    "cross_entropy.bwd": 2.0,
}
"""Tensors of the kernel's size that ``workloads/layer_ops.py`` counts as read or written."""
ELEMENTWISE_WEIGHT = {"layernorm.fwd": 2.0, "layernorm.bwd": 2.0, "gelu.fwd": 1.0,
                      "gelu.bwd": 1.0, "residual.fwd": 2.0, "layout.fwd": 2.0,
                      "cross_entropy.fwd": 1.0, "cross_entropy.bwd": 1.0}
"""How often a transformer layer (or, for the loss, a step) runs a kernel: its weight when
kernels of one size bin are pooled."""
REQUIRED = (OpClass.MATMUL, OpClass.ATTENTION, OpClass.ELEMENTWISE)
"""Op classes a profile needs curves of; the others fall back to element-wise work's."""
TRANSCENDENTAL_OPS = frozenset(("gelu.fwd", "gelu.bwd", "cross_entropy.fwd", "cross_entropy.bwd"))
"""The measured kernels whose curve is ``OpClass.TRANSCENDENTAL`` (erf, exp and log per
element), as ``workloads/layer_ops.py`` classes the activation and the loss."""
ADAM_BYTES_PER_PARAM = 28.0
"""``layer_ops.optimizer_step`` for FP32 training: read master, m, v, gradient; write master,
m, v (16 + 12 bytes)."""
IN_TRAINING_MIN = 0.05
"""Smallest in-training factor the catalog accepts."""
COMM_IN_TRAINING_MIN, COMM_IN_TRAINING_MAX = 0.5, 4.0
"""Range accepted for the in-training slowdown of collectives (outside it, a measurement went
wrong: the host was busy with something else)."""
MAX_LOST = 0.9
"""Largest share of an overlapped transfer's time that compute may lose (slowdown 9)."""
BINS_PER_DECADE = 3
MAX_FRACTION = 1.5
"""Largest fraction a curve may hold (``EfficiencyCurve``); a faster measurement raises the
profile's peak instead (boost clocks, data in cache)."""


@dataclass(frozen=True, slots=True)
class Point:
    size: float
    """FLOPs (matmul, attention) or bytes (element-wise) of one kernel."""
    work: float
    """What the rate counts: FLOPs, or bytes."""
    time_s: float
    weight: float = 1.0


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, backward: bool) -> float:
    """Causal flash attention: half of 4 s^2 d per head forward; backward 2.5x (FA-2 sec. 4)."""
    forward = 4.0 * batch * heads * seq * seq * head_dim * 0.5
    return 2.5 * forward if backward else forward


def compute_points(records: Iterable[Mapping]) -> dict[OpClass, list[Point]]:
    """Records of the compute microbenchmarks as points of each op class."""
    out: dict[OpClass, list[Point]] = {op: [] for op in OpClass}
    for r in records:
        kind, t = r.get("kind"), float(r.get("time_s", 0.0))
        if t <= 0:
            continue
        if kind == "matmul":
            flops = 2.0 * r["m"] * r["n"] * r["k"]
            out[OpClass.MATMUL].append(Point(flops, flops, t))
        elif kind == "attention":
            flops = attention_flops(r["batch"], r["heads"], r["seq"], r["head_dim"],
                                    r["pass"] == "bwd")
            out[OpClass.ATTENTION].append(Point(flops, flops, t))
        elif kind == "elementwise" and r["op"] in ELEMENTWISE_PASSES:
            nbytes = ELEMENTWISE_PASSES[r["op"]] * r["elements"] * ELEMENT_BYTES
            op = (OpClass.TRANSCENDENTAL if r["op"] in TRANSCENDENTAL_OPS
                  else OpClass.ELEMENTWISE)
            out[op].append(Point(nbytes, nbytes, t, ELEMENTWISE_WEIGHT[r["op"]]))
        elif kind == "optimizer":
            nbytes = ADAM_BYTES_PER_PARAM * r["params"]
            out[OpClass.OPTIMIZER].append(Point(nbytes, nbytes, t))
    return out


def pooled_rates(points: list[Point]) -> list[tuple[float, float]]:
    """(size, rate) per log-spaced size bin: weighted total work over weighted total time,
    at the bin's weighted geometric-mean size; sizes increasing."""
    bins: dict[int, list[Point]] = {}
    for p in points:
        bins.setdefault(math.floor(math.log10(p.size) * BINS_PER_DECADE), []).append(p)
    out = []
    for key in sorted(bins):
        pts = bins[key]
        w = sum(p.weight for p in pts)
        size = math.exp(sum(p.weight * math.log(p.size) for p in pts) / w)
        rate = sum(p.weight * p.work for p in pts) / sum(p.weight * p.time_s for p in pts)
        out.append((size, rate))
    return out


def curve(rates: list[tuple[float, float]], peak: float) -> EfficiencyCurve:
    return EfficiencyCurve(tuple(s for s, _ in rates),
                           tuple(min(MAX_FRACTION, r / peak) for _, r in rates))


def _peak_for(rates: Iterable[float], nominal: float) -> float:
    """The nominal peak, unless a measurement exceeds it by more than a curve can hold."""
    top = max(rates, default=0.0)
    return top if top > MAX_FRACTION * nominal else nominal


def fit_alpha_beta(points: list[tuple[int, float, float]], op: CommOp) -> AlphaBeta:
    """Least-squares ``steps x latency + traffic / bandwidth`` over (world, bytes, time) points,
    in relative error; points more than 2x off the first fit are dropped once."""
    if len(points) < 2:
        raise SpecError(f"measured_comm.{op.value}", f"needs at least 2 measurements, got "
                        f"{len(points)}")
    rows = np.array([ring_steps_and_traffic(op, w) for w, _, _ in points], dtype=float)
    nbytes = np.array([b for _, b, _ in points], dtype=float)
    times = np.array([t for _, _, t in points], dtype=float)
    design = np.column_stack([rows[:, 0], rows[:, 1] * nbytes])
    keep = np.ones(len(points), dtype=bool)
    for _ in range(2):
        alpha, inv_beta = _solve(design[keep], times[keep])
        predicted = design @ np.array([alpha, inv_beta])
        ratio = predicted / times
        keep = (ratio < 2.0) & (ratio > 0.5)
        if keep.sum() < 2:
            break
    if inv_beta <= 0:
        raise SpecError(f"measured_comm.{op.value}", "time does not grow with message size; "
                        "measure larger messages")
    return AlphaBeta(latency_s=alpha, bandwidth=1.0 / inv_beta)


def _solve(design: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Non-negative least squares in relative error for two unknowns."""
    scaled = design / times[:, None]
    target = np.ones(len(times))
    (alpha, inv_beta), *_ = np.linalg.lstsq(scaled, target, rcond=None)
    if alpha < 0:
        alpha = 0.0
        inv_beta = float(np.dot(scaled[:, 1], target) / np.dot(scaled[:, 1], scaled[:, 1]))
    elif inv_beta < 0:
        inv_beta = 0.0
        alpha = float(np.dot(scaled[:, 0], target) / np.dot(scaled[:, 0], scaled[:, 0]))
    return float(alpha), float(inv_beta)


def comm_fits(records: Iterable[Mapping]) -> dict[CommOp, AlphaBeta]:
    by_op: dict[CommOp, list[tuple[int, float, float]]] = {}
    for r in records:
        if r.get("kind") == "collective" and r["time_s"] > 0:
            by_op.setdefault(CommOp(r["op"]), []).append((r["world"], r["bytes"], r["time_s"]))
    return {op: fit_alpha_beta(pts, op) for op, pts in sorted(by_op.items(), key=lambda kv: kv[0].value)}


def overlap_slowdowns(records: Iterable[Mapping],
                      fits: Mapping[CommOp, AlphaBeta]) -> tuple[float, float] | None:
    """(compute, communication) slowdowns while both run, in the engine's terms, from the
    ``overlap`` records (an asynchronous all-reduce during a run of GEMMs): compute loses
    ``s / (1 + s)`` of the time the transfer is in flight, so ``s / (1 + s)`` is the GEMMs'
    extra time over the transfer's time, pooled over sizes; the transfer's bandwidth term
    stretches by the pooled ratio of its time there (less the fitted latency) to the fitted
    transfer time. None without records or an all-reduce fit."""
    rows = [r for r in records if r.get("kind") == "overlap" and r.get("transfer_s", 0) > 0]
    fit = fits.get(CommOp.ALL_REDUCE)
    if not rows or fit is None:
        return None
    lost = min(MAX_LOST, max(0.0, sum(r["extra_s"] for r in rows)
                             / sum(r["transfer_s"] for r in rows)))
    stretched = fitted = 0.0
    for r in rows:
        steps, traffic = ring_steps_and_traffic(CommOp.ALL_REDUCE, r["world"])
        stretched += max(0.0, r["transfer_s"] - steps * fit.latency_s)
        fitted += traffic * r["bytes"] / fit.bandwidth
    return lost / (1.0 - lost), max(0.0, stretched / fitted - 1.0)


def in_training_factor(records: Iterable[Mapping], device: DeviceSpec) -> float | None:
    """Predicted over measured time of the reference training step (``reference_step``
    records): the fraction of isolated-kernel speed kernels keep inside a real step, applied
    to every op class. None without such a record."""
    ref = [r for r in records if r.get("kind") == "reference_step" and r.get("time_s", 0) > 0
           and r.get("tp", 1) == 1]
    if not ref:
        return None
    factors = [reference_prediction(r, device) / r["time_s"] for r in ref]
    return min(MAX_FRACTION, max(IN_TRAINING_MIN, statistics.median(factors)))


def reference_job(model: Mapping, training: Mapping, tp: int = 1) -> Job:
    """The reference GPT's job, tensor-parallel over ``tp`` ranks."""
    return Job(from_mapping(model, "microbench.reference.model"),
               training_from_mapping(training, "microbench.reference.training"),
               Strategy(tp=tp)).checked(tp)


def _reference_ops(record: Mapping) -> tuple:
    """The ops of rank 0 of a ``reference_step`` record's job."""
    job = reference_job(record["model"], record["training"], int(record.get("tp", 1)))
    return build_trace(job).programs[0].ops


def reference_prediction(record: Mapping, device: DeviceSpec) -> float:
    """The compute time of a ``reference_step`` record's job, one rank on ``device``."""
    model = ComputeModel(device)
    return sum(model.op_time(op) for op in _reference_ops(record) if isinstance(op, ComputeOp))


def comm_in_training_factor(records: Iterable[Mapping], device: DeviceSpec,
                            fits: Mapping[CommOp, AlphaBeta]) -> float | None:
    """How much longer a collective takes inside a training step than between compute bursts:
    the tensor-parallel reference step (its all-reduces block it, nothing overlaps) less its
    predicted compute, over its all-reduces' fitted time. None without such a record."""
    ref = [r for r in records if r.get("kind") == "reference_step" and r.get("time_s", 0) > 0
           and r.get("tp", 1) > 1]
    fit = fits.get(CommOp.ALL_REDUCE)
    if not ref or fit is None:
        return None
    factors = []
    for r in ref:
        ops = _reference_ops(r)
        comm = sum(measured_time(fit, CommOp.ALL_REDUCE, int(r["tp"]), op.bytes)
                   for op in ops if isinstance(op, CollectiveOp)
                   and op.kind is CollectiveKind.ALL_REDUCE)
        if comm > 0:
            factors.append((r["time_s"] - reference_prediction(r, device)) / comm)
    if not factors:
        return None
    return min(COMM_IN_TRAINING_MAX, max(COMM_IN_TRAINING_MIN, statistics.median(factors)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """A calibrated device and node, ready to write as a catalog file."""

    device: DeviceSpec
    node: NodeSpec
    points: Mapping[OpClass, int]
    """Measurements behind each curve."""


def fit_profile(doc: Mapping, base_device: DeviceSpec, base_node: NodeSpec, name: str) -> Profile:
    """The calibrated profile ``name`` from a microbenchmark document (``microbench.json``)."""
    records = doc.get("records")
    if not isinstance(records, list) or not records:
        raise SpecError("microbench.records", "no measurements found")
    points = compute_points(records)
    missing = [op.value for op, pts in points.items() if len(pts) < 2 and op in REQUIRED]
    if missing:
        raise SpecError("microbench.records", f"too few {', '.join(missing)} measurements to "
                        "fit a curve")
    # A class without measurements of its own uses element-wise work's curve (``for_class``).
    rates = {op: pooled_rates(pts) for op, pts in points.items() if len(pts) >= 2}
    dtype = Dtype.FP32
    peak = _peak_for((r for op in (OpClass.MATMUL, OpClass.ATTENTION) for _, r in rates[op]),
                     base_device.peak_flops.get(dtype, 0.0) or max(base_device.peak_flops.values()))
    bandwidth = _peak_for((r for op in MEMORY_BOUND for _, r in rates.get(op, ())),
                          base_device.memory_bandwidth)
    curves = {op: curve(r, bandwidth if op in MEMORY_BOUND else peak) for op, r in rates.items()}
    best = {op: min(1.0, max(c.fractions)) for op, c in curves.items()}
    efficiency = DeviceEfficiency(matmul=best[OpClass.MATMUL], attention=best[OpClass.ATTENTION],
                                  memory=best[OpClass.ELEMENTWISE], curves=curves)
    provenance = {str(k): str(v) for k, v in doc.get("provenance", {}).items()}
    provenance["base"] = base_device.name
    device = replace(base_device, name=name, peak_flops={**base_device.peak_flops, dtype: peak},
                     memory_bandwidth=bandwidth, efficiency=efficiency, default_node=name,
                     provenance=provenance,
                     source=f"calibrated by clustersim calibrate from {base_device.name}")
    factor = in_training_factor(records, device)
    if factor is not None:
        device = replace(device, efficiency=replace(
            efficiency, in_training={op: factor for op in OpClass if op not in MEASURED_AS}))
    fits = comm_fits(records)
    overlap = overlap_slowdowns(records, fits)
    if overlap is not None:
        device = replace(device, efficiency=replace(
            device.efficiency, compute_slowdown_when_overlapped=overlap[0],
            comm_slowdown_when_overlapped=overlap[1]))
    comm_factor = comm_in_training_factor(records, device, fits)
    node = replace(base_node, name=name, device=name, measured_comm=fits,
                   comm_in_training=1.0 if comm_factor is None else comm_factor,
                   source=f"calibrated by clustersim calibrate from {base_node.name}; "
                          f"{provenance.get('date', '')}")
    reduce_fit = fits.get(CommOp.ALL_REDUCE)
    if reduce_fit is not None:
        node = replace(node, collective_latency_s=reduce_fit.latency_s,
                       scale_up_bandwidth=reduce_fit.bandwidth, scale_up_efficiency=1.0)
    return Profile(device=device, node=node, points={op: len(p) for op, p in points.items()})


# --- writing -------------------------------------------------------------------------------
def _g(value: float) -> str:
    return f"{value:.6g}"


def profile_document(profile: Profile) -> dict:
    """The catalog YAML of a profile (sections ``devices`` and ``nodes``), SI numbers."""
    d, n = profile.device, profile.node
    eff = d.efficiency
    device = {
        "kind": d.kind.value, "vendor": d.vendor, "source": d.source,
        "provenance": dict(d.provenance),
        "peak_flops": {dt.value: f"{_g(v)} FLOPS" for dt, v in d.peak_flops.items()},
        "memory": f"{_g(d.memory_bytes)} B", "memory_bandwidth": f"{_g(d.memory_bandwidth)} B/s",
        "l2_cache": f"{_g(d.l2_cache_bytes)} B", "compute_units": d.compute_units,
        "scale_up_generation": d.scale_up_generation,
        "scale_up_bandwidth": f"{_g(d.scale_up_bandwidth)} B/s", "tdp": f"{_g(d.tdp_w)} W",
        "default_node": d.default_node,
        "efficiency": {
            "matmul": float(_g(eff.matmul)), "attention": float(_g(eff.attention)),
            "memory": float(_g(eff.memory)),
            "compute_slowdown_when_overlapped": float(_g(eff.compute_slowdown_when_overlapped)),
            "comm_slowdown_when_overlapped": float(_g(eff.comm_slowdown_when_overlapped)),
            "in_training": {op.value: float(_g(v)) for op, v in eff.in_training.items()},
            "curves": {op.value: {"sizes": [float(_g(s)) for s in c.sizes],
                                  "fractions": [float(_g(f)) for f in c.fractions]}
                       for op, c in eff.curves.items()},
        },
    }
    node = {
        "source": n.source, "device": n.device, "devices_per_node": n.devices_per_node,
        "scale_up_kind": n.scale_up_kind.value,
        "scale_up_bandwidth": f"{_g(n.scale_up_bandwidth)} B/s",
        "scale_up_latency": f"{_g(n.scale_up_latency_s)} s",
        "scale_up_efficiency": n.scale_up_efficiency,
        "collective_latency": f"{_g(n.collective_latency_s)} s",
        "measured_comm": {op.value: {"latency": f"{_g(f.latency_s)} s",
                                     "bandwidth": f"{_g(f.bandwidth)} B/s"}
                          for op, f in n.measured_comm.items()},
        "comm_in_training": float(_g(n.comm_in_training)),
        "nvls": n.nvls, "nic_count": n.nic_count, "nic_bandwidth": f"{_g(n.nic_bandwidth)} B/s",
        "nic_kind": n.nic_kind.value, "nic_latency": f"{_g(n.nic_latency_s)} s",
        "nic_efficiency": n.nic_efficiency, "pcie_generation": n.pcie_generation,
        "pcie_bandwidth": f"{_g(n.pcie_bandwidth)} B/s", "host_memory": n.host_memory,
        "local_storage": n.local_storage,
    }
    return {"devices": {d.name: device}, "nodes": {n.name: node}}


def profile_yaml(profile: Profile) -> str:
    p = profile.device.provenance
    header = (
        f"# Calibrated hardware profile {profile.device.name!r}, written by `clustersim calibrate "
        "fit`.\n"
        f"# Measured on {p.get('device', '?')} ({p.get('driver', '?')}), torch "
        f"{p.get('torch', '?')}, {p.get('nccl', p.get('gloo', ''))}, {p.get('date', '?')}.\n"
        f"# Curves: {', '.join(f'{op.value} from {k} kernels' for op, k in profile.points.items() if k)}."
        "\n# Use it with --catalog THIS_FILE (device and node are both named "
        f"{profile.device.name!r}).\n")
    return header + yaml.safe_dump(profile_document(profile), sort_keys=False, width=100)

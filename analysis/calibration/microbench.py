"""Measure the hardware at hand with real torch: GEMMs of transformer shapes, attention (SDPA),
element-wise kernels, the optimizer step, and collectives over message and world sizes
(``comm_bench``: between and during compute, as training runs them).

Compute kernels run on every rank at once, one rank per core (CPU) or device (GPU), with a
barrier before each item: the host is as loaded as during training, so shared caches, memory
bandwidth and clocks are those a training step gets. A record keeps what was run and how long
it took (the median of several trials); ``fit`` turns records into a hardware profile.
Backward kernels are timed through ``torch.autograd.grad`` with the forward graph kept, so a
record holds that pass alone.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from clustersim.analysis.calibration.comm_bench import comm_and_overlap_rank
from clustersim.analysis.calibration.fit import reference_job
from clustersim.analysis.calibration.gpt import Stage, TensorGroup
from clustersim.analysis.calibration.hostload import LoadMeter
from clustersim.analysis.calibration.launch import RankEnv, run_ranks, synchronize
from clustersim.analysis.calibration.train import batches

MICROBENCH_VERSION = 1
TRIAL_S = 0.01
"""Each trial repeats a kernel until it has run about this long (timer resolution, noise)."""
MAX_FLOPS = 2e9
"""Largest GEMM or attention measured (beyond it the curves stay flat, as measured sizes show)."""
MAX_ELEMENTS = 1 << 22
"""Largest element-wise kernel measured."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What to measure; ``quick`` keeps a small, still fittable subset (tests, smoke runs)."""

    quick: bool = False
    trials: int = 5
    world_sizes: tuple[int, ...] = (2,)

    @property
    def hiddens(self) -> tuple[int, ...]:
        return (256, 512) if self.quick else (128, 256, 512, 1024)

    @property
    def token_counts(self) -> tuple[int, ...]:
        return (512,) if self.quick else (128, 512, 2048)

    @property
    def message_bytes(self) -> tuple[int, ...]:
        top = 22 if self.quick else 24
        return tuple(1 << e for e in range(10, top + 1, 2))

    @property
    def overlap_bytes(self) -> tuple[int, ...]:
        """All-reduces timed while the ranks compute (DDP buckets, FSDP layers: MBs)."""
        return (1 << 20, 1 << 22) if self.quick else (1 << 20, 1 << 22, 1 << 24)

    @property
    def comm_trials(self) -> int:
        """Communication is noisier than compute on a shared host: more trials."""
        return self.trials + 2

    @property
    def optimizer_params(self) -> tuple[int, ...]:
        return (1 << 18, 1 << 22) if self.quick else (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)


def _median_time(fn: Callable[[], object], env: RankEnv, trials: int) -> float:
    """Median over trials of the mean time of one call (calls repeated to fill a trial)."""
    fn()
    synchronize(env)
    start = time.perf_counter()
    fn()
    synchronize(env)
    once = max(time.perf_counter() - start, 1e-7)
    reps = max(1, min(1000, int(TRIAL_S / once)))
    times = []
    for _ in range(trials):
        synchronize(env)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize(env)
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times)


def _backward(y: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    grad = torch.randn_like(y)
    return lambda: torch.autograd.grad(y, inputs, grad, retain_graph=True)


def _gemm_items(plan: Plan, device) -> list[tuple[dict, Callable[[], object]]]:
    """Forward (x W^T), data-gradient (dY W) and weight-gradient (dY^T X) GEMMs of a transformer
    layer's projections (QKV, output, fc1, fc2) and their tensor-parallel halves."""
    items = []
    shapes = set()
    for h in plan.hiddens:
        for t in plan.token_counts:
            for n, k in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h), (3 * h // 2, h), (2 * h, h)):
                shapes.add((t, n, k))
    for t, n, k in sorted(shapes):
        if 2.0 * t * n * k > MAX_FLOPS:
            continue
        x, w, dy = (torch.randn(t, k, device=device), torch.randn(n, k, device=device),
                    torch.randn(t, n, device=device))
        for layout, (m_, n_, k_), fn in (
                ("fwd", (t, n, k), lambda x=x, w=w: torch.mm(x, w.t())),
                ("dgrad", (t, k, n), lambda dy=dy, w=w: torch.mm(dy, w)),
                ("wgrad", (n, k, t), lambda dy=dy, x=x: torch.mm(dy.t(), x))):
            items.append(({"kind": "matmul", "layout": layout, "m": m_, "n": n_, "k": k_}, fn))
    return items


def _attention_items(plan: Plan, device) -> list[tuple[dict, Callable[[], object]]]:
    items = []
    seqs = (256, 512) if plan.quick else (128, 256, 512, 1024)
    for s in seqs:
        for heads in ((4,) if plan.quick else (2, 4, 8)):
            b, d = 4, 64
            if 2.0 * b * heads * s * s * d > MAX_FLOPS:
                continue
            q, k, v = (torch.randn(b, heads, s, d, device=device, requires_grad=True)
                       for _ in range(3))
            def fwd(q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            shape = {"kind": "attention", "batch": b, "heads": heads, "seq": s, "head_dim": d}
            items.append((shape | {"pass": "fwd"}, fwd))
            items.append((shape | {"pass": "bwd"}, _backward(fwd(), (q, k, v))))
    return items


def _elementwise_items(plan: Plan, device) -> list[tuple[dict, Callable[[], object]]]:
    """The memory-bound kernels of a layer, named as ``fit.ELEMENTWISE_PASSES`` counts them."""
    items = []
    tokens = (512, 4096) if plan.quick else (128, 512, 2048, 8192)
    for t in tokens:
        for h in plan.hiddens:
            if t * 4 * h > MAX_ELEMENTS:
                continue
            x = torch.randn(t, h, device=device, requires_grad=True)
            wide = torch.randn(t, 4 * h, device=device, requires_grad=True)
            ln_w = torch.ones(h, device=device, requires_grad=True)
            other = torch.randn(t, h, device=device)
            heads = torch.randn(4, t // 4, max(1, h // 64), min(64, h), device=device)
            ln = F.layer_norm(x, (h,), ln_w)
            gelu = F.gelu(wide)
            for op, elements, fn in (
                    ("layernorm.fwd", t * h, lambda x=x, w=ln_w, h=h: F.layer_norm(x, (h,), w)),
                    ("layernorm.bwd", t * h, _backward(ln, (x, ln_w))),
                    ("gelu.fwd", t * 4 * h, lambda w=wide: F.gelu(w)),
                    ("gelu.bwd", t * 4 * h, _backward(gelu, (wide,))),
                    ("residual.fwd", t * h, lambda x=x, o=other: x.detach() + o),
                    ("layout.fwd", t * h,
                     lambda a=heads: a.transpose(1, 2).contiguous())):
                items.append(({"kind": "elementwise", "op": op, "elements": elements}, fn))
    for t in ((512,) if plan.quick else (128, 512, 2048)):
        for vocab in ((4096,) if plan.quick else (1024, 4096, 16384)):
            if t * vocab > MAX_ELEMENTS:
                continue
            logits = torch.randn(t, vocab, device=device, requires_grad=True)
            target = torch.randint(0, vocab, (t,), device=device)
            loss = F.cross_entropy(logits, target)
            items.append(({"kind": "elementwise", "op": "cross_entropy.fwd",
                           "elements": t * vocab},
                          lambda lg=logits, tg=target: F.cross_entropy(lg, tg)))
            items.append(({"kind": "elementwise", "op": "cross_entropy.bwd",
                           "elements": t * vocab}, _backward(loss, (logits,))))
    return items


def _optimizer_items(plan: Plan, device) -> list[tuple[dict, Callable[[], object]]]:
    """Fused Adam over a flat parameter, as the training job runs it."""
    items = []
    for n in plan.optimizer_params:
        p = torch.nn.Parameter(torch.randn(n, device=device))
        p.grad = torch.randn_like(p)
        opt = torch.optim.Adam([p], lr=1e-3, fused=True)
        items.append(({"kind": "optimizer", "op": "adam", "params": n}, opt.step))
    return items


REFERENCE_MODEL = {"name": "reference-gpt", "layers": 2, "hidden": 384, "heads": 6,
                   "vocab": 1024, "mlp": "gelu", "position": "learned", "max_positions": 256}
REFERENCE_TRAINING = {"seq_len": 256, "global_batch": 4, "micro_batch": 2, "precision": "fp32"}
"""A whole training step, timed on every rank at once: how much slower kernels run inside a
step (a working set beyond the caches, the other ranks' memory traffic, autograd) than alone.
Deliberately another shape than the GPT that ``calibrate validate`` trains."""


def _reference_step(env: RankEnv, trials: int, tp: TensorGroup | None = None) -> dict:
    """The reference step: on every rank alone, or (``tp``) split over the ranks as Megatron
    tensor parallelism, whose all-reduces block the step and so show what a collective costs
    inside training."""
    tp = tp or TensorGroup()
    job = reference_job(REFERENCE_MODEL, REFERENCE_TRAINING, tp.size)
    device = env.torch_device()
    m = job.model
    stage = Stage(m, job.training.seq_len, range(m.layers), True, True, tp,
                  seed=0 if tp.size > 1 else env.rank).to(device)
    opt = torch.optim.Adam(stage.parameters(), lr=1e-3, fused=True)
    data = batches(job, 0, 0 if tp.size > 1 else env.rank, device)

    def step() -> None:
        for x, y in data:
            (stage(x, y) / len(data)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    dist.barrier()
    times = []
    for _ in range(2 * trials):
        synchronize(env)
        start = time.perf_counter()
        step()
        synchronize(env)
        times.append(time.perf_counter() - start)
    return {"kind": "reference_step", "model": REFERENCE_MODEL, "training": REFERENCE_TRAINING,
            "tp": tp.size, "time_s": statistics.median(times)}


def reference_tp_rank(env: RankEnv, trials: int) -> list[dict]:
    """The reference step tensor-parallel over all ranks (rank 0's record)."""
    return [_reference_step(env, trials, TensorGroup(dist.group.WORLD, env.world, env.rank))]


def compute_rank(env: RankEnv, plan: Plan) -> list[dict]:
    """Every compute item on this rank, in lockstep with the other ranks."""
    device = env.torch_device()
    gen = (_gemm_items, _attention_items, _elementwise_items, _optimizer_items)
    records = []
    for make in gen:
        for meta, fn in make(plan, device):
            dist.barrier()
            records.append(meta | {"time_s": _median_time(fn, env, plan.trials)})
    records.append(_reference_step(env, plan.trials))
    return records


def provenance(device: str, threads: int) -> dict:
    """What was measured, with what software, when."""
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "torch": torch.__version__, "os": f"{platform.system()} {platform.release()}",
           "threads_per_rank": str(threads)}
    if device == "cuda":
        out["device"] = torch.cuda.get_device_name(0)
        out["driver"] = f"CUDA {torch.version.cuda}"
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    else:
        out["device"] = _cpu_name()
        out["driver"] = f"kernel {platform.release()}"
        out["gloo"] = f"bundled with torch {torch.__version__}"
    return out


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_ranks(device: str) -> int:
    """One rank per core (CPU) or device (GPU)."""
    if device == "cuda":
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def run_microbench(plan: Plan, *, device: str = "cpu", ranks: int = 0,
                   threads: int = 1) -> dict:
    """Every measurement of ``plan``: compute on ``ranks`` ranks at once, then collectives on
    each world size of the plan. Returns the JSON-ready document ``fit`` reads."""
    ranks = ranks or default_ranks(device)
    meter = LoadMeter()
    per_rank = run_ranks(compute_rank, ranks, (plan,), device=device, threads=threads)
    load = {"compute": meter.foreign_cores()}
    records = []
    for i, first in enumerate(per_rank[0]):
        times = [r[i]["time_s"] for r in per_rank]
        records.append(first | {"time_s": statistics.median(times)})
    for world in plan.world_sizes:
        meter = LoadMeter()
        records += run_ranks(comm_and_overlap_rank, world,
                             (plan.message_bytes, plan.overlap_bytes, plan.comm_trials),
                             device=device, threads=threads)[0]
        if REFERENCE_MODEL["heads"] % world == 0:
            records += run_ranks(reference_tp_rank, world, (plan.trials,), device=device,
                                 threads=threads)[0]
        load[f"communication_world{world}"] = meter.foreign_cores()
    return {"version": MICROBENCH_VERSION, "provenance": provenance(device, threads),
            "setup": {"device": device, "compute_ranks": ranks, "threads_per_rank": threads,
                      "world_sizes": list(plan.world_sizes), "quick": plan.quick,
                      "trials": plan.trials, "foreign_load_cores": load},
            "records": records}

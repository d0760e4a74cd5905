"""The real training job: the calibration GPT under a hybrid-parallel strategy, timed step by step.

Each strategy runs for real with torch.distributed:
- data parallel: torch DDP (ZeRO-0; gradients all-reduced in buckets of one layer during the
  last micro-batch's backward, ``no_sync`` before) or ZeRO-3 through torch FSDP2
  (``fully_shard`` per layer: parameters all-gathered before each layer's forward and
  backward, gradients reduce-scattered every micro-batch);
- tensor parallel: Megatron column/row-parallel layers (``gpt.py``);
- pipeline parallel: 1F1B with isend/irecv between stages, in exactly the order
  ``workloads.strategies.pipeline.stage_order`` gives the simulator; with data parallelism as
  well, each layer's gradients are all-reduced as soon as the last micro-batch's backward has
  produced them (as Megatron-LM's own DDP does; torch DDP decides at forward time whether a
  backward synchronises, which 1F1B's interleaving of forwards and backwards breaks).

A step is timed from a barrier to the end of the optimizer step on every rank; the step time is
the slowest rank's, and the result the median over the steps after warm-up.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from clustersim.hardware_specs import SpecError
from clustersim.workloads import Job, Schedule
from clustersim.workloads.layer_ops import Pass
from clustersim.workloads.layout import Axis, ParallelLayout
from clustersim.workloads.stages import stage_plans
from clustersim.workloads.strategies.pipeline import stage_order

from clustersim.analysis.calibration.gpt import Stage, TensorGroup
from clustersim.analysis.calibration.hostload import host_busy_s
from clustersim.analysis.calibration.launch import RankEnv, synchronize


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """How a job is measured."""

    steps: int = 10
    """Timed steps, after warm-up."""
    warmup: int = 3
    seed: int = 0


def check_runnable(job: Job, path: str = "strategy") -> None:
    """The strategies the torch job implements; anything else is named, not half-run."""
    s = job.strategy
    if s.cp > 1 or s.ep > 1 or s.sequence_parallel or s.virtual_stages > 1:
        raise SpecError(path, "the calibration job runs dp, tp and pp (1F1B) only")
    if s.schedule is not Schedule.ONE_F_ONE_B:
        raise SpecError(f"{path}.schedule", f"the calibration job runs 1f1b, got {s.schedule.value}")
    if s.zero not in (0, 3):
        raise SpecError(f"{path}.zero", f"the calibration job runs zero 0 (DDP) or 3 (FSDP), "
                        f"got {s.zero}")
    if s.zero == 3 and (s.tp > 1 or s.pp > 1):
        raise SpecError(f"{path}.zero", "zero 3 (FSDP) runs with data parallelism alone")
    if s.tp > 1 and s.pp > 1:
        raise SpecError(path, "tp with pp needs Megatron's scatter/gather of activations between "
                        "stages, which the calibration job does not implement")
    if s.recompute.value != "none" or s.offload.value != "none":
        raise SpecError(path, "the calibration job runs without recompute and offload")


class _Groups:
    """Process groups of every axis; every rank creates every group, in the same order."""

    def __init__(self, layout: ParallelLayout, rank: int):
        self.layout, self.rank = layout, rank
        self.coords = layout.coords(rank)
        self.of: dict[Axis, object] = {}
        for axis in (Axis.TP, Axis.DP, Axis.PP):
            if layout.size(axis) == 1:
                continue
            seen = sorted({layout.group(axis, r) for r in range(layout.world_size)})
            for ranks in seen:
                group = dist.new_group(list(ranks))
                if rank in ranks:
                    self.of[axis] = group

    def pp_neighbour(self, step: int) -> int:
        coords = dict(self.coords)
        coords[Axis.PP] += step
        return self.layout.rank(coords)


class LayerGradients:
    """Data-parallel gradient averaging per layer during the last micro-batch's backward: when
    every parameter of a module has its gradient, one asynchronous all-reduce of them."""

    def __init__(self, modules: list[nn.Module], group, size: int):
        self.group, self.size = group, size
        self.armed = False
        self.pending: list[tuple[object, torch.Tensor, list[nn.Parameter]]] = []
        for module in modules:
            params = [p for p in module.parameters() if p.requires_grad]
            ready = {"count": 0}
            for p in params:
                p.register_post_accumulate_grad_hook(self._hook(params, ready))

    def _hook(self, params: list[nn.Parameter], ready: dict):
        def hook(_param: torch.Tensor) -> None:
            if not self.armed:
                return
            ready["count"] += 1
            if ready["count"] == len(params):
                ready["count"] = 0
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                work = dist.all_reduce(flat, group=self.group, async_op=True)
                self.pending.append((work, flat, params))
        return hook

    def finish(self) -> None:
        for work, flat, params in self.pending:
            work.wait()
            flat /= self.size
            offset = 0
            for p in params:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
        self.pending.clear()
        self.armed = False


def batches(job: Job, dp_rank: int, seed: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This replica's micro-batches of random tokens (inputs, next-token targets); the global
    batch is the same whatever the strategy."""
    t = job.training
    rng = np.random.default_rng(seed)
    tokens = torch.from_numpy(rng.integers(0, job.model.vocab, (t.global_batch, t.seq_len + 1)))
    per_replica = t.global_batch // job.strategy.dp
    mine = tokens[dp_rank * per_replica:(dp_rank + 1) * per_replica].to(device)
    return [(mb[:, :-1].contiguous(), mb[:, 1:].contiguous())
            for mb in mine.split(t.micro_batch)]


class _Runner:
    """One rank's model, optimizer and step."""

    def __init__(self, env: RankEnv, job: Job, seed: int):
        s, m = job.strategy, job.model
        self.env, self.job = env, job
        self.device = env.torch_device()
        layout = ParallelLayout(tp=s.tp, dp=s.dp, pp=s.pp)
        self.groups = g = _Groups(layout, env.rank)
        self.stage = g.coords[Axis.PP]
        plan = stage_plans(m, s)[self.stage]
        first_layer = sum(p.layers for p in stage_plans(m, s)[:self.stage])
        tp = TensorGroup(g.of.get(Axis.TP), s.tp, g.coords[Axis.TP])
        module = Stage(m, job.training.seq_len, range(first_layer, first_layer + plan.layers),
                       plan.has_embedding, plan.has_head, tp, seed).to(self.device)
        self.first, self.last = plan.has_embedding, plan.has_head
        self.reducer = None
        self.ddp = None
        if s.dp > 1 and s.zero == 3:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh(self.device.type, (s.dp,))
            for layer in module.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(module, mesh=mesh)
        elif s.dp > 1 and s.pp == 1:
            layer_mb = m.layer_params / s.tp * 4 / 2**20
            module = self.ddp = nn.parallel.DistributedDataParallel(
                module, process_group=g.of[Axis.DP], bucket_cap_mb=layer_mb)
        elif s.dp > 1:
            parts = [p for p in (module.embedding, *module.layers, module.head) if p is not None]
            self.reducer = LayerGradients(parts, g.of[Axis.DP], s.dp)
        self.module = module
        self.optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, fused=True)
        self.batches = batches(job, g.coords[Axis.DP], seed, self.device)
        self.phases: dict[str, float] = {}

    def _timed(self, phase: str, fn):
        start = time.perf_counter()
        out = fn()
        self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - start
        return out

    def step(self) -> float | None:
        """One optimizer step; the mean loss over this replica's micro-batches (last stage)."""
        self.phases = {}
        if self.job.strategy.pp > 1:
            loss = self._pipeline_step()
        else:
            loss = self._plain_step()
        if self.reducer is not None:
            self._timed("grad_sync", self.reducer.finish)
        self._timed("optimizer", self.optimizer.step)
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _plain_step(self) -> float:
        m = len(self.batches)
        total = 0.0
        for i, (x, y) in enumerate(self.batches):
            sync = self.ddp is None or i == m - 1
            with nullcontext() if sync else self.ddp.no_sync():
                loss = self._timed("forward", lambda: self.module(x, y) / m)
                self._timed("backward", loss.backward)
            total += loss.item()
        return total

    def _pipeline_step(self) -> float | None:
        s, t, mdl = self.job.strategy, self.job.training, self.job.model
        m = len(self.batches)
        shape = (t.micro_batch, t.seq_len, mdl.hidden)
        order = stage_order(Schedule.ONE_F_ONE_B, s.pp, 1, m, self.stage)
        prev, nxt = (self.groups.pp_neighbour(-1) if not self.first else None,
                     self.groups.pp_neighbour(1) if not self.last else None)
        inputs, outputs, sends = {}, {}, []
        total = 0.0
        for slot in order:
            j = slot.micro
            x_tokens, y = self.batches[j]
            if self.reducer is not None and j == m - 1 and slot.kind is Pass.BACKWARD:
                self.reducer.armed = True
            if slot.kind is Pass.FORWARD:
                if self.first:
                    x = x_tokens
                else:
                    x = torch.empty(shape, device=self.device)
                    self._timed("recv", lambda: dist.irecv(x, prev, tag=2 * j).wait())
                    x.requires_grad_()
                out = self._timed("forward", lambda: self.module(x, y if self.last else None))
                if self.last:
                    out = out / m
                    total += out.item()
                else:
                    sends.append((dist.isend(out.detach(), nxt, tag=2 * j), out))
                inputs[j], outputs[j] = x, out
            else:
                out = outputs.pop(j)
                if self.last:
                    self._timed("backward", out.backward)
                else:
                    grad = torch.empty(shape, device=self.device)
                    self._timed("recv", lambda: dist.irecv(grad, nxt, tag=2 * j + 1).wait())
                    self._timed("backward", lambda: out.backward(grad))
                x = inputs.pop(j)
                if not self.first:
                    sends.append((dist.isend(x.grad, prev, tag=2 * j + 1), x))
        for work, _keep in sends:
            work.wait()
        return total if self.last else None


def train_rank(env: RankEnv, job: Job, timing: Timing) -> dict:
    """Run ``timing.warmup + timing.steps`` steps on this rank; per-step times, phase times
    (median over timed steps), and the losses the last stage saw."""
    runner = _Runner(env, job, timing.seed)
    times, losses, phases, cpu, host = [], [], [], [], []
    for _ in range(timing.warmup + timing.steps):
        synchronize(env)
        dist.barrier()
        start, cpu_start, host_start = time.perf_counter(), time.process_time(), host_busy_s()
        losses.append(runner.step())
        synchronize(env)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        host_end = host_busy_s()
        host.append(None if host_start is None or host_end is None else host_end - host_start)
        phases.append(runner.phases)
    timed = phases[timing.warmup:]
    names = sorted({k for p in timed for k in p})
    coords = runner.groups.coords
    return {"rank": env.rank, "stage": runner.stage, "tp_rank": coords[Axis.TP],
            "dp_rank": coords[Axis.DP], "step_times_s": times, "losses": losses,
            "cpu_s": cpu, "host_busy_s": host,
            "phases_s": {k: statistics.median(p.get(k, 0.0) for p in timed) for k in names}}


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """A real run of a job: the slowest rank's time of every step, and the global loss."""

    step_times_s: tuple[float, ...]
    """Timed steps only (after warm-up)."""
    losses: tuple[float, ...]
    """Mean loss over the global batch, every step including warm-up."""
    phases_s: dict
    """Median per-step phase times of rank 0 (forward, backward, recv, grad_sync, optimizer)."""
    foreign_load: tuple[float, ...] = ()
    """Cores other processes kept busy during each timed step (``hostload``; empty where the
    host cannot tell)."""

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def foreign_cores(self) -> float | None:
        """Mean load of other processes over the timed steps, in cores."""
        return statistics.fmean(self.foreign_load) if self.foreign_load else None

    def to_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "step_times_s": list(self.step_times_s),
                "losses": list(self.losses), "phases_s": dict(self.phases_s),
                "foreign_load_cores": list(self.foreign_load)}


def measure(job: Job, timing: Timing, *, device: str = "cpu", threads: int = 1) -> Measured:
    """Run ``job`` on ``job.strategy.world_size`` spawned ranks and time it."""
    from clustersim.analysis.calibration.launch import run_ranks
    check_runnable(job)
    ranks = run_ranks(train_rank, job.strategy.world_size, (job, timing), device=device,
                      threads=threads)
    steps = len(ranks[0]["step_times_s"])
    slowest = [max(r["step_times_s"][i] for r in ranks) for i in range(steps)]
    reporters = [r for r in ranks if r["losses"][0] is not None and r["tp_rank"] == 0]
    losses = [statistics.fmean(r["losses"][i] for r in reporters) for i in range(steps)]
    host = ranks[0]["host_busy_s"]
    foreign = () if None in host else tuple(
        max(0.0, (host[i] - sum(r["cpu_s"][i] for r in ranks)) / slowest[i])
        for i in range(timing.warmup, steps))
    return Measured(step_times_s=tuple(slowest[timing.warmup:]), losses=tuple(losses),
                    phases_s=ranks[0]["phases_s"], foreign_load=foreign)

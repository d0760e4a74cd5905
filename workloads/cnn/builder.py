"""Trace generation for 3D CNNs under spatial x data parallelism (see ``spatial.py``).

Every rank runs the same program: for each micro-batch, the layers forward and backward on its
block; before a layer whose windows cross block boundaries, one halo exchange per split
dimension on the ``spatial`` stream (a ring exchange over the ranks of the grid on that line,
each sending the planes its neighbour needs); the interior of the block is computed while the
halo is in flight and the boundary after it. Before the dense layers the grid all-gathers the
flattened activation. In the last micro-batch each layer's weight gradient is all-reduced over
every rank (spatial and data parallel ranks hold the same weights) as soon as it is computed;
then the optimizer step. Ranks are numbered grid-innermost, so a grid sits in as few nodes as
its size allows.
"""

from __future__ import annotations

import numpy as np

from clustersim.hardware_specs import OpClass
from clustersim.workloads.axes import Axis
from clustersim.workloads.cnn.job import CnnJob
from clustersim.workloads.cnn.kernels import backward_kernels, forward_kernels, scaled
from clustersim.workloads.cnn.layers import LayerKind
from clustersim.workloads.cnn.memory import GRADIENT_BYTES
from clustersim.workloads.cnn.network import LayerShape
from clustersim.workloads.cnn.spatial import DIMENSIONS, gathered_elements
from clustersim.workloads.kernels import Kernel
from clustersim.workloads.strategies.program import OpList
from clustersim.workloads.trace import CollectiveKind, GroupSet, Phase, Program, Trace, validate


def line_group(dimension: int) -> str:
    """Group set of the ranks of a grid on one line along ``dimension``."""
    return f"{Axis.SPATIAL.value}_{DIMENSIONS[dimension]}"


def group_sets(job: CnnJob) -> dict[str, GroupSet]:
    ranks = np.arange(job.world_size).reshape(job.dp, *job.grid.split)
    sets = {Axis.SPATIAL.value: tuple(tuple(int(r) for r in ranks[i].ravel())
                                      for i in range(job.dp)),
            Axis.DP.value: (tuple(range(job.world_size)),)}
    for d in range(3):
        if job.grid.split[d] > 1:
            lines = np.moveaxis(ranks, d + 1, -1).reshape(-1, job.grid.split[d])
            sets[line_group(d)] = tuple(tuple(int(r) for r in line) for line in lines)
    return {name: GroupSet(name, groups) for name, groups in sets.items()}


class CnnProgram:
    """Emits the one program every rank runs."""

    def __init__(self, job: CnnJob):
        self.job, self.ops = job, OpList()
        self.elem = job.precision.activation_bytes
        self.dtype = job.precision.gemm_dtype
        self.shapes = job.model.shapes()
        self.samples = job.micro_batch

    def _blocks(self, s: LayerShape):
        if s.layer.kind is LayerKind.DENSE:
            return s.input, s.output
        return self.job.grid.block(s.input), self.job.grid.block(s.output)

    def _halo(self, tag: str, halos: dict[int, int], deps: tuple[int, ...]) -> tuple[int, ...]:
        """One ring exchange per split dimension, in order (a later one forwards the corners
        an earlier one brought)."""
        for d, elements in halos.items():
            deps = (self.ops.collective(f"{tag}.halo_{DIMENSIONS[d]}",
                                        CollectiveKind.RING_EXCHANGE,
                                        elements * self.samples * self.elem, Axis.SPATIAL, deps,
                                        group=line_group(d)),)
        return deps

    def _compute(self, tag: str, phase: Phase, kernels: tuple[Kernel, ...],
                 halos: dict[int, int], boundary: float, deps: tuple[int, ...]) -> int:
        """The layer's kernels; with a halo, the interior first (overlapping the exchange)
        and the boundary share once it has arrived."""
        if not halos:
            return self.ops.compute(tag, phase, kernels, deps)
        exchanged = self._halo(tag, halos, deps)
        inner = self.ops.compute(f"{tag}.interior", phase, scaled(kernels, 1 - boundary,
                                                                   "interior"), deps)
        return self.ops.compute(f"{tag}.boundary", phase, scaled(kernels, boundary, "boundary"),
                                (inner,) + exchanged)

    def forward(self, micro: int, deps: tuple[int, ...]) -> tuple[tuple[Kernel, ...], ...]:
        grid, kernels_of = self.job.grid, []
        gathered = False
        for s in self.shapes:
            x, y = self._blocks(s)
            tag = f"fwd{micro}.{s.layer.name}"
            if s.layer.kind is LayerKind.DENSE and not gathered and grid.size > 1:
                deps = (self.ops.collective(f"fwd{micro}.gather", CollectiveKind.ALL_GATHER,
                                            gathered_elements(self.job.model) * self.samples
                                            * self.elem, Axis.SPATIAL, deps),)
                gathered = True
            halos = {} if s.layer.kind is LayerKind.DENSE else grid.halo_elements(
                s.input, *s.layer.halo())
            kernels = forward_kernels(s, x, y, sum(halos.values()), self.samples, self.elem,
                                      self.dtype)
            kernels_of.append(kernels)
            boundary = grid.boundary_fraction(s.input, *s.layer.halo()) if halos else 0.0
            deps = (self._compute(tag, Phase.FORWARD, kernels, halos, boundary, deps),)
        return tuple(kernels_of)

    def backward(self, micro: int, forward: tuple[tuple[Kernel, ...], ...],
                 last_micro: bool) -> None:
        grid, deps = self.job.grid, self.ops.after_compute()
        for i in reversed(range(len(self.shapes))):
            s = self.shapes[i]
            x, y = self._blocks(s)
            lo, hi = s.layer.halo()
            # The input gradient reads the output gradient's halo, mirrored (Oyama et al.).
            halos = (grid.halo_elements(s.output, hi, lo)
                     if s.layer.kind is LayerKind.CONV and i > 0 else {})
            kernels = backward_kernels(forward[i], s, x, y, self.samples, self.elem, i == 0)
            boundary = grid.boundary_fraction(s.output, hi, lo) if halos else 0.0
            tag = f"bwd{micro}.{s.layer.name}"
            deps = (self._compute(tag, Phase.BACKWARD, kernels, halos, boundary, deps),)
            if last_micro and s.layer.parameters:
                self.ops.collective(f"{tag}.grad_all_reduce", CollectiveKind.ALL_REDUCE,
                                    s.layer.parameters * GRADIENT_BYTES, Axis.DP, deps)

    def optimizer(self) -> None:
        opt, p = self.job.optimizer, self.job.model.parameters
        step = Kernel(f"{opt.value}_step", OpClass.OPTIMIZER, opt.step_flops * p,
                      opt.step_bytes * p)
        deps = tuple(i for i, op in enumerate(self.ops.ops)
                     if getattr(op, "kind", None) is CollectiveKind.ALL_REDUCE)
        self.ops.compute("optimizer_step", Phase.OPTIMIZER, (step,),
                         deps + self.ops.after_compute())

    def run(self) -> tuple:
        for micro in range(self.job.micro_batches):
            forward = self.forward(micro, self.ops.after_compute())
            self.backward(micro, forward, micro == self.job.micro_batches - 1)
        self.optimizer()
        return tuple(self.ops.ops)


def build_cnn_trace(job: CnnJob) -> Trace:
    """The step's trace: one program, run by every rank."""
    memory = job.memory()
    static = memory.weights + memory.gradients + memory.optimizer + memory.reserve
    program = Program("cnn", tuple(range(job.world_size)), CnnProgram(job).run(),
                      static_memory_bytes=static, peak_memory_bytes=memory.required)
    trace = Trace(world_size=job.world_size, programs=(program,), group_sets=group_sets(job),
                  model_flops=job.model_flops_per_step, tokens=float(job.global_batch),
                  meta={"model": job.model.name, "family": "cnn3d",
                        "grid": list(job.grid.split), "dp": job.dp,
                        "peak_dtype": job.precision.gemm_dtype.value})
    return validate(trace)

"""Memory of one rank training a 3D CNN with spatial and data parallelism.

Weights are replicated on every rank (FP32, as mixed-precision training keeps them; the FP16
copies are transient), with an FP32 gradient and the optimizer's state. Activations are what
autograd saves for backward, per sample: every layer's input (the convolution's weight
gradient and the pool's argmax read it), every batch norm's input, and the network's output;
a rank holds its block of each, 1/grid of the sample, plus the halo planes it received, for
the samples of one micro-batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from clustersim.workloads.cnn.network import CnnSpec
from clustersim.workloads.cnn.spatial import SpatialGrid, spatial_layers
from clustersim.workloads.memory import CONTEXT_RESERVE_BYTES, FRAGMENTATION, MemoryBreakdown

MASTER_BYTES = 4.0
GRADIENT_BYTES = 4.0


class CnnOptimizer(enum.Enum):
    """The optimizer, and what it keeps and streams per parameter."""

    SGD = "sgd"
    """SGD with momentum (the MLPerf CosmoFlow reference): one FP32 buffer."""
    ADAM = "adam"
    """Adam: two FP32 moments."""

    @property
    def state_bytes(self) -> float:
        return 4.0 if self is CnnOptimizer.SGD else 8.0

    @property
    def step_bytes(self) -> float:
        """HBM traffic of the update per parameter: read weight, gradient and state, write
        weight and state."""
        return MASTER_BYTES * 2 + GRADIENT_BYTES + self.state_bytes * 2

    @property
    def step_flops(self) -> int:
        """Arithmetic per parameter: momentum's multiply-add and the update's (4); Adam's two
        moment updates, bias corrections, square root and division (12, as for transformers)."""
        return {CnnOptimizer.SGD: 4, CnnOptimizer.ADAM: 12}[self]


def saved_elements_per_sample(spec: CnnSpec) -> int:
    """Elements autograd keeps for one sample (see the module docstring)."""
    shapes = spec.shapes()
    return (sum(s.input.elements for s in shapes)
            + sum(s.output.elements for s in shapes if s.layer.batch_norm)
            + shapes[-1].output.elements)


def halo_elements_per_sample(spec: CnnSpec, grid: SpatialGrid) -> int:
    """Halo planes a rank keeps beside its blocks for the weight gradients."""
    return sum(sum(grid.halo_elements(s.input, *s.layer.halo()).values())
               for s in spatial_layers(spec))


@dataclass(frozen=True, kw_only=True, slots=True)
class CnnMemory:
    spec: CnnSpec
    grid: SpatialGrid
    samples: int
    """Samples one grid holds at once (a micro-batch)."""
    element_bytes: float
    optimizer: CnnOptimizer

    def activations_per_sample(self) -> float:
        """Bytes of one whole sample's saved activations (before the grid divides them)."""
        return saved_elements_per_sample(self.spec) * self.element_bytes

    def breakdown(self) -> MemoryBreakdown:
        """One rank's bytes, with the transformer model's reserve rule (CUDA context and
        workspaces) and caching-allocator fragmentation."""
        p = self.spec.parameters
        activations = self.samples * (self.activations_per_sample() / self.grid.size
                                      + halo_elements_per_sample(self.spec, self.grid)
                                      * self.element_bytes)
        state = p * (MASTER_BYTES + GRADIENT_BYTES + self.optimizer.state_bytes)
        return MemoryBreakdown(weights=p * MASTER_BYTES, gradients=p * GRADIENT_BYTES,
                               optimizer=p * self.optimizer.state_bytes,
                               activations=activations, comm_buffers=0.0,
                               fragmentation=(state + activations) * FRAGMENTATION
                               / (1.0 - FRAGMENTATION),
                               reserve=CONTEXT_RESERVE_BYTES)

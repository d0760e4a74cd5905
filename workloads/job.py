"""A training job: the model, what one step processes, and how it is split."""

from __future__ import annotations

from dataclasses import dataclass, replace

from clustersim.workloads.layer_ops import model_flops_per_token, recompute_flops_per_token
from clustersim.workloads.stages import chunk_layers
from clustersim.workloads.memory import StageMemory, memory_per_stage
from clustersim.workloads.model import TransformerSpec, check
from clustersim.workloads.strategy import Strategy, check_strategy, micro_batches
from clustersim.workloads.training import TrainingSpec


@dataclass(frozen=True, slots=True)
class Job:
    model: TransformerSpec
    training: TrainingSpec
    strategy: Strategy

    def checked(self, world_size: int | None = None) -> "Job":
        """This job, after every cross-check (raises :class:`SpecError` naming the field)."""
        check(self.model)
        check_strategy(self.strategy, self.model, self.training, world_size)
        return self

    def replicas(self) -> tuple[tuple["Job", tuple[int, ...]], ...]:
        """The distinct per-replica jobs and the data-parallel replicas that run each: one
        job when the batch is even; with ``strategy.replica_batch``, a replica that runs b
        samples runs what an even job of dp x b samples gives each replica."""
        s = self.strategy
        if not s.replica_batch:
            return ((self, tuple(range(s.dp))),)
        out = []
        for batch in sorted(set(s.replica_batch)):
            training = replace(self.training, global_batch=batch * s.dp)
            job = Job(self.model, training, replace(s, replica_batch=()))
            out.append((job, tuple(i for i, b in enumerate(s.replica_batch) if b == batch)))
        return tuple(out)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step."""
        return micro_batches(self.training, self.strategy)

    @property
    def computed_model(self) -> TransformerSpec:
        """The network one replica computes: the model, or with subnetworks its subnetwork's
        blocks (forward masking skips the dropped ones; Singh et al., arXiv 2507.09029)."""
        sub = self.strategy.subnetworks
        return replace(self.model, layers=sub.layers) if sub else self.model

    @property
    def model_flops_per_step(self) -> float:
        """Forward + backward FLOPs of one step, no recompute (the MFU numerator)."""
        t = self.training
        return model_flops_per_token(self.computed_model, t.seq_len) * t.tokens_per_step

    @property
    def hardware_flops_per_step(self) -> float:
        """Model FLOPs plus what recomputation adds."""
        t = self.training
        extra = recompute_flops_per_token(self.computed_model, t.seq_len, self.strategy.recompute,
                                          t.attention, self.strategy.recompute_modules)
        return self.model_flops_per_step + extra * self.recomputed_fraction * t.tokens_per_step

    @property
    def recomputed_fraction(self) -> float:
        """Share of the layers that recompute (all, unless ``recompute_layers`` limits each
        model chunk to its first N)."""
        if not self.strategy.recompute_layers:
            return 1.0
        chunks = chunk_layers(self.model.layers, self.strategy)
        return self.strategy.recomputed_layers(chunks) / self.computed_model.layers

    def memory(self) -> tuple[StageMemory, ...]:
        return memory_per_stage(self.model, self.training, self.strategy)

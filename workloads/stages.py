"""Which layers each pipeline stage (and each virtual chunk) holds.

Rule: the L layers are split over the C = pp x virtual_stages chunks so that chunk sizes differ
by at most one. The L mod C larger chunks go first to the middle chunks (1 .. C-2, in order),
then to chunk 0, then to chunk C-1: the first chunk also holds the embedding and the last the
LM head, so they take the smaller share, as Llama 3 405B did (126 layers on 16 stages, one
fewer on the first and the last; arXiv 2407.21783 sec. 3.3.2). ``layers_per_stage`` overrides.
Megatron-Core's ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
count the embedding and the loss as one layer each and split L + 1 (+ 1) evenly over the chunks
(``get_num_layers_to_build`` in megatron/core/transformer/transformer_block.py): Llama 3.1 405B
on PP16 with 8 virtual stages has 128 chunks of one layer, the first holding only the embedding
and the last only the LM head and loss.
Chunk c runs on stage c mod pp (Megatron's interleaved assignment). Under DualPipe stage i holds
two chunks: model stage i (one direction) and model stage pp-1-i (the other), so the two end
stages hold the embedding and the LM head both.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.workloads.model import TransformerSpec
from clustersim.workloads.strategy import Schedule, Strategy


def chunk_layers(layers: int, strategy: Strategy) -> tuple[int, ...]:
    """Layers in each model chunk, in pipeline order (with subnetworks, pp = 1: the blocks one
    replica's subnetwork keeps, its first ``layers``; every subnetwork is alike in cost)."""
    if strategy.subnetworks:
        return (strategy.subnetworks.layers,)
    if strategy.layers_per_stage:
        return strategy.layers_per_stage
    chunks = strategy.chunks
    if strategy.split_extra_layers:
        sizes = [(layers + strategy.split_extra_layers) // chunks] * chunks
        sizes[0] -= int(strategy.account_for_embedding_in_pipeline_split)
        sizes[-1] -= int(strategy.account_for_loss_in_pipeline_split)
        return tuple(sizes)
    base, extra = divmod(layers, chunks)
    sizes = [base] * chunks
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 1 else [0]
    for c in order[:extra]:
        sizes[c] += 1
    return tuple(sizes)


@dataclass(frozen=True, slots=True)
class StagePlan:
    """What one pipeline stage holds: its chunks' layers, and the embedding / LM head."""

    stage: int
    chunk_layers: tuple[int, ...]
    """Layers of each of this stage's chunks, in execution order (virtual stage 0 first)."""
    has_embedding: bool
    has_head: bool
    chunk_layer_ids: tuple[tuple[int, ...], ...] = ()
    """Global indices of each chunk's layers (model order)."""

    @property
    def layers(self) -> int:
        return sum(self.chunk_layers)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """Global indices of every layer this stage holds."""
        return tuple(i for chunk in self.chunk_layer_ids for i in chunk)


def stage_plans(model: TransformerSpec, strategy: Strategy) -> tuple[StagePlan, ...]:
    sizes = chunk_layers(model.layers, strategy)
    pp = strategy.pp
    starts = [sum(sizes[:c]) for c in range(len(sizes))]
    ids = [tuple(range(starts[c], starts[c] + sizes[c])) for c in range(len(sizes))]
    if strategy.schedule is Schedule.DUALPIPE:
        return tuple(
            StagePlan(stage=i, chunk_layers=(sizes[i], sizes[pp - 1 - i]),
                      has_embedding=i in (0, pp - 1), has_head=i in (0, pp - 1),
                      chunk_layer_ids=(ids[i], ids[pp - 1 - i]))
            for i in range(pp))
    return tuple(
        StagePlan(stage=i, chunk_layers=tuple(sizes[c] for c in range(i, len(sizes), pp)),
                  has_embedding=(i == 0), has_head=(i == pp - 1),
                  chunk_layer_ids=tuple(ids[c] for c in range(i, len(sizes), pp)))
        for i in range(pp))

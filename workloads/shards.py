"""What each device holds and gathers: the one home of parameter shard sizes.

The trace builder (ZeRO gathers, gradient reductions, the optimizer's share) and the memory
model (weights, gradients, optimizer state) both read them here, so they cannot disagree.

By parameter kind and axis:
- TP (Megatron, Shoeybi et al. 2019): column-parallel weights and biases and row-parallel
  weights are split over the tp ranks; norms, row-parallel biases and the MoE router are whole
  on every rank (``RowParallelLinear`` adds its bias after the reduction; ``TopKRouter`` is not
  partitioned); multi-head latent attention keeps its down-projections and their norms whole
  (Megatron-Core's ``MLASelfAttention``). The vocabulary-parallel embedding and LM head split
  the vocabulary rows (``VocabParallelEmbedding``; ceil(vocab / tp) rows on a rank).
- EP and expert TP: each device holds ``num_experts / ep`` of a MoE layer's routed experts,
  each split over ``etp`` ranks (``strategy.expert_tp``, tp by default; Megatron-Core's
  parallel folding); shared experts, attention and norms are dense (every EP rank holds them).
- PP: a stage holds its layers; the first stage the embedding (learned positions, embedding
  norm), the last the final norm and the LM head (with tied embeddings and pp > 1, its own copy
  of the table, as Megatron keeps it).
- DP / ZeRO (Rajbhandari et al. SC'20): ranks holding the same parameters share them. Dense
  and vocabulary parameters are held by the dp x cp ranks of a (pp, tp) position; experts by
  the tp x cp x dp / (ep x etp) ranks of a stage that hold the same expert shard (the
  expert-data-parallel group, ``strategy.expert_dp``). ZeRO-3
  stores 1/n of a shard and all-gathers it whole before use; gradients are reduced over the
  same ranks.
- HSDP (``strategy.dp_shard``; torchtitan's replicate x shard mesh, FSDP2's HSDP): dense and
  vocabulary parameters are sharded over the dp_shard x cp ranks of a shard group (``dp_shard``)
  only; the dp / dp_shard shard groups hold the same shards (``replicas``) and all-reduce each
  reduced gradient shard across them (``dp_replicate``).
- Subnetwork Data Parallelism (``workloads/subnetworks.py``, Singh et al. arXiv 2507.09029):
  a replica holds only its subnetwork's blocks (the stage plan lists them), and a block is
  shared by the dp x cp x layers / L ranks whose subnetworks keep it (``sdp``), not by all
  dp x cp; the vocabulary parameters stay in every subnetwork, shared over ``dp``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.workloads.axes import DP_SHARD_GROUP, EXPERT_DATA_GROUP, SUBNETWORK_DATA_GROUP, Axis
from clustersim.workloads.hybrid import LayerType
from clustersim.workloads.model import Norm, Position, TransformerSpec
from clustersim.workloads.stages import StagePlan
from clustersim.workloads.strategy import Strategy


class ParamKind(enum.Enum):
    DENSE = "dense"
    """Attention, norms, the router, dense MLPs and shared experts of a layer."""
    EXPERT = "expert"
    """Routed experts of a MoE layer."""
    VOCAB = "vocab"
    """The embedding and the LM head with what sits beside them (learned positions, the
    embedding and final norms): FSDP's root unit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamTensor:
    """One parameter tensor of a layer."""

    params: int
    kind: ParamKind
    tp_split: bool
    """Split over the TP ranks (False: whole on every rank)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Shard:
    """Parameters of one kind that one device's model-parallel position (tp, ep, pp) owns, and
    the ranks that share them."""

    kind: ParamKind
    params: float
    """After the TP, EP and pipeline splits, before ZeRO: what a ZeRO-3 all-gather brings
    whole and what a gradient reduction carries."""
    group: str
    """The group set of the ranks holding the same parameters: ``dp``, or ``edp`` for experts."""
    ranks: int
    """Size of that group: what ZeRO shards over."""
    replicas: int = 1
    """HSDP: groups holding copies of the same shards, which all-reduce each reduced gradient
    shard across them (1: none)."""

    def resident(self, sharded: bool) -> float:
        """Parameters a device keeps: 1/ranks of them when ZeRO shards this state."""
        return self.params / self.ranks if sharded else self.params


@dataclass(frozen=True, kw_only=True, slots=True)
class StageShards:
    """What one device of a pipeline stage holds, by kind and by layer."""

    layers: Mapping[int, tuple[Shard, ...]]
    """Global layer index -> its dense shard, and its expert shard in a MoE layer; the last
    stage's multi-token-prediction modules follow as layers ``model.layers + depth``."""
    tensors: Mapping[int, tuple[Shard, ...]]
    """Global layer index -> each parameter tensor this device holds, in module order (what
    per-tensor ZeRO-3 gathers one by one); they add up to the layer's shards."""
    embedding: Shard | None
    """The first stage's token embedding table, learned positions and embedding norm."""
    head: Shard | None
    """The last stage's final norm and LM-head table (the table only when the stage keeps its
    own: untied, or tied with pp > 1)."""
    table_params: float
    """Parameters of one vocabulary table on one device."""

    @property
    def root(self) -> Shard | None:
        """The embedding and LM head together: FSDP's root unit (None on a stage with neither)."""
        parts = [p for p in (self.embedding, self.head) if p is not None]
        if not parts:
            return None
        return Shard(kind=ParamKind.VOCAB, params=sum(p.params for p in parts),
                     group=parts[0].group, ranks=parts[0].ranks, replicas=parts[0].replicas)

    def total(self, kind: ParamKind) -> float:
        """Parameters of one kind on this device, before ZeRO."""
        out = sum(s.params for shards in self.layers.values() for s in shards if s.kind is kind)
        return out + (self.root.params if self.root and self.root.kind is kind else 0.0)

    def by_group(self) -> dict[str, Shard]:
        """The stage's parameters summed per group of ranks that hold them (dense and
        vocabulary over ``dp``, experts over ``edp``)."""
        out: dict[str, Shard] = {}
        shards = [s for layer in self.layers.values() for s in layer] + (
            [self.root] if self.root else [])
        for s in shards:
            seen = out.get(s.group)
            out[s.group] = Shard(kind=seen.kind if seen else s.kind, group=s.group,
                                 ranks=s.ranks, replicas=s.replicas,
                                 params=s.params + (seen.params if seen else 0.0))
        return out


def vocab_rows(model: TransformerSpec, strategy: Strategy) -> int:
    """Vocabulary rows one TP rank holds of the embedding or LM head (ceil(vocab / tp))."""
    return math.ceil(model.vocab / strategy.tp)


def layer_tensors(model: TransformerSpec, layer: int) -> tuple[ParamTensor, ...]:
    """A layer's parameter tensors in module order (norm, attention, norm, MLP or router,
    shared and routed experts), with their kind and whether TP splits them. They add up to
    ``model.layer_parts(layer)`` (tested)."""
    m = model
    norm = tuple(ParamTensor(params=m.hidden, kind=ParamKind.DENSE, tp_split=False)
                 for _ in range(2 if m.norm is Norm.LAYERNORM and m.bias else 1))
    attention = tuple(ParamTensor(params=n, kind=ParamKind.DENSE, tp_split=split)
                      for n, split in zip(m.attention_tensors(), _attention_splits(m), strict=True))
    kind = m.layer_type(layer)
    if kind is LayerType.MAMBA:
        return norm + tuple(ParamTensor(params=n, kind=ParamKind.DENSE, tp_split=split)
                            for n, split in m.mamba_tensors())
    if kind is LayerType.ATTENTION:
        return norm + attention
    if kind is LayerType.MLP:
        return norm + _mlp(m, m.ffn_hidden, ParamKind.DENSE)
    out = norm if kind is LayerType.MOE else norm + attention + norm
    if not m.is_moe_layer(layer):
        return out + _mlp(m, m.ffn_hidden, ParamKind.DENSE)
    out += (ParamTensor(params=m.hidden * m.num_experts, kind=ParamKind.DENSE, tp_split=False),)
    if m.router_bias:
        out += (ParamTensor(params=m.num_experts, kind=ParamKind.DENSE, tp_split=False),)
    for _ in range(m.shared_experts):
        out += _mlp(m, m.shared_ffn, ParamKind.DENSE)
    for _ in range(m.num_experts):
        out += _mlp(m, m.expert_ffn, ParamKind.EXPERT)
    return out


def mtp_tensors(model: TransformerSpec) -> tuple[ParamTensor, ...]:
    """One multi-token-prediction module (DeepSeek-V3 sec. 2.2): a layer like the last one, the
    norms of its two inputs and of its head (whole over TP) and the 2h -> h input projection
    (column-parallel); it shares the embedding and the LM head. Adds up to
    ``model.mtp_module_params``."""
    m = model
    norms = tuple(ParamTensor(params=m.norm_params, kind=ParamKind.DENSE, tp_split=False)
                  for _ in range(3))
    projection = ParamTensor(params=2 * m.hidden * m.hidden, kind=ParamKind.DENSE, tp_split=True)
    return layer_tensors(m, m.layers - 1) + norms + (projection,)


def _mlp(model: TransformerSpec, ffn: int, kind: ParamKind) -> tuple[ParamTensor, ...]:
    """An MLP's weights (split), its column-parallel biases (split) and its row-parallel
    bias (whole), in ``model.mlp_tensors`` order."""
    sizes = model.mlp_tensors(ffn)
    whole = {len(sizes) - 1} if model.bias else set()
    return tuple(ParamTensor(params=n, kind=kind, tp_split=i not in whole)
                 for i, n in enumerate(sizes))


def _attention_splits(model: TransformerSpec) -> tuple[bool, ...]:
    """Whether TP splits each of ``model.attention_tensors()``, in that order."""
    m = model
    if m.is_mla:
        # Down-projection and its norm whole, up-projection split; for the query (when it is
        # compressed), then for the key/value latent; the output projection split.
        q = (False, False, True) if m.q_lora_rank else (True,)
        return q + (False, False, True) + (True,)
    out = (True,) + ((True,) if m.bias else ())          # QKV weight and bias: column-parallel
    out += (True,) + ((False,) if m.bias else ())        # output projection: row-parallel
    out += (False, False) if m.qk_norm else ()           # per-head query/key norm weights
    out += (True,) if m.attention_sinks else ()          # one sink per head
    return out


def block_ranks(model: TransformerSpec, strategy: Strategy) -> int:
    """Data x context-parallel ranks holding one transformer block: all dp x cp of them, or
    with subnetworks the replicas whose subnetworks keep it."""
    replicas = strategy.dp * strategy.cp
    sub = strategy.subnetworks
    return sub.block_replicas(replicas, model.layers) if sub else replicas


def stage_shards(model: TransformerSpec, strategy: Strategy, plan: StagePlan) -> StageShards:
    """What one device of stage ``plan`` holds and gathers, by kind (dense, expert, vocabulary)
    and by axis (TP, EP and PP splits; the ZeRO group of each shard)."""
    m, s = model, strategy
    folded = s.ep > 1 or s.expert_tp != s.tp    # experts held apart from the dense replicas
    dense = ((Axis.DP.value, s.dp * s.cp, 1) if s.dp_replicate == 1
             else (DP_SHARD_GROUP, s.zero_shards * s.cp, s.dp_replicate))
    block = (SUBNETWORK_DATA_GROUP, block_ranks(m, s), 1) if s.subnetworks else dense
    groups = {ParamKind.DENSE: block, ParamKind.VOCAB: dense,
              ParamKind.EXPERT: (EXPERT_DATA_GROUP, s.expert_dp, 1) if folded else block}
    splits = {ParamKind.DENSE: s.tp, ParamKind.EXPERT: s.expert_tp}

    def shard(kind: ParamKind, params: float) -> Shard:
        group, ranks, replicas = groups[kind]
        return Shard(kind=kind, params=params, group=group, ranks=ranks, replicas=replicas)

    modules = {layer: layer_tensors(m, layer) for layer in plan.layer_ids}
    if plan.has_head:
        modules |= {m.layers + depth: mtp_tensors(m) for depth in range(m.mtp_layers)}
    layers, tensors = {}, {}
    for layer, every in modules.items():
        experts = [t for t in every if t.kind is ParamKind.EXPERT]
        held = [t for t in every if t.kind is not ParamKind.EXPERT]
        held += experts[:len(experts) // s.ep]          # this rank's num_experts / ep
        tensors[layer] = tuple(shard(t.kind, t.params / splits[t.kind] if t.tp_split
                                     else float(t.params)) for t in held)
        layers[layer] = tuple(
            shard(kind, sum(t.params for t in tensors[layer] if t.kind is kind))
            for kind in (ParamKind.DENSE, ParamKind.EXPERT)
            if any(t.kind is kind for t in tensors[layer]))
    table = float(vocab_rows(m, s) * m.hidden)
    embedding = head = None
    if plan.has_embedding:
        positions = m.max_positions * m.hidden if m.position is Position.LEARNED else 0
        embedding = shard(ParamKind.VOCAB, table + positions
                          + (m.norm_params if m.embedding_norm else 0))
    if plan.has_head:
        own_table = not (m.tied_embeddings and s.pp == 1)
        head = shard(ParamKind.VOCAB, m.norm_params + (table if own_table else 0.0))
    return StageShards(layers=layers, tensors=tensors, embedding=embedding, head=head,
                       table_params=table)

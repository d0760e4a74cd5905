"""Context parallelism: each rank holds 1/cp of every sequence, and attention, which needs every
token's keys and values, exchanges them in one of four ways (``Strategy.cp_algorithm``):

- ring (Liu et al. 2023; Megatron-Core ``cp_comm_type: p2p``): the attention core runs in cp
  pieces while the K/V blocks travel around the ring, cp - 1 exchanges, each overlapped with the
  piece whose block is already there; backward also passes dK and dV.
- all-gather (Llama 3, arXiv 2407.21783 sec. 3.3.2; Megatron-Core ``all_gather``): K and V are
  all-gathered, then attention runs on the local queries against the whole sequence; backward
  gathers K and V again and reduce-scatters dK and dV. Nothing hides the collectives.
- Ulysses (DeepSpeed-Ulysses, arXiv 2309.14509 sec. 3; Megatron-Core ``a2a``): an all-to-all
  turns the sequence-sharded Q, K and V into head shards of the whole sequence, attention runs
  on cp times the tokens with 1/cp of the heads, and an all-to-all turns the output back;
  backward does the same with dO, and dQ, dK, dV. Heads and KV heads divide by tp x cp.
- hierarchical (Megatron-Core ``a2a+p2p``, ``hierarchical_context_parallel_sizes``): Ulysses
  inside domains of ``cp_a2a`` ranks, and a ring of cp / cp_a2a pieces across the domains, whose
  K/V blocks (cp_a2a times the tokens, 1/cp_a2a of the KV heads) weigh what a plain ring's do.
GQA makes K and V smaller; under tensor parallelism each rank holds its share of the heads (at
least one KV head when tp exceeds them).
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.hardware_specs.efficiency import ATTENTION_CLASSES
from clustersim.workloads.axes import CP_A2A_GROUP, CP_RING_GROUP, Axis
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.strategy import CpAlgorithm
from clustersim.workloads.trace import CollectiveKind, Phase

ATTENTION_CORE = ("flash_attn", "attn_scores", "softmax", "attn_values")
"""Kernels of the attention core, which ring attention runs once per K/V block."""


class ContextParallel:
    """Emits attention blocks, their core's K/V exchanged over the CP group when cp > 1."""

    def __init__(self, stage: StageProgram, tensor: TensorParallel):
        self.stage, self.tensor = stage, tensor
        s = stage.strategy
        self.degree, self.algorithm = s.cp, s.cp_algorithm
        self.a2a = {CpAlgorithm.ULYSSES: s.cp, CpAlgorithm.HIERARCHICAL: s.cp_a2a}.get(
            self.algorithm, 1)
        """Ranks of each all-to-all (Ulysses) domain; 1 without one."""
        self.ring = {CpAlgorithm.RING: s.cp, CpAlgorithm.HIERARCHICAL: s.cp // max(1, s.cp_a2a)
                     }.get(self.algorithm, 1)
        """Ranks K/V blocks travel around (one piece of the core each); 1 without a ring."""

    # --- bytes per rank ----------------------------------------------------------------------
    def _heads(self) -> tuple[float, float]:
        """(query heads, KV heads) of this rank's TP share."""
        m, tp = self.stage.model, self.stage.strategy.tp
        return m.heads / tp, max(1, m.kv_heads // tp)

    def _per_token(self, q: bool, k: bool, v: bool, o: bool) -> float:
        m = self.stage.model
        heads, kv = self._heads()
        width = (q * heads * m.head_dim + k * kv * m.head_dim + v * kv * m.value_head_dim
                 + o * heads * m.value_head_dim)
        return width * self.stage.element_bytes

    def kv_block_bytes(self, backward: bool) -> float:
        """One ring exchange: this rank's K and V (and in backward dK and dV) for its sequence
        shard. Under hierarchical CP the block holds cp_a2a times the tokens and 1/cp_a2a of
        the KV heads, the same bytes."""
        block = self.stage.kernels.tokens * self._per_token(False, True, True, False)
        return block * (2 if backward else 1)

    def _a2a_bytes(self, q: bool, k: bool, v: bool, o: bool) -> float:
        """What one rank sends in a head-shuffling all-to-all (its own share included)."""
        return self.stage.kernels.tokens * self._per_token(q, k, v, o)

    # --- the attention block -----------------------------------------------------------------
    def attention(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                  deps: tuple[int, ...], backward: bool) -> int:
        """The attention block; with cp > 1 its core waits for (or streams) the K/V exchange.
        Under ``attn`` CUDA graphs the whole block replays from one graph."""
        with self.stage.ops.graph(self.stage.strategy.cuda_graphs.attention):
            return self._attention(name, phase, kernels, deps, backward)

    def _attention(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                   deps: tuple[int, ...], backward: bool) -> int:
        if self.degree == 1:
            return self.tensor.block(name, phase, kernels, deps)
        ops = self.stage.ops
        is_core = [k.name.split(".")[0] in ATTENTION_CORE for k in kernels]
        first_core = is_core.index(True)
        last_core = len(is_core) - 1 - is_core[::-1].index(True)
        pre, core, post = (kernels[:first_core], kernels[first_core:last_core + 1],
                           kernels[last_core + 1:])
        start = self.tensor.gather_sequence(name, deps)
        op = ops.compute(f"{name}.pre", phase, pre, start) if pre else None
        ready = (op,) if op is not None else start
        if self.algorithm is CpAlgorithm.ALLGATHER:
            done = self._gathered_core(name, phase, core, ready, backward)
        else:
            if self.a2a > 1:   # sequence shards -> head shards: Q, K, V (backward: dO)
                ready = (self._shuffle(name, "to_heads", ready, q=not backward, k=not backward,
                                       v=not backward, o=backward),)
            done = self._ring_core(name, phase, core, ready, backward)
            if self.a2a > 1:   # head shards -> sequence shards: O (backward: dQ, dK, dV)
                done = self._shuffle(name, "to_sequence", (done,), q=backward, k=backward,
                                     v=backward, o=not backward)
        out = ops.compute(f"{name}.post", phase, post, (done,))
        return self.tensor.reduce_if_split(name, out)

    def _ring_core(self, name: str, phase: Phase, core: tuple[Kernel, ...],
                   ready: tuple[int, ...], backward: bool) -> int:
        """The core in ``ring`` pieces behind ring - 1 K/V exchanges (one piece: no ring)."""
        ops, ring = self.stage.ops, self.ring
        group = CP_RING_GROUP if self.algorithm is CpAlgorithm.HIERARCHICAL else None
        block = self.kv_block_bytes(backward)
        keys = max(1, self.stage.kernels.training.seq_len // ring)   # one K/V block's tokens
        piece = tuple(_ring_piece(k, ring, keys) for k in core)
        exchange, last = None, ready[0] if ready else None
        for step in range(ring):
            core_deps = ready if step == 0 else (exchange,)
            if step < ring - 1:
                exchange = ops.collective(f"{name}.cp_ring_{step}", CollectiveKind.RING_EXCHANGE,
                                          block, Axis.CP, ready if step == 0 else (exchange,),
                                          group=group)
            last = ops.compute(f"{name}.core_{step}" if ring > 1 else f"{name}.core", phase,
                               piece, core_deps)
        return last

    def _shuffle(self, name: str, way: str, deps: tuple[int, ...], **parts: bool) -> int:
        group = CP_A2A_GROUP if self.algorithm is CpAlgorithm.HIERARCHICAL else None
        return self.stage.ops.collective(f"{name}.cp_all_to_all_{way}", CollectiveKind.ALL_TO_ALL,
                                         self._a2a_bytes(**parts), Axis.CP, deps, group=group)

    def _gathered_core(self, name: str, phase: Phase, core: tuple[Kernel, ...],
                       ready: tuple[int, ...], backward: bool) -> int:
        """All-gather K and V (the gathered output: cp blocks), the core on the local queries,
        and in backward the reduce-scatter of dK and dV."""
        ops, cp = self.stage.ops, self.degree
        block = self.kv_block_bytes(False)
        gather = ops.collective(f"{name}.cp_all_gather_kv", CollectiveKind.ALL_GATHER,
                                block * cp, Axis.CP, ready)
        op = ops.compute(f"{name}.core", phase, core, ready + (gather,))
        if not backward:
            return op
        return ops.collective(f"{name}.cp_reduce_scatter_dkv", CollectiveKind.REDUCE_SCATTER,
                              block * cp, Axis.CP, (op,))


def _scaled(k: Kernel, factor: float) -> Kernel:
    return replace(k, flops=k.flops * factor, bytes=k.bytes * factor, exps=k.exps * factor)


def _ring_piece(k: Kernel, ring: int, block_keys: int) -> Kernel:
    """One ring step's share of a core kernel. A fused attention kernel's key loop runs over the
    step's K/V block only (``n``: at most ``block_keys``; a local window may span fewer), so
    each step pays the loop's fixed cost (simulator/cost/compute.py ``key_loop``)."""
    piece = _scaled(k, 1.0 / ring)
    if k.op_class not in ATTENTION_CLASSES:
        return piece
    return replace(piece, n=min(k.n, block_keys))

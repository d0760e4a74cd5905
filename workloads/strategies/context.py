"""Context parallelism as ring attention (Liu et al. 2023; Megatron-Core's ``cp_comm_type
p2p``): each rank holds 1/cp of the sequence, and the attention core runs in cp pieces while the
K/V blocks travel around the ring, cp - 1 exchanges, each overlapped with the piece whose block
is already there. Backward also passes dK and dV. GQA makes the blocks smaller.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.workloads.axes import Axis
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.trace import CollectiveKind, Phase

ATTENTION_CORE = ("flash_attn", "attn_scores", "softmax", "attn_values")
"""Kernels of the attention core, which ring attention runs once per K/V block."""


class ContextParallel:
    """Emits attention blocks, split over the context-parallel ring when cp > 1."""

    def __init__(self, stage: StageProgram, tensor: TensorParallel):
        self.stage, self.tensor = stage, tensor
        self.degree = stage.strategy.cp

    def kv_block_bytes(self, backward: bool) -> float:
        """One ring exchange: this rank's K and V (and in backward dK and dV) for its sequence
        shard, its TP share of the KV heads (at least one head when tp exceeds them)."""
        m, tp = self.stage.model, self.stage.strategy.tp
        block = (self.stage.kernels.tokens * max(1, m.kv_heads // tp) * m.head_dim
                 * self.stage.element_bytes * 2)
        return block * (2 if backward else 1)

    def attention(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                  deps: tuple[int, ...], backward: bool) -> int:
        """The attention block; with cp > 1 its core runs in cp pieces behind K/V exchanges."""
        if self.degree == 1:
            return self.tensor.block(name, phase, kernels, deps)
        ops, cp = self.stage.ops, self.degree
        is_core = [k.name.split(".")[0] in ATTENTION_CORE for k in kernels]
        first_core = is_core.index(True)
        last_core = len(is_core) - 1 - is_core[::-1].index(True)
        pre, core, post = (kernels[:first_core], kernels[first_core:last_core + 1],
                           kernels[last_core + 1:])
        block = self.kv_block_bytes(backward)
        piece = tuple(_scaled(k, 1.0 / cp) for k in core)
        start = self.tensor.gather_sequence(name, deps)
        op = ops.compute(f"{name}.pre", phase, pre, start) if pre else None
        ready = (op,) if op is not None else start
        exchange = None
        for step in range(cp):
            core_deps = ready if step == 0 else (exchange,)
            if step < cp - 1:
                exchange = ops.collective(f"{name}.cp_ring_{step}", CollectiveKind.RING_EXCHANGE,
                                          block, Axis.CP, ready if step == 0 else (exchange,))
            ops.compute(f"{name}.core_{step}", phase, piece, core_deps)
        out = ops.compute(f"{name}.post", phase, post, ops.after_compute())
        return self.tensor.reduce_if_split(name, out)


def _scaled(k: Kernel, factor: float) -> Kernel:
    return replace(k, flops=k.flops * factor, bytes=k.bytes * factor)

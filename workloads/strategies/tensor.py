"""Tensor parallelism (Megatron, Shoeybi et al. 2019) and its sequence-parallel form.

Per layer an all-reduce after the attention projection and after fc2 in forward, and one per
block in backward; with sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2) each becomes
an all-gather before and a reduce-scatter after the block (backward re-gathers the input for the
weight gradient). With ``tp_comm_overlap`` (Megatron-Core / Transformer Engine userbuffers) those
gathers and reduce-scatters stream in tp chunks beside the GEMMs that consume and produce them.
The vocabulary-parallel embedding and LM head reduce their partial outputs over TP, and the
vocabulary-parallel cross-entropy all-reduces three FP32 values per token (Megatron's
``_VocabParallelCrossEntropy``: max logit, sum of exponentials, target logit).
A block whose GEMMs run in FP8 gathers its input already cast, 1 byte per element (Transformer
Engine's ``LayerNormLinear`` casts before the sequence-parallel all-gather; torchtitan's
``Float8ColwiseParallel`` all-gathers in float8); its reduce-scatter stays 16-bit.
"""

from __future__ import annotations

from clustersim.hardware_specs import OpClass
from clustersim.workloads.axes import Axis
from clustersim.workloads.fp8 import QUANTIZED_GEMM_DTYPES
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.trace import CollectiveKind, Phase

CROSS_ENTROPY_REDUCTIONS = ("max", "sum_exp", "target")
"""The vocabulary-parallel cross-entropy's all-reduces, one FP32 value per token each."""


class TensorParallel:
    """Emits the tensor-parallel communication around a stage's blocks."""

    def __init__(self, stage: StageProgram):
        self.stage = stage
        strategy = stage.strategy
        self.degree = strategy.tp
        self.sequence_parallel = strategy.tp > 1 and strategy.sequence_parallel
        self.overlapped = self.sequence_parallel and strategy.tp_comm_overlap
        self.reduce_kind = (CollectiveKind.REDUCE_SCATTER if strategy.sequence_parallel
                            else CollectiveKind.ALL_REDUCE)
        """How a block's partial outputs are summed: reduce-scatter under sequence
        parallelism (each rank keeps its sequence shard), all-reduce without."""

    def block(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
              deps: tuple[int, ...]) -> int:
        """A block (attention or MLP) with its tensor-parallel communication around it."""
        if self.overlapped:
            gemms = [i for i, k in enumerate(kernels) if k.op_class is OpClass.MATMUL]
            if gemms:
                return self._overlapped_block(name, phase, kernels, deps, gemms[0], gemms[-1])
        deps = self.gather_sequence(name, deps, self._gathered_bytes(kernels))
        op = self.stage.ops.compute(name, phase, kernels, deps)
        return self.reduce(name, (op,)) if self.degree > 1 else op

    def gather_sequence(self, name: str, deps: tuple[int, ...], nbytes: float | None = None
                        ) -> tuple[int, ...]:
        """Sequence parallelism's all-gather of a block's input (``deps`` unchanged without);
        ``nbytes``: the gathered bytes, the 16-bit activation by default."""
        if not self.sequence_parallel:
            return deps
        ops = self.stage.ops
        size = self.stage.activation_bytes if nbytes is None else nbytes
        gather = ops.collective(f"{name}.tp_all_gather", CollectiveKind.ALL_GATHER, size,
                                Axis.TP, deps or ops.after_compute())
        return deps + (gather,)

    def _gathered_bytes(self, kernels: tuple[Kernel, ...]) -> float:
        """The block input's gathered bytes: the quantised element's (1 for FP8, 0.5 + 1/16
        for NVFP4 with its block scales) when its GEMMs run in FP8 or NVFP4."""
        low = [k.dtype for k in kernels
               if k.op_class is OpClass.MATMUL and k.dtype in QUANTIZED_GEMM_DTYPES]
        if not low:
            return self.stage.activation_bytes
        return self.stage.activation_bytes / self.stage.element_bytes * low[0].bytes

    def reduce(self, name: str, deps: tuple[int, ...]) -> int:
        """The sum over TP of a block's (or a vocabulary-parallel layer's) partial output."""
        return self.stage.ops.collective(f"{name}.tp_{self.reduce_kind.value}", self.reduce_kind,
                                         self.stage.activation_bytes, Axis.TP, deps)

    def reduce_if_split(self, name: str, op: int) -> int:
        """``reduce`` after ``op`` when TP splits the work; ``op`` itself otherwise."""
        return self.reduce(name, (op,)) if self.degree > 1 else op

    def cross_entropy(self, name: str, after: int) -> int:
        """The vocabulary-parallel loss's three all-reduces, one after the other."""
        last = after
        for step in CROSS_ENTROPY_REDUCTIONS:
            last = self.stage.ops.collective(f"{name}_{step}.tp_all_reduce",
                                             CollectiveKind.ALL_REDUCE,
                                             self.stage.kernels.tokens * 4.0, Axis.TP, (last,))
        return last

    def _overlapped_block(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
                          deps: tuple[int, ...], first: int, last: int) -> int:
        """Megatron-Core's ``--tp-comm-overlap`` (Transformer Engine userbuffers): the
        all-gather feeding the block's first GEMM and the reduce-scatter of its last one move
        in tp chunks around the ring while the GEMM works on the chunks already there. Only
        the first gathered chunk and the last reduced one wait; the rest of each collective
        runs beside its GEMM."""
        ops = self.stage.ops
        nbytes = self.stage.activation_bytes
        chunk = nbytes / self.degree
        gathered = self._gathered_bytes(kernels)
        gather = ops.collective(f"{name}.tp_all_gather.first_chunk", CollectiveKind.ALL_GATHER,
                                gathered / self.degree, Axis.TP, deps or ops.after_compute())
        streamed = ops.collective(f"{name}.tp_all_gather.overlapped", CollectiveKind.ALL_GATHER,
                                  gathered - gathered / self.degree, Axis.TP, (gather,))
        op = ops.compute(f"{name}.gemm_in", phase, kernels[:first + 1], deps + (gather,))
        if first + 1 < last:
            op = ops.compute(name, phase, kernels[first + 1:last], (op, streamed))
        ready = (op, streamed)
        reduced = ops.collective(f"{name}.tp_reduce_scatter.overlapped",
                                 CollectiveKind.REDUCE_SCATTER, nbytes - chunk, Axis.TP, ready)
        # The last GEMM (and what follows it in the block) runs beside the reduce-scatter; one
        # GEMM that both gathers and reduces streams its chunks both ways.
        rest = kernels[last:] if first < last else kernels[last + 1:]
        if rest:
            op = ops.compute(f"{name}.gemm_out", phase, rest, ready)
        return ops.collective(f"{name}.tp_reduce_scatter.last_chunk",
                              CollectiveKind.REDUCE_SCATTER, chunk, Axis.TP, (op, reduced))

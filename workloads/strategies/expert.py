"""Expert parallelism: a MoE layer's experts split over ``ep`` ranks of the data x
context-parallel group. Each rank routes its own tokens (its sequence shard under sequence
parallelism), sends every token's hidden state to the ranks of its top-k experts (all-to-all
dispatch), runs its local experts, and sends the results back (all-to-all combine), as
GShard (Lepikhin et al. 2020) and Megatron-Core's ``MoEAlltoAllTokenDispatcher`` do; the
collectives carry their routing, which DeepEP's dispatchers cost differently
(``workloads/dispatch.py``).
"""

from __future__ import annotations

from clustersim.workloads.axes import Axis
from clustersim.workloads.dispatch import TokenRouting
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.strategies.program import StageProgram
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.trace import CollectiveKind, Phase

EXPERT_KERNEL_PREFIX = "expert"
"""Kernels named so run on the dispatched tokens, between dispatch and combine."""


class ExpertParallel:
    """Emits MLP blocks: the dense MLP under TP, or routed experts behind all-to-alls."""

    def __init__(self, stage: StageProgram, tensor: TensorParallel):
        self.stage, self.tensor = stage, tensor
        self.degree = stage.strategy.ep
        self.active = stage.model.is_moe and self.degree > 1

    def routing(self) -> TokenRouting:
        """How one rank's tokens fan out in a dispatch (and come back in a combine): each of
        its tokens (its sequence shard under sequence parallelism) to its top-k experts."""
        m, s = self.stage.model, self.stage.strategy
        return TokenRouting(dispatcher=s.ep_dispatcher, tokens=self.stage.kernels.norm_tokens,
                            token_bytes=m.hidden * self.stage.element_bytes, top_k=m.top_k,
                            experts=m.num_experts, groups=m.expert_groups,
                            groups_per_token=m.expert_group_limit or m.expert_groups)

    def mlp(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
            deps: tuple[int, ...]) -> int:
        """MoE MLP: router, dispatch all-to-all, experts, combine all-to-all (for ep > 1)."""
        if not self.active:
            return self.tensor.block(name, phase, kernels, deps)
        ops, routing = self.stage.ops, self.routing()
        local = tuple(k for k in kernels if not k.name.startswith(EXPERT_KERNEL_PREFIX))
        experts = tuple(k for k in kernels if k.name.startswith(EXPERT_KERNEL_PREFIX))
        router = ops.compute(f"{name}.router", phase, local, deps)
        dispatch = ops.collective(f"{name}.ep_dispatch", CollectiveKind.ALL_TO_ALL,
                                  routing.payload_bytes, Axis.EP, (router,), routing=routing)
        mid = ops.compute(f"{name}.experts", phase, experts, (dispatch,))
        return ops.collective(f"{name}.ep_combine", CollectiveKind.ALL_TO_ALL,
                              routing.payload_bytes, Axis.EP, (mid,), routing=routing)

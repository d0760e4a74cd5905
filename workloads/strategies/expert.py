"""Expert parallelism: a MoE layer's experts split over ``ep`` ranks of a pipeline stage, each
expert's FFN over ``etp`` ranks (``workloads/layout.py`` numbers them: Megatron-Core's parallel
folding). Each rank routes its own tokens (its sequence shard under sequence parallelism), sends
every token's hidden state to the ranks of its top-k experts (all-to-all dispatch), runs its
local experts, and sends the results back (all-to-all combine), as GShard (Lepikhin et al. 2020)
and Megatron-Core's ``MoEAlltoAllTokenDispatcher`` do; with etp > 1 the ranks that split an
expert all-gather what was dispatched to them first and reduce-scatter the experts' output before
the combine (the dispatcher's ``gather_from_sequence_parallel_region`` and
``reduce_scatter_to_sequence_parallel_region`` over the expert-TP group). The all-to-alls carry
their routing, which DeepEP's dispatchers cost differently (``workloads/dispatch.py``). The router, permute and shared experts run before the dispatch,
the unpermute and the residual after the combine (in backward the other way round); a capacity
factor shrinks (or pads) what is sent (``workloads/routing.py``). Dense layers of a mixture of
experts (DeepSeek-V3's first three, Llama 4's interleaved ones) are plain tensor-parallel MLPs.
"""

from __future__ import annotations

from clustersim.workloads.axes import EXPERT_TENSOR_GROUP, Axis
from clustersim.workloads.dispatch import DEFAULT_SMS, Dispatcher, TokenRouting
from clustersim.workloads.layer_ops import Kernel
from clustersim.workloads.routing import expert_load
from clustersim.workloads.strategies.program import StageProgram, Steps
from clustersim.workloads.strategies.tensor import TensorParallel
from clustersim.workloads.trace import CollectiveKind, Phase

EXPERT_KERNEL_PREFIX = "expert"
"""Kernels named so run on the dispatched tokens, between dispatch and combine."""
SHARED_KERNEL_PREFIX = "shared"
"""Kernels named so are the shared experts, which every token passes on its own device."""
AFTER_COMBINE = ("unpermute", "residual2")
"""Forward kernels that wait for the combine (in backward they come first, before the
dispatch of the gradients)."""


def _part(kernel: Kernel) -> str:
    """Which part of a MoE block a kernel belongs to: ``experts``, ``shared``, ``after`` (the
    combine) or ``before`` (the dispatch)."""
    base = kernel.name.split(".")[0]
    if base.startswith(EXPERT_KERNEL_PREFIX):
        return "experts"
    if base.startswith(SHARED_KERNEL_PREFIX):
        return "shared"
    return "after" if base in AFTER_COMBINE else "before"


class ExpertParallel:
    """Emits MLP blocks: the dense MLP under TP, or routed experts behind all-to-alls."""

    def __init__(self, stage: StageProgram, tensor: TensorParallel):
        self.stage, self.tensor = stage, tensor
        self.degree = stage.strategy.ep
        self.active = stage.model.is_moe and self.degree > 1
        self._routing = self._token_routing() if self.active else None

    def routing(self) -> TokenRouting:
        """The stage's token routing (the same for every MoE layer and micro-batch)."""
        if self._routing is None:
            self._routing = self._token_routing()
        return self._routing

    def _token_routing(self) -> TokenRouting:
        """How one rank's tokens fan out in a dispatch (and come back in a combine): each of
        its tokens (its sequence shard under sequence parallelism) to its top-k experts, less
        what a capacity drops (or padded up to the capacity)."""
        m, s, job = self.stage.model, self.stage.strategy, self.stage.job
        load = expert_load(self.stage.kernels.expert_tokens, m.top_k, m.num_experts, s.ep,
                           job.training.moe)
        return TokenRouting(dispatcher=s.ep_dispatcher,
                            tokens=self.stage.kernels.norm_tokens * load.sent_per_token / m.top_k,
                            token_bytes=m.hidden * self.stage.element_bytes, top_k=m.top_k,
                            experts=m.num_experts, groups=m.expert_groups,
                            groups_per_token=m.expert_group_limit or m.expert_groups,
                            sms=s.ep_dispatcher_sms or DEFAULT_SMS.get(s.ep_dispatcher, 0))

    def _host_waits(self, backward: bool) -> tuple[bool, bool]:
        """Whether a pass's host waits for the router's token counts before the dispatch, and
        for the dispatch's before the experts (only without padding, ``MoeRouting.host_sync``;
        never in backward, which reuses the forward's counts). Megatron-Core's all-to-all
        dispatcher reads them before its all-to-all (``cuda_sync_point``
        ``before_ep_alltoall``, ``transformer/moe/token_dispatcher.py``); DeepEP's and
        HybridEP's dispatch return them on the device, and ``TEGroupedMLP.forward`` reads them
        before the grouped GEMMs (``tokens_per_expert.tolist()``, ``transformer/moe/experts.py``:
        Transformer Engine's GroupedLinear takes its ``m_splits`` as host integers)."""
        if backward or not self.stage.job.training.moe.host_sync:
            return False, False
        alltoall = self.stage.strategy.ep_dispatcher is Dispatcher.ALLTOALL
        return alltoall, not alltoall

    def mlp(self, name: str, phase: Phase, kernels: tuple[Kernel, ...],
            deps: tuple[int, ...]) -> Steps:
        """MoE MLP: router and permute, dispatch all-to-all, experts, combine all-to-all,
        unpermute (for ep > 1); shared experts after the combine, as Megatron-Core runs them
        without ``--moe-shared-expert-overlap``. Pauses after each all-to-all, where a merged
        pass may run its compute (``program.interleave``)."""
        parts: dict[str, tuple[Kernel, ...]] = {}
        for k in kernels:
            parts[_part(k)] = parts.get(_part(k), ()) + (k,)
        if not self.active or "experts" not in parts:
            return self.tensor.block(name, phase, kernels, deps)
        ops, routing = self.stage.ops, self.routing()
        backward = phase is Phase.BACKWARD
        first, last = ("after", "before") if backward else ("before", "after")
        # Megatron-Core's moe_router/moe_preprocess graphs hold the router's kernels, forward
        # and backward. Where a forward's host waits for token counts: ``_host_waits``.
        graphed = self.stage.strategy.cuda_graphs.router
        router = ops.compute(f"{name}.{'unpermute' if backward else 'router'}", phase,
                             parts.get(first, ()), deps, graphed=graphed and not backward)
        before_dispatch, before_experts = self._host_waits(backward)
        dispatch = ops.collective(f"{name}.ep_dispatch", CollectiveKind.ALL_TO_ALL,
                                  routing.payload_bytes, Axis.EP, (router,), routing=routing,
                                  host_waits=(router,) if before_dispatch else ())
        etp = self.stage.strategy.expert_tp
        # What this rank received (as many tokens as it dispatched, balanced), gathered from
        # the ranks that split its experts, and their output scattered back.
        shared = routing.payload_bytes * etp
        if etp > 1:
            dispatch = ops.collective(f"{name}.etp_all_gather", CollectiveKind.ALL_GATHER, shared,
                                      Axis.EP, (dispatch,), group=EXPERT_TENSOR_GROUP)
        yield
        mid = ops.compute(f"{name}.experts", phase, parts["experts"], (dispatch,),
                          host_waits=(dispatch,) if before_experts else ())
        if etp > 1:
            mid = ops.collective(f"{name}.etp_reduce_scatter", CollectiveKind.REDUCE_SCATTER,
                                 shared, Axis.EP, (mid,), group=EXPERT_TENSOR_GROUP)
        combine = ops.collective(f"{name}.ep_combine", CollectiveKind.ALL_TO_ALL,
                                 routing.payload_bytes, Axis.EP, (mid,), routing=routing)
        yield
        tail = parts.get("shared", ()) + parts.get(last, ())
        if not tail:
            return combine
        router_only = backward and not parts.get("shared")
        return ops.compute(f"{name}.{'router' if backward else 'unpermute'}", phase,
                           tail, (combine,), graphed=graphed and router_only)

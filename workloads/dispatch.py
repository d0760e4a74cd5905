"""How an expert-parallel layer's tokens travel to their experts: the dispatcher a strategy
picks and the routing facts a trace carries so that a cost model can count what it sends."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Dispatcher(enum.Enum):
    """How an expert-parallel layer moves tokens to their experts and back."""

    ALLTOALL = "alltoall"
    """NCCL all-to-all of the permuted tokens: one copy per (token, expert) pair (Megatron-Core's
    ``alltoall`` token dispatcher)."""
    DEEPEP = "deepep"
    """DeepEP's normal kernels: a token crosses the network once per destination node (RDMA),
    then NVLink carries it to each destination GPU there once (Megatron-Core's ``flex``
    dispatcher; DeepSeek-V3 training)."""
    DEEPEP_LL = "deepep_ll"
    """DeepEP's low-latency kernels: one message per (token, expert) pair, straight to the
    expert's GPU (RDMA across nodes, NVLink inside one); made for small decode batches."""


DEFAULT_SMS = {Dispatcher.DEEPEP: 20}
"""SMs a dispatcher's dispatch and combine kernels hold for as long as they run, when the strategy
does not say: Megatron-Core's ``moe_deepep_num_sms = 20`` (megatron/core/transformer/
transformer_config.py at NVIDIA/Megatron-LM 3df200905e, 2025-11, and 8c5cf05ece, 2026-04), which it
hands to DeepEP's ``Buffer.set_num_sms``. NCCL's all-to-all picks its channels (one thread block,
so one SM, each) from the topology at communicator setup, a count no recipe states: not modelled.
DeepEP's low-latency kernels are not modelled either."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenRouting:
    """What an expert-parallel dispatch or combine sends, for dispatchers that send a token once
    per GPU or node rather than once per expert. Experts sit in equal contiguous blocks on the
    ranks of the group; routing is taken as uniform over the experts a token may choose."""

    dispatcher: Dispatcher
    tokens: float
    """Tokens this rank routes (its sequence shard of the micro-batch)."""
    token_bytes: float
    """Bytes of one token's hidden vector as sent."""
    top_k: int
    experts: int
    groups: int = 1
    """Expert groups of group-limited routing (DeepSeek-V3's ``n_group``; 1: none)."""
    groups_per_token: int = 1
    """Groups a token may choose from (DeepSeek-V3's ``topk_group``)."""
    sms: int = 0
    """SMs the dispatch and combine kernels hold while they run, which compute overlapping
    them cannot use (0: not modelled)."""

    @property
    def payload_bytes(self) -> float:
        """One copy per (token, expert) pair: what an all-to-all of permuted tokens sends."""
        return self.tokens * self.top_k * self.token_bytes

"""The axes of parallelism: one vocabulary for the rank layout, the trace's communication
streams and group sets, and the step breakdown's ``exposed_comm_s`` keys.

A group set of a trace is named after its axis (``Axis.TP.value``, ...); two more partitions
belong to the data-parallel axis: the ranks that hold the same experts (``EXPERT_DATA_GROUP``)
and the first and last pipeline stages that share tied embeddings (``TIED_EMBEDDING_GROUP``).
"""

from __future__ import annotations

import enum


class Axis(enum.Enum):
    """A dimension of parallelism; members in the order the step breakdown reports them."""

    TP = "tp"
    """Tensor parallel: each layer's GEMMs split across ranks (Megatron, Shoeybi et al. 2019)."""
    CP = "cp"
    """Context parallel: the sequence split across ranks (ring attention, Liu et al. 2023)."""
    EP = "ep"
    """Expert parallel: a layer's experts split across ranks of the data-parallel group."""
    PP = "pp"
    """Pipeline parallel: the layers split into stages."""
    DP = "dp"
    """Data parallel (with ZeRO sharding): replicas of the model on different batches."""
    SPATIAL = "spatial"
    """Spatial parallel (3D CNNs): each sample's volume split over a grid of ranks, which
    exchange the halos of every convolution (Oyama et al., IEEE TPDS 2021)."""


EXPERT_DATA_GROUP = "edp"
"""Ranks of a pipeline stage that hold the same expert shard (tp x cp x dp / (ep x etp) of them;
Megatron-Core's expert-data-parallel group): expert gradients are reduced, and ZeRO shards expert
state, over them."""
DP_SHARD_GROUP = "dp_shard"
"""HSDP: the data x context-parallel ranks of a (pp, tp) position that share one ZeRO shard
(``strategy.dp_shard`` x cp consecutive ones, inside a node when they fit): ZeRO-3 gathers and
reduce-scatters over them (torchtitan's ``dp_shard_cp`` mesh)."""
DP_REPLICATE_GROUP = "dp_replicate"
"""HSDP: the ranks at the same place of every shard group (``dp / dp_shard`` of them, across
nodes): they all-reduce their reduced gradient shards (torchtitan's ``dp_replicate`` mesh)."""
EXPERT_TENSOR_GROUP = "etp"
"""Ranks that split each expert's FFN between them (Megatron-Core's expert-tensor-parallel
group): they gather the tokens dispatched to them before the experts and reduce-scatter after."""
SUBNETWORK_DATA_GROUP = "sdp"
"""Subnetwork Data Parallelism: the data-parallel replicas whose subnetworks hold the same
transformer block (dp x layers / L of them, ``workloads/subnetworks.py``); block gradients are
reduced, and ZeRO shards block state, over them."""
CP_A2A_GROUP = "cp_a2a"
"""Hierarchical context parallelism: consecutive ranks of a CP group that exchange heads by
all-to-all (Megatron-Core's ``hierarchical_context_parallel_sizes[0]``)."""
CP_RING_GROUP = "cp_ring"
"""Hierarchical context parallelism: the ranks at the same place of every all-to-all domain of a
CP group, which pass K/V blocks around a ring."""
TIED_EMBEDDING_GROUP = "embedding"
"""The first and last pipeline stage of a pipeline, which both hold a tied embedding table and
all-reduce its gradient (Megatron's embedding group)."""

"""Rank <-> coordinates in the parallel grid, with a fixed axis order: TP innermost.

Ranks are numbered ``rank = tp + TP * (cp + CP * (dp + DP * pp))``, as Megatron-LM orders them
(tp-cp-dp-pp), so a TP group is consecutive ranks inside one node and PP is outermost. The expert
layers number the same tp x cp x dp ranks of a pipeline stage their own way (Megatron-Core's
parallel folding, its expert rank generator ``tp-ep-dp``): ``stage_rank = etp + ETP * (ep + EP *
edp)``. With etp = tp (the default) an EP group is a block of ``ep`` consecutive ranks of one
data x context-parallel group; with etp = 1 it is ``ep`` consecutive ranks of the stage, its
attention TP peers included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.workloads.axes import (
    CP_A2A_GROUP, CP_RING_GROUP, DP_REPLICATE_GROUP, DP_SHARD_GROUP, EXPERT_DATA_GROUP,
    EXPERT_TENSOR_GROUP, SUBNETWORK_DATA_GROUP, TIED_EMBEDDING_GROUP, Axis,
)

AXIS_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
"""The axes that number the ranks, innermost first (EP is carved out of DP x CP)."""

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    """Expert-parallel degree; ep x etp divides tp x cp x dp."""
    etp: int = 0
    """Expert-tensor-parallel degree; 0: tp."""
    cp_a2a: int = 1
    """Hierarchical context parallelism: ranks of each all-to-all domain of a CP group."""
    dp_shard: int = 0
    """HSDP: data-parallel ranks of each shard group (the inner part of dp); 0: dp."""
    sdp: int = 0
    """Subnetwork Data Parallelism: data x context-parallel ranks holding one block (0: none);
    consecutive replicas, as round-robin subnetworks of consecutive blocks place them."""

    def size(self, axis: Axis) -> int:
        return getattr(self, axis.value)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def stride(self, axis: Axis) -> int:
        """Rank distance between neighbours along ``axis`` (one of ``AXIS_ORDER``)."""
        out = 1
        for a in AXIS_ORDER:
            if a is axis:
                return out
            out *= self.size(a)
        raise ValueError(axis)

    def coords(self, rank: int) -> dict[Axis, int]:
        out = {}
        for a in AXIS_ORDER:
            out[a] = rank % self.size(a)
            rank //= self.size(a)
        return out

    def rank(self, coords: dict[Axis, int]) -> int:
        return sum(coords.get(a, 0) * self.stride(a) for a in AXIS_ORDER)

    def group(self, axis: Axis, rank: int) -> tuple[int, ...]:
        """The ranks that share every coordinate with ``rank`` except ``axis``."""
        base = rank - self.coords(rank)[axis] * self.stride(axis)
        return tuple(base + i * self.stride(axis) for i in range(self.size(axis)))

    def span(self, axis: Axis, devices_per_node: int) -> tuple[int, int]:
        """(devices of a group inside one node, nodes a group spans), for rank 0's group;
        every group of the axis has the same shape because the grid is regular."""
        members = self.group(axis, 0)
        nodes = {r // devices_per_node for r in members}
        return len(members) // len(nodes), len(nodes)

    def partition(self, name: str) -> Groups:
        """Every group of one group set, named after its axis (``dp`` is the data x context
        ranks that hold the same parameters), or another partition of ``workloads.axes``."""
        tp, cp, dp, pp = self.tp, self.cp, self.dp, self.pp
        grid = np.arange(self.world_size).reshape(pp, dp, cp, tp)
        replicas = grid.transpose(0, 3, 1, 2).reshape(-1, dp * cp)  # per (pp, tp) position
        etp = self.etp or tp
        edp = tp * cp * dp // (self.ep * etp)
        # Expert numbering of each stage: (pp, edp, ep, etp), etp innermost.
        experts = grid.reshape(pp, edp, self.ep, etp)
        a2a = self.cp_a2a
        cp_groups = grid.transpose(0, 1, 3, 2).reshape(-1, cp)
        # HSDP: dp = replicate x shard, shard inner (torchtitan's mesh pp, dp_replicate,
        # dp_shard, cp, tp); per (pp, tp) position, indices (pp, tp, replicate, shard, cp).
        shard = self.dp_shard or dp
        hybrid = grid.reshape(pp, dp // shard, shard, cp, tp).transpose(0, 4, 1, 2, 3)
        arrays = {
            Axis.TP.value: lambda: grid.reshape(-1, tp),
            Axis.CP.value: lambda: cp_groups,
            Axis.PP.value: lambda: grid.transpose(1, 2, 3, 0).reshape(-1, pp),
            Axis.DP.value: lambda: replicas,
            Axis.SPATIAL.value: lambda: grid.reshape(-1, 1),   # a transformer splits no volume
            Axis.EP.value: lambda: experts.transpose(0, 3, 1, 2).reshape(-1, self.ep),
            DP_SHARD_GROUP: lambda: hybrid.reshape(-1, shard * cp),
            DP_REPLICATE_GROUP: lambda: hybrid.transpose(0, 1, 3, 4, 2).reshape(-1, dp // shard),
            EXPERT_DATA_GROUP: lambda: experts.transpose(0, 3, 2, 1).reshape(-1, edp),
            EXPERT_TENSOR_GROUP: lambda: experts.reshape(-1, etp),
            CP_A2A_GROUP: lambda: cp_groups.reshape(-1, a2a),
            CP_RING_GROUP: lambda: cp_groups.reshape(-1, cp // a2a, a2a).transpose(0, 2, 1)
            .reshape(-1, cp // a2a),
            SUBNETWORK_DATA_GROUP: lambda: replicas.reshape(-1, self.sdp or dp * cp),
            TIED_EMBEDDING_GROUP: lambda: grid[[0, pp - 1]].transpose(1, 2, 3, 0).reshape(-1, 2),
        }
        if name not in arrays:
            raise ValueError(f"unknown group set {name!r}; expected one of {sorted(arrays)}")
        return tuple(tuple(int(r) for r in row) for row in arrays[name]())

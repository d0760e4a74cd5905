"""Rank <-> coordinates in the parallel grid, with a fixed axis order: TP innermost.

Ranks are numbered ``rank = tp + TP * (cp + CP * (dp + DP * pp))``, as Megatron-LM orders them
(tp-cp-dp-pp), so a TP group is consecutive ranks inside one node and PP is outermost. Expert
parallelism lives inside the data x context-parallel group: its groups are consecutive blocks of
``ep`` ranks there, and the ranks at the same place of every block hold the same experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.workloads.axes import EXPERT_DATA_GROUP, TIED_EMBEDDING_GROUP, Axis

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
    """Expert-parallel degree; divides dp x cp."""

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
        ranks that hold the same parameters), or ``EXPERT_DATA_GROUP`` /
        ``TIED_EMBEDDING_GROUP`` (see ``workloads.axes``)."""
        tp, cp, dp, pp = self.tp, self.cp, self.dp, self.pp
        grid = np.arange(self.world_size).reshape(pp, dp, cp, tp)
        replicas = grid.transpose(0, 3, 1, 2).reshape(-1, dp * cp)  # per (pp, tp) position
        arrays = {
            Axis.TP.value: lambda: grid.reshape(-1, tp),
            Axis.CP.value: lambda: grid.transpose(0, 1, 3, 2).reshape(-1, cp),
            Axis.PP.value: lambda: grid.transpose(1, 2, 3, 0).reshape(-1, pp),
            Axis.DP.value: lambda: replicas,
            Axis.EP.value: lambda: replicas.reshape(-1, self.ep),
            EXPERT_DATA_GROUP: lambda: replicas.reshape(-1, dp * cp // self.ep, self.ep)
            .transpose(0, 2, 1).reshape(-1, dp * cp // self.ep),
            TIED_EMBEDDING_GROUP: lambda: grid[[0, pp - 1]].transpose(1, 2, 3, 0).reshape(-1, 2),
        }
        if name not in arrays:
            raise ValueError(f"unknown group set {name!r}; expected one of {sorted(arrays)}")
        return tuple(tuple(int(r) for r in row) for row in arrays[name]())

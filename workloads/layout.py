"""Rank <-> coordinates in the parallel grid, with a fixed axis order: TP innermost.

Ranks are numbered ``rank = tp + TP * (cp + CP * (dp + DP * pp))``, as Megatron-LM orders them
(tp-cp-dp-pp), so a TP group is consecutive ranks inside one node and PP is outermost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Axis(enum.Enum):
    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"


AXIS_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1

    def size(self, axis: Axis) -> int:
        return getattr(self, axis.value)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def stride(self, axis: Axis) -> int:
        """Rank distance between neighbours along ``axis``."""
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

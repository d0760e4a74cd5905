"""Rank classes: ranks whose op streams and conditions are identical are simulated once.

Start from one label per (program, fault condition) - or one per rank, fully expanded - and
refine: two ranks stay together only if, for every group set, their groups hold the same
labels in the same positions. At the fixed point every member of a class waits on the same
classes at every collective and send/recv, so simulating one representative per class, with
its multiplicity, gives the same times as simulating every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from clustersim.workloads.trace import Trace


@dataclass(frozen=True, slots=True)
class RankClass:
    index: int
    program: int
    ranks: tuple[int, ...]

    @property
    def representative(self) -> int:
        return self.ranks[0]

    @property
    def multiplicity(self) -> int:
        return len(self.ranks)


def _relabel(columns: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(columns, axis=1)
    _, inverse = np.unique(stacked, axis=0, return_inverse=True)
    return inverse.reshape(-1)


def rank_classes(trace: Trace, conditions: Mapping[int, object] | None = None,
                 expand: bool = False) -> tuple[tuple[RankClass, ...], np.ndarray]:
    """Classes, and each rank's class index. ``conditions`` maps a rank to what sets it apart
    (a straggler factor, a degraded link); ``expand`` puts every rank in its own class."""
    world = trace.world_size
    program_of = np.empty(world, dtype=np.int64)
    for i, prog in enumerate(trace.programs):
        program_of[list(prog.ranks)] = i
    if expand:
        labels = np.arange(world)
    else:
        cond_ids: dict[object, int] = {}
        cond = np.zeros(world, dtype=np.int64)
        for rank, c in sorted((conditions or {}).items()):
            cond[rank] = cond_ids.setdefault(c, len(cond_ids) + 1)
        labels = _relabel([program_of, cond])
        if conditions:
            labels = _refine(trace, labels)
    # Ranks sorted by label (stable: ascending within a label), cut where the label changes:
    # linear in ranks, where a scan per class was quadratic with one class per rank.
    order = np.argsort(labels, kind="stable")
    _, starts = np.unique(labels[order], return_index=True)
    classes = []
    index = np.empty(world, dtype=np.int64)
    for new, members in enumerate(np.split(order, starts[1:])):
        ranks = tuple(members.tolist())
        classes.append(RankClass(new, int(program_of[ranks[0]]), ranks))
        index[members] = new
    return tuple(classes), index


def _refine(trace: Trace, labels: np.ndarray) -> np.ndarray:
    world = trace.world_size
    while True:
        columns = [labels]
        for gs in trace.group_sets.values():
            sizes = {len(g) for g in gs.groups}
            for size in sizes:
                groups = np.array([g for g in gs.groups if len(g) == size], dtype=np.int64)
                # Each group's ordered member labels -> a row id, given to every member.
                rows = _relabel([labels[groups[:, j]] for j in range(size)]) + 1
                row_of = np.zeros(world, dtype=np.int64)
                for j in range(size):
                    row_of[groups[:, j]] = rows
                columns.append(row_of)
        new = _relabel(columns)
        if len(np.unique(new)) == len(np.unique(labels)):
            return new
        labels = new

"""Which devices a rank class's collectives and sends involve, from the trace's group sets.

Asked once per (group set, classes) and per send/recv pairing of two classes, over every rank of
those classes: arrays over ranks, so that a 16,384-GPU step does not walk its ranks in Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from clustersim.simulator.classes import RankClass
from clustersim.simulator.cost.interfaces import Instances
from clustersim.workloads.trace import Trace


class DeviceGroups:
    def __init__(self, trace: Trace, classes: tuple[RankClass, ...], class_of: np.ndarray,
                 device_of: Callable[[int], int]):
        self.trace, self.classes, self.class_of = trace, classes, class_of
        self.device = np.fromiter(map(device_of, range(trace.world_size)), dtype=np.int64,
                                  count=trace.world_size)
        """rank -> the device that runs it."""
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._instances: dict[tuple[str, frozenset[int]], Instances] = {}

    def table(self, group_set: str) -> tuple[np.ndarray, np.ndarray]:
        """A group set as arrays: its groups' members by row (-1 past a short group's end)
        and each rank's row."""
        hit = self._tables.get(group_set)
        if hit is None:
            groups = self.trace.group_sets[group_set].groups
            sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
            flat = np.fromiter(itertools.chain.from_iterable(groups), dtype=np.int64,
                               count=int(sizes.sum()))
            row = np.repeat(np.arange(len(groups)), sizes)
            column = np.arange(len(flat)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            members = np.full((len(groups), int(sizes.max())), -1, dtype=np.int64)
            members[row, column] = flat
            index = np.full(self.trace.world_size, -1, dtype=np.int64)
            index[flat] = row
            hit = self._tables[group_set] = (members, index)
        return hit

    def instances(self, group_set: str, classes: frozenset[int]) -> Instances:
        """Device groups of ``group_set`` that hold ranks of ``classes``, in the set's order:
        the collectives that run together when these classes reach it (every DP group of a
        stage, say)."""
        key = (group_set, classes)
        hit = self._instances.get(key)
        if hit is None:
            _, index = self.table(group_set)
            ranks = np.concatenate([np.array(self.classes[c].ranks, dtype=np.int64)
                                    for c in classes])
            groups = self.trace.group_sets[group_set].groups
            hit = self._instances[key] = tuple(
                tuple(self.device[list(groups[i])].tolist())
                for i in np.unique(index[ranks]).tolist())
        return hit

    def pairs(self, group_set: str, peer: int, src: int, dst: int,
              sending: bool) -> list[tuple[int, int]]:
        """(sending device, receiving device) of every send from class ``src`` to class
        ``dst`` over ``group_set``'s member ``peer``, listed by the ranks of the class whose op
        asks (the sender's when ``sending``)."""
        members, index = self.table(group_set)
        mine, other = (src, dst) if sending else (dst, src)
        ranks = np.array(self.classes[mine].ranks, dtype=np.int64)
        partners = members[index[ranks], peer]
        kept = self.class_of[partners] == other
        ours, theirs = self.device[ranks[kept]].tolist(), self.device[partners[kept]].tolist()
        return list(zip(ours, theirs) if sending else zip(theirs, ours))

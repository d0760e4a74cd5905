"""Who meets whom when every rank keeps its own clock: index tables over the lanes of rank classes.

The lane engine (``lanes.py``) moves the ranks of one class together, each with its own clock (a
*lane*). A collective's group starts when its last member arrives: with the arrivals of every class
that meets laid end to end in one array, that is a gather by an index matrix and a max per row.
A send and its recv start when both sides have posted: a permutation between the sending and the
receiving class's lanes. The tables are built once per (group set, class) and per pairing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from clustersim.simulator.cost.interfaces import Instances
from clustersim.workloads.trace import GroupSet

Lanes = float | np.ndarray
"""One time (or factor) per lane; a float when every lane has the same one."""


class Unsupported(Exception):
    """A trace whose ranks of one class meet ranks of different classes at the same op: it needs
    the per-rank engine."""


def settle(values: Lanes) -> Lanes:
    """An array whose lanes all agree, as that one float (exact: no arithmetic)."""
    if isinstance(values, np.ndarray):
        first = values[0]
        if (values == first).all():
            return float(first)
    return values


def latest(values: list[Lanes]) -> Lanes:
    """Lane-wise maximum of times (0.0 for none)."""
    if not values:
        return 0.0
    if all(isinstance(v, float) for v in values):
        return max(values)
    out = values[0]
    for v in values[1:]:
        out = np.maximum(out, v)
    return settle(out)


@dataclass(frozen=True, slots=True)
class LaneMap:
    """Where each rank sits: its class and its position (lane) among the class's ranks."""

    class_of: np.ndarray
    lane_of: np.ndarray
    ranks: tuple[np.ndarray, ...]
    """Each class's ranks, in lane order."""
    net_slow: np.ndarray | None
    """rank -> factor on the network (scale-out) part of its transfers (None: all healthy)."""
    intra_slow: np.ndarray | None
    """rank -> factor on the scale-up (NVLink) part of its transfers (None: all healthy)."""

    def factor(self, members: np.ndarray) -> tuple[Lanes, Lanes]:
        """(network, scale-up) stretch of each row of ``members`` (ranks): its slowest
        member's."""
        return tuple(1.0 if slow is None else settle(slow[members].max(axis=1))
                     for slow in (self.net_slow, self.intra_slow))


@dataclass(frozen=True, eq=False, slots=True)
class CollectiveTable:
    """One collective of a group set as the classes that meet in it see it."""

    classes: tuple[int, ...]
    """The classes whose ranks share its groups (sorted)."""
    sizes: tuple[int, ...]
    """Lanes of each of ``classes``."""
    members: np.ndarray
    """(groups, group size): each member's position in the classes' lanes laid end to end."""
    row_of: Mapping[int, np.ndarray]
    """class -> the group (row) of each of its lanes."""
    instances: Instances
    """The groups as devices, for the network plan (sorted by group index, as collapsed)."""
    link_factor: tuple[Lanes, Lanes]
    """Per group, (network, scale-up): the slowest links of its members."""

    def start(self, arrived: Mapping[int, Lanes]) -> Lanes:
        """Per group: when its last member arrived."""
        times = [arrived[c] for c in self.classes]
        if all(isinstance(t, float) for t in times):
            return max(times)
        if len(times) == 1:
            flat = times[0]
        else:
            flat = np.concatenate([np.broadcast_to(t, n) for t, n in zip(times, self.sizes)])
        return settle(flat[self.members].max(axis=1))

    def spread(self, per_group: Lanes, cls: int) -> Lanes:
        """Per-group times as the lanes of ``cls`` see them."""
        if isinstance(per_group, float):
            return per_group
        return settle(per_group[self.row_of[cls]])


def collective_table(gs: GroupSet, cls: int, lanes: LaneMap,
                     device_of: Callable[[int], int]) -> CollectiveTable:
    """The table of ``gs`` for class ``cls``: its groups and everyone else's who must meet."""
    rows: set[int] = set()
    classes: set[int] = set()
    todo = {cls}
    while todo:  # close over classes: a class that meets here brings all its groups
        c = todo.pop()
        classes.add(c)
        for r in lanes.ranks[c].tolist():
            row = gs.index[r]
            if row not in rows:
                rows.add(row)
                todo.update(int(lanes.class_of[m]) for m in gs.groups[row]
                            if int(lanes.class_of[m]) not in classes)
    ordered = sorted(rows)
    if len({len(gs.groups[i]) for i in ordered}) != 1:
        raise Unsupported(f"groups of {gs.name} differ in size")
    ranks = np.array([gs.groups[i] for i in ordered], dtype=np.int64)
    order = tuple(sorted(classes))
    sizes = tuple(len(lanes.ranks[c]) for c in order)
    offset = np.zeros(int(lanes.class_of.max()) + 1, dtype=np.int64)
    offset[list(order)] = np.cumsum((0,) + sizes[:-1])
    members = offset[lanes.class_of[ranks]] + lanes.lane_of[ranks]
    row_index = {row: k for k, row in enumerate(ordered)}
    row_of = {c: np.array([row_index[gs.index[r]] for r in lanes.ranks[c].tolist()],
                          dtype=np.int64) for c in order}
    instances = tuple(tuple(device_of(int(r)) for r in row) for row in ranks)
    return CollectiveTable(order, sizes, members, row_of, instances, lanes.factor(ranks))


@dataclass(frozen=True, eq=False, slots=True)
class PairTable:
    """Sends of one class to another over a group set's peer: pair ``i`` is sending lane ``i``."""

    src: int
    dst: int
    dst_lane: np.ndarray
    """Pair (sending lane) -> receiving lane."""
    src_lane: np.ndarray
    """Receiving lane -> pair (sending lane)."""
    src_ranks: np.ndarray
    dst_ranks: np.ndarray
    """The ranks of each pair."""
    link_factor: tuple[Lanes, Lanes]

    def start(self, send_posted: Lanes, recv_posted: Lanes) -> Lanes:
        """Per pair: when both sides had posted."""
        if isinstance(recv_posted, np.ndarray):
            recv_posted = recv_posted[self.dst_lane]
        return latest([send_posted, recv_posted])

    def to_receiver(self, per_pair: Lanes) -> Lanes:
        if isinstance(per_pair, float):
            return per_pair
        return settle(per_pair[self.src_lane])


def pair_table(gs: GroupSet, peer: int, cls: int, sending: bool, lanes: LaneMap) -> PairTable:
    """The pairing of class ``cls``'s send (or recv) to group position ``peer``."""
    mine = lanes.ranks[cls]
    partners = np.array([gs.groups[gs.index[r]][peer] for r in mine.tolist()], dtype=np.int64)
    other = np.unique(lanes.class_of[partners])
    if len(other) != 1:
        raise Unsupported(f"ranks of class {cls} exchange with several classes over {gs.name}")
    other_cls = int(other[0])
    other_lanes = lanes.lane_of[partners]
    if len(other_lanes) != len(lanes.ranks[other_cls]) or len(np.unique(other_lanes)) != len(
            other_lanes):
        raise Unsupported(f"sends of class {cls} over {gs.name} are not one per partner rank")
    inverse = np.empty_like(other_lanes)
    inverse[other_lanes] = np.arange(len(other_lanes))
    if sending:
        src, dst, dst_lane, src_lane, src_ranks = cls, other_cls, other_lanes, inverse, mine
    else:
        src, dst, dst_lane, src_lane = other_cls, cls, inverse, other_lanes
        src_ranks = lanes.ranks[other_cls]
    dst_ranks = lanes.ranks[dst][dst_lane]
    return PairTable(src, dst, dst_lane, src_lane, src_ranks, dst_ranks,
                     lanes.factor(np.stack([src_ranks, dst_ranks], axis=1)))

"""Flow-level network: transfers in flight share link bandwidth max-min fairly.

Each transfer carries, per link, the bytes it must push through that link; all its links
advance together (a collective finishes when its slowest part does), so a transfer's state is
one progress fraction. Links share their capacity among the transfers crossing them: a transfer
moving at ``level`` times its speed alone on the network takes ``level`` of the capacity of its
busiest links (in time: bytes over capacity) and proportionally less of its lighter ones, and
the levels follow progressive filling (Bertsekas & Gallager, Data Networks, sec. 6.5.2): raise
every unfrozen transfer's level together until a link saturates, freeze the transfers crossing
it, repeat. Two transfers whose bottleneck is the same link get half of it each, whatever their
sizes: a small transfer sharing a link with a large one gets half the link, not half the large
one's pace. Busiest is measured in time, not bytes, so that a trunk (a pod's core uplinks,
thousands of flows over thousands of times one NIC's capacity) is no busier than the NICs
feeding it: a pipeline send of a thousand GPU pairs gets half of each NIC it shares with a
data-parallel reduce-scatter, as each of its thousand flows would. Rates are recomputed
whenever a transfer starts or ends; between those instants they are constant, so the next
completion is known exactly and one timer is enough.

Links that carry the same bytes of the same transfers and have the same capacity behave as one
(the rank-class symmetry makes thousands of NIC links identical), so the links in use are kept
as *regions*: sets of links with one capacity and one list of (transfer, share). A transfer
starting splits regions by set intersection; one ending merges them back. Progressive filling
then runs over a handful of regions instead of thousands of links.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from clustersim.hardware_specs.topology import Link

_EPS = 1e-12


@dataclass(eq=False)
class _Transfer:
    id: int
    done: simpy.Event
    alone_s: float
    """Its time alone on the network (its busiest link's bytes over that link's capacity):
    progress rate = level / alone_s, where level is the fraction of its speed alone."""
    remaining: float = 1.0
    rate: float = 0.0


@dataclass(eq=False)
class _Region:
    links: frozenset[Link]
    capacity: float
    members: tuple[tuple[int, float], ...]
    """(transfer id, fraction of these links' capacity it takes at its speed alone) of every
    transfer crossing these links."""


class _LinkSets:
    """Link sets by value, each kept once, and the cuts and unions of regions memoised on
    them: the same few sets of thousands of NIC links meet again and again (every pipeline send
    of a stage pair, every gradient reduction of a stage), and cutting them anew each time
    costs as much as the rest of the flow model."""

    __slots__ = ("_by_value", "_cuts", "_unions")

    def __init__(self):
        self._by_value: dict[frozenset[Link], frozenset[Link]] = {}
        self._cuts: dict[tuple[int, int], tuple] = {}
        self._unions: dict[tuple[int, int], frozenset[Link]] = {}

    def canonical(self, links: frozenset[Link]) -> frozenset[Link]:
        return self._by_value.setdefault(links, links)

    def cut(self, a: frozenset[Link], b: frozenset[Link]) -> tuple[frozenset[Link], ...]:
        """(a & b, a - b, b - a) of two canonical sets, canonical."""
        key = (id(a), id(b))
        hit = self._cuts.get(key)
        if hit is None:
            shared = a & b
            hit = self._cuts[key] = ((self.canonical(shared), self.canonical(a - shared),
                                      self.canonical(b - shared)) if shared else (shared, a, b))
        return hit

    def union(self, a: frozenset[Link], b: frozenset[Link]) -> frozenset[Link]:
        key = (id(a), id(b))
        hit = self._unions.get(key)
        if hit is None:
            hit = self._unions[key] = self.canonical(a | b)
        return hit


Piece = tuple[frozenset[Link], float, float]
"""Links of one transfer that carry the same bytes and have the same capacity."""


class FlowNetwork:
    def __init__(self, env: simpy.Environment, capacity: Callable[[Link], float]):
        self.env = env
        self.capacity = capacity
        self.active: dict[int, _Transfer] = {}
        self.regions: list[_Region] = []
        self.last_update = 0.0
        self.generation = 0
        self.recomputes = 0
        self._ids = itertools.count()
        self._pieces: dict[int, tuple[tuple, tuple[Piece, ...]]] = {}
        self._sets = _LinkSets()

    def transfer(self, loads: tuple[tuple[Link, float], ...]) -> simpy.Event:
        """Start a transfer; the event fires when every link has carried its bytes."""
        done = self.env.event()
        pieces = self._split(loads)
        if not pieces:
            done.succeed()
            return done
        self._advance()
        alone_s = max(b / cap for _, b, cap in pieces)
        t = _Transfer(next(self._ids), done, alone_s)
        self.active[t.id] = t
        self._join(t.id, tuple((links, b / cap / alone_s, cap) for links, b, cap in pieces))
        self._reschedule()
        return done

    def _split(self, loads: tuple[tuple[Link, float], ...]) -> tuple[Piece, ...]:
        """Group a transfer's links by (bytes, capacity); memoised per loads tuple."""
        hit = self._pieces.get(id(loads))
        if hit is not None and hit[0] is loads:
            return hit[1]
        pieces: list[Piece] = []
        if loads:  # thousands of links: grouped in array operations, in first-seen order
            links, sizes = zip(*loads)
            kept = np.array(sizes, dtype=float) > 0
            links = tuple(itertools.compress(links, kept.tolist()))
            sizes_of, size = np.unique(np.array(sizes, dtype=float)[kept], return_inverse=True)
            capacities, capacity = np.unique(np.fromiter(map(self.capacity, links), dtype=float,
                                                         count=len(links)), return_inverse=True)
            pairs, first, group = np.unique(size * len(capacities) + capacity,
                                            return_index=True, return_inverse=True)
            for g in np.argsort(first, kind="stable").tolist():
                members = frozenset(itertools.compress(links, (group == g).tolist()))
                b, cap = divmod(int(pairs[g]), len(capacities))
                pieces.append((self._sets.canonical(members), float(sizes_of[b]),
                               float(capacities[cap])))
        self._pieces[id(loads)] = (loads, tuple(pieces))
        return self._pieces[id(loads)][1]

    # --- regions -------------------------------------------------------------------------
    def _join(self, tid: int, pieces: tuple[Piece, ...]) -> None:
        left = [[links, b, cap] for links, b, cap in pieces]
        out: list[_Region] = []
        cut = self._sets.cut
        for region in self.regions:
            rest = region.links
            for piece in left:
                if piece[2] != region.capacity or not piece[0]:
                    continue
                shared, rest, piece[0] = cut(rest, piece[0])
                if shared:
                    out.append(_Region(shared, region.capacity, region.members + ((tid, piece[1]),)))
                    if not rest:
                        break
            if rest:
                out.append(_Region(rest, region.capacity, region.members))
        out += [_Region(links, cap, ((tid, b),)) for links, b, cap in left if links]
        self.regions = out

    def _leave(self, tid: int) -> None:
        merged: dict[tuple, frozenset[Link]] = {}
        union = self._sets.union
        for region in self.regions:
            members = tuple(m for m in region.members if m[0] != tid)
            if members:
                key = (region.capacity, members)
                before = merged.get(key)
                merged[key] = region.links if before is None else union(before, region.links)
        self.regions = [_Region(links, cap, members)
                        for (cap, members), links in merged.items()]

    # --- rates ---------------------------------------------------------------------------
    def _advance(self) -> None:
        """Move every transfer forward to now at its current rate."""
        now = self.env.now
        elapsed = now - self.last_update
        if elapsed > 0:
            for t in self.active.values():
                t.remaining -= t.rate * elapsed
        self.last_update = now

    def _rates(self) -> None:
        self.recomputes += 1
        residual = [1.0] * len(self.regions)  # fraction of each region's capacity left
        for t in self.active.values():
            t.rate = 0.0
        unfrozen = set(self.active)
        level = 0.0
        while unfrozen:
            best, bottlenecks, demands = None, [], []
            for i, region in enumerate(self.regions):
                demand = sum(b for tid, b in region.members if tid in unfrozen)
                demands.append(demand)
                if demand <= 0:
                    continue
                step = residual[i] / demand
                if best is None or step < best - _EPS:
                    best, bottlenecks = step, [i]
                elif abs(step - best) <= _EPS:
                    bottlenecks.append(i)
            if best is None:
                break
            level += best
            for i, demand in enumerate(demands):
                residual[i] -= best * demand
            for i in bottlenecks:
                for tid, _ in self.regions[i].members:
                    if tid in unfrozen:
                        t = self.active[tid]
                        t.rate = level / t.alone_s
                        unfrozen.discard(tid)

    def _reschedule(self) -> None:
        self._rates()
        self.generation += 1
        if not self.active:
            return
        wait = min(t.remaining / t.rate for t in self.active.values() if t.rate > 0)
        self.env.process(self._timer(self.generation, max(wait, 0.0)))

    def _timer(self, generation: int, wait: float):
        yield self.env.timeout(wait)
        if generation != self.generation:
            return
        self._advance()
        now = self.env.now
        # Done: nothing left, or so little that finishing it would not move the clock (the
        # leftover of floating-point rounding).
        finished = [t for t in self.active.values()
                    if t.remaining <= 1e-9 or (t.rate > 0 and now + t.remaining / t.rate <= now)]
        for t in finished:
            del self.active[t.id]
            self._leave(t.id)
            t.done.succeed()
        self._reschedule()

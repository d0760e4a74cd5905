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

A step's transfers follow the same few patterns micro-batch after micro-batch, so the regions
and the levels are kept as *states* of the network, interned by value, with their transitions
memoised: a transfer starting or ending, when that state has been seen before, is two dict
look-ups, and progressive filling runs once per distinct state. A state names its transfers by
their rank in start order (a slot), so the same pattern met at any time is the same state; the
arithmetic on a miss is the same as for the transfers themselves, so times are bit-identical.
The next completion is one SimPy timeout with a callback, no process: it is armed by an urgent
event, as a process's first step would be, so same-time events keep the order they had when
each timer was a process.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.events import URGENT, Timeout

from clustersim.hardware_specs.topology import Link

_EPS = 1e-12
_STATE_BUDGET = 1_000_000
"""Region members kept over all interned states before they are forgotten (some tens of MB): a
step repeats a few thousand states, but traffic that never repeats would keep every one."""

Region = tuple[frozenset[Link], float, tuple[tuple[int, float], ...]]
"""Links with one capacity, and (slot, fraction of these links' capacity it takes at its speed
alone) of every transfer crossing them, in slot order."""


@dataclass(eq=False, slots=True)
class _Transfer:
    done: simpy.Event
    alone_s: float
    """Its time alone on the network (its busiest link's bytes over that link's capacity):
    progress rate = level / alone_s, where level is the fraction of its speed alone."""
    remaining: float = 1.0
    rate: float = 0.0


class _Shape:
    """A transfer's pieces as regions see them: (links, fraction of their capacity taken at
    its speed alone, capacity); one object per distinct value, so it keys transitions by
    identity."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: tuple[tuple[frozenset[Link], float, float], ...]):
        self.pieces = pieces


class _State:
    """The regions of the transfers in flight, which are named by slot (start order), the
    states one start or one end leads to, and the levels once computed."""

    __slots__ = ("regions", "size", "joins", "leaves", "levels")

    def __init__(self, regions: tuple[Region, ...], size: int):
        self.regions = regions
        self.size = size
        self.joins: dict[_Shape, _State] = {}
        self.leaves: dict[int, _State] = {}
        self.levels: tuple[float | None, ...] | None = None


class _Arm(simpy.Event):
    """An urgent event at the current time that runs ``callback``: where a process would
    take its first step (SimPy's Initialize), without a generator. ``wait``: the delay of the
    timer it arms."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None],
                 wait: float):
        self.env = env
        self.callbacks = [callback]
        self._value = None
        self._ok = True
        self.wait = wait
        env.schedule(self, URGENT)


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
        self.active: list[_Transfer] = []
        """Transfers in flight in start order: a transfer's index is its slot."""
        self.last_update = 0.0
        self._arming: _Arm | None = None
        """The arm of the latest rates; an earlier one, or the timer of one, is stale."""
        self._timer: simpy.Event | None = None
        self._sets = _LinkSets()
        self._shapes: dict[tuple[Piece, ...], _Shape] = {}
        self._plans: dict[int, tuple[tuple, _Shape | None, float]] = {}
        self._states: dict[tuple, _State] = {}
        self._kept = 0
        self.state = self._intern((), 0)

    def transfer(self, loads: tuple[tuple[Link, float], ...]) -> simpy.Event:
        """Start a transfer; the event fires when every link has carried its bytes."""
        done = self.env.event()
        hit = self._plans.get(id(loads))
        if hit is None or hit[0] is not loads:
            hit = self._plans[id(loads)] = (loads, *self._shape(self._split(loads)))
        _, shape, alone_s = hit
        if shape is None:
            done.succeed()
            return done
        self._advance()
        self.active.append(_Transfer(done, alone_s))
        state = self.state
        after = state.joins.get(shape)
        if after is None:
            after = state.joins[shape] = self._joined(state, shape)
        self.state = after
        self._reschedule()
        return done

    def _split(self, loads: tuple[tuple[Link, float], ...]) -> tuple[Piece, ...]:
        """Group a transfer's links by (bytes, capacity)."""
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
        return tuple(pieces)

    def _shape(self, pieces: tuple[Piece, ...]) -> tuple[_Shape | None, float]:
        """The shape of a transfer of ``pieces`` and its time alone (None: nothing to move)."""
        if not pieces:
            return None, 0.0
        alone_s = max(b / cap for _, b, cap in pieces)
        value = tuple((links, b / cap / alone_s, cap) for links, b, cap in pieces)
        shape = self._shapes.get(value)
        if shape is None:
            shape = self._shapes[value] = _Shape(value)
        return shape, alone_s

    # --- states ----------------------------------------------------------------------------
    def _intern(self, regions: tuple[Region, ...], size: int) -> _State:
        key = (size, tuple((id(links), cap, members) for links, cap, members in regions))
        state = self._states.get(key)
        if state is None:
            weight = sum(len(members) for _, _, members in regions)
            if self._kept + weight > _STATE_BUDGET:
                self._forget()
            self._kept += weight
            state = self._states[key] = _State(regions, size)
        return state

    def _forget(self) -> None:
        """Drop every interned state and transition (which the states' cycles would otherwise
        keep while the cycle collector is paused): they are found again when met."""
        for state in self._states.values():
            state.joins.clear()
            state.leaves.clear()
        self._states.clear()
        self._kept = 0

    def _joined(self, state: _State, shape: _Shape) -> _State:
        """``state`` with a transfer of ``shape`` started: regions it crosses are cut."""
        slot = state.size
        left = [[links, b, cap] for links, b, cap in shape.pieces]
        out: list[Region] = []
        cut = self._sets.cut
        for links, capacity, members in state.regions:
            rest = links
            for piece in left:
                if piece[2] != capacity or not piece[0]:
                    continue
                shared, rest, piece[0] = cut(rest, piece[0])
                if shared:
                    out.append((shared, capacity, members + ((slot, piece[1]),)))
                    if not rest:
                        break
            if rest:
                out.append((rest, capacity, members))
        out += [(links, cap, ((slot, b),)) for links, b, cap in left if links]
        return self._intern(tuple(out), slot + 1)

    def _left(self, state: _State, slot: int) -> _State:
        """``state`` with the transfer in ``slot`` ended: regions left alike are merged, and
        the later slots move down by one."""
        merged: dict[tuple, frozenset[Link]] = {}
        union = self._sets.union
        for links, capacity, members in state.regions:
            kept = tuple((s - (s > slot), b) for s, b in members if s != slot)
            if kept:
                key = (capacity, kept)
                before = merged.get(key)
                merged[key] = links if before is None else union(before, links)
        return self._intern(tuple((links, cap, members)
                                  for (cap, members), links in merged.items()), state.size - 1)

    # --- rates ---------------------------------------------------------------------------
    def _advance(self) -> None:
        """Move every transfer forward to now at its current rate."""
        now = self.env.now
        elapsed = now - self.last_update
        if elapsed > 0:
            for t in self.active:
                t.remaining -= t.rate * elapsed
        self.last_update = now

    def _reschedule(self) -> None:
        """Rates from the state's levels, and a timer for the next completion."""
        active = self.active
        if not active:
            self._arming = self._timer = None
            return
        state = self.state
        levels = state.levels
        if levels is None:
            levels = state.levels = _levels(state.regions, state.size)
        wait = None
        for t, level in zip(active, levels):
            t.rate = rate = 0.0 if level is None else level / t.alone_s
            if rate > 0:
                w = t.remaining / rate
                if wait is None or w < wait:
                    wait = w
        if wait is None:
            raise RuntimeError("flow network: no transfer in flight can move")
        self._timer = None
        self._arm_timer(max(wait, 0.0))

    def _arm_timer(self, wait: float) -> None:
        """Time the next completion, ``wait`` from now: a timeout whose place among same-time
        events is the one a new process's first step would give it."""
        self._arming = _Arm(self.env, self._arm, wait)

    def _arm(self, arm: _Arm) -> None:
        if arm is self._arming:
            self._timer = timer = Timeout(self.env, arm.wait)
            timer.callbacks.append(self._fire)

    def _fire(self, timer: simpy.Event) -> None:
        if timer is not self._timer:
            return
        self._advance()
        now = self.env.now
        # Done: nothing left, or so little that finishing it would not move the clock (the
        # leftover of floating-point rounding).
        finished = [k for k, t in enumerate(self.active)
                    if t.remaining <= 1e-9 or (t.rate > 0 and now + t.remaining / t.rate <= now)]
        state = self.state
        for gone, k in enumerate(finished):
            slot = k - gone
            t = self.active.pop(slot)
            after = state.leaves.get(slot)
            if after is None:
                after = state.leaves[slot] = self._left(state, slot)
            state = after
            t.done.succeed()
        self.state = state
        self._reschedule()


def _levels(regions: tuple[Region, ...], size: int) -> tuple[float | None, ...]:
    """Each slot's level by progressive filling over ``regions`` (None: never limited)."""
    residual = [1.0] * len(regions)  # fraction of each region's capacity left
    levels: list[float | None] = [None] * size
    unfrozen = set(range(size))
    level = 0.0
    while unfrozen:
        best, bottlenecks, demands = None, [], []
        for i, (_, _, members) in enumerate(regions):
            demand = sum(b for s, b in members if s in unfrozen)
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
            for s, _ in regions[i][2]:
                if s in unfrozen:
                    levels[s] = level
                    unfrozen.discard(s)
    return tuple(levels)

"""Flow-level network: transfers in flight share link bandwidth max-min fairly.

Each transfer carries, per link, the bytes it must push through that link; all its links
advance together (a collective finishes when its slowest part does), so a transfer's state is
one progress fraction and its rate is in fractions per second. Rates follow progressive filling
(Bertsekas & Gallager, Data Networks, sec. 6.5.2): raise every unfrozen transfer's rate together
until a link saturates, freeze the transfers crossing it, repeat. Rates are recomputed whenever
a transfer starts or ends; between those instants they are constant, so the next completion is
known exactly and one timer is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from hardware_specs.topology import Link

_EPS = 1e-12


@dataclass(eq=False)
class _Transfer:
    loads: dict[Link, float]
    done: simpy.Event
    remaining: float = 1.0
    rate: float = 0.0
    links: tuple[Link, ...] = field(default=())


class FlowNetwork:
    def __init__(self, env: simpy.Environment, capacity: Callable[[Link], float]):
        self.env = env
        self.capacity = capacity
        self.active: list[_Transfer] = []
        self.last_update = 0.0
        self.generation = 0
        self.recomputes = 0

    def transfer(self, loads: tuple[tuple[Link, float], ...]) -> simpy.Event:
        """Start a transfer; the event fires when every link has carried its bytes."""
        done = self.env.event()
        useful = {link: b for link, b in loads if b > 0}
        if not useful:
            done.succeed()
            return done
        self._advance()
        self.active.append(_Transfer(useful, done, links=tuple(useful)))
        self._reschedule()
        return done

    def _advance(self) -> None:
        """Move every transfer forward to now at its current rate."""
        now = self.env.now
        elapsed = now - self.last_update
        if elapsed > 0:
            for t in self.active:
                t.remaining -= t.rate * elapsed
        self.last_update = now

    def _rates(self) -> None:
        self.recomputes += 1
        residual: dict[Link, float] = {}
        users: dict[Link, list[_Transfer]] = {}
        for t in self.active:
            t.rate = 0.0
            for link in t.links:
                if link not in residual:
                    residual[link] = self.capacity(link)
                    users[link] = []
                users[link].append(t)
        unfrozen = set(self.active)
        level = 0.0
        while unfrozen:
            best, bottlenecks = None, []
            for link, ts in users.items():
                demand = sum(t.loads[link] for t in ts if t in unfrozen)
                if demand <= 0:
                    continue
                step = residual[link] / demand
                if best is None or step < best - _EPS:
                    best, bottlenecks = step, [link]
                elif abs(step - best) <= _EPS:
                    bottlenecks.append(link)
            if best is None:
                break
            level += best
            for link, ts in users.items():
                residual[link] -= best * sum(t.loads[link] for t in ts if t in unfrozen)
            for link in bottlenecks:
                for t in users[link]:
                    if t in unfrozen:
                        t.rate = level
                        unfrozen.discard(t)

    def _reschedule(self) -> None:
        self._rates()
        self.generation += 1
        if not self.active:
            return
        wait = min(t.remaining / t.rate for t in self.active if t.rate > 0)
        self.env.process(self._timer(self.generation, max(wait, 0.0)))

    def _timer(self, generation: int, wait: float):
        yield self.env.timeout(wait)
        if generation != self.generation:
            return
        self._advance()
        finished = [t for t in self.active if t.remaining <= 1e-9]
        self.active = [t for t in self.active if t.remaining > 1e-9]
        for t in finished:
            t.done.succeed()
        self._reschedule()

"""The nodes under a long-running job: when each fails, and where replacements come from.

Every (node, cause) pair has a clock drawn from that cause's hazard; a node that leaves for
repair is replaced by a spare (or, with none left, by the first node back from repair), which
starts with fresh clocks: for a Weibull hazard with shape < 1, new parts fail early. A slot
whose replacement has not arrived yet cannot fail.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from clustersim.hardware_specs.failures import Hazard
from clustersim.simulator.longrun.checkpointing import CheckpointPolicy
from clustersim.simulator.longrun.lifetimes import lifetimes
from clustersim.simulator.longrun.plan import RunPlan


class Fleet:
    __slots__ = ("plan", "rng", "rng_repair", "times", "means", "memoryless", "pool",
                 "slot_back", "installed")

    def __init__(self, plan: RunPlan, rng: np.random.Generator, rng_repair: np.random.Generator):
        self.plan, self.rng, self.rng_repair = plan, rng, rng_repair
        clocks, n = plan.clocks, plan.nodes
        self.times = np.empty((n, len(clocks)))
        for c, clock in enumerate(clocks):
            self.times[:, c] = lifetimes(rng, clock.rate_per_node_s, clock.hazard, n)
        self.memoryless = all(k.hazard.hazard is Hazard.EXPONENTIAL for k in clocks)
        self.means = np.array([1.0 / k.rate_per_node_s if k.rate_per_node_s > 0 else np.inf
                               for k in clocks])
        self.pool = [0.0] * plan.recovery.spare_nodes
        """When each spare is (or will be) available: a heap."""
        self.slot_back = np.zeros(n)
        """When each slot has a node again."""
        self.installed = np.zeros(n)
        """When each slot's current node arrived."""

    def next_failure(self) -> tuple[float, int, int] | None:
        """(time, node, cause index) of the next failure; None if nothing can fail."""
        if not self.times.size:
            return None
        node, c = divmod(int(self.times.argmin()), self.times.shape[1])
        t = float(self.times[node, c])
        return (t, node, c) if math.isfinite(t) else None

    def strike(self, t: float, node: int, c: int) -> tuple[int, ...]:
        """The nodes a failure of cause ``c`` on ``node`` at ``t`` takes down (its whole domain
        when correlated), among those present; the cause's clock on ``node`` restarts."""
        clock = self.plan.clocks[c]
        self.times[node, c] = t + lifetimes(self.rng, clock.rate_per_node_s, clock.hazard, 1)[0]
        nodes = (node,)
        if clock.domain_nodes > 1 and self.rng.random() < clock.correlated_probability:
            first = node - node % clock.domain_nodes
            nodes = tuple(range(first, min(first + clock.domain_nodes, self.plan.nodes)))
        return tuple(n for n in nodes if self.slot_back[n] <= t)

    def replace(self, nodes: tuple[int, ...], now: float, earliest: float) -> dict[int, float]:
        """Send ``nodes`` to repair and bring in replacements no earlier than ``earliest``;
        returns when each slot has its node back."""
        rec = self.plan.recovery
        ready = {}
        for n in nodes:
            heapq.heappush(self.pool, now + self.rng_repair.exponential(rec.repair_time_s))
            ready[n] = max(earliest, heapq.heappop(self.pool)) + rec.provision_s()
            self.slot_back[n] = self.installed[n] = ready[n]
            if self.memoryless:
                fresh = self.rng.standard_exponential(len(self.means)) * self.means
            else:
                fresh = np.array([lifetimes(self.rng, k.rate_per_node_s, k.hazard, 1)[0]
                                  for k in self.plan.clocks])
            self.times[n, :] = ready[n] + fresh
        return ready

    def copies_survive(self, replaced: tuple[int, ...], since: float) -> bool:
        """In-memory checkpoints: each replaced node's state lives on a peer (``peer_offset``
        apart) that is not itself lost and was already there when the copy was made. REFT: no
        sharding group misses more nodes than its parity rebuilds (a node installed after the
        snapshot holds none of it)."""
        plan = self.plan
        lost = set(replaced)
        if plan.checkpoint.policy is CheckpointPolicy.REFT:
            return all(sum(1 for n in group if n in lost or self.installed[n] > since)
                       <= min(plan.tolerated_failures, len(group) - 1)
                       for group in plan.sharding_groups)
        for n in replaced:
            peers = ((n + j * plan.peer_offset) % plan.nodes
                     for j in range(1, plan.peer_replicas + 1))
            if not any(p not in lost and self.installed[p] <= since for p in peers):
                return False
        return True

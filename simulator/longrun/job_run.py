"""One long-horizon run of a training job under failures: SimPy processes, the step as the unit.

Processes: failures of the job's nodes (``fleet``); straggler and degraded-link
sources; a horizon marker; and the job, which trains at a rate (healthy steps per second) set by
the engine's step times, checkpoints periodically (in closed form, see ``cycle``), and
on each failure rolls back, waits and restarts as its recovery policy says. Every other process
tells the job what happened by interrupting it.

Accounting: at any time the wall clock splits into training kept (useful), training rolled back
(lost), checkpoint pauses, downtime, and the extra time slow steps took (slowdown). ETTR is
useful / wall (Kokolis et al. 2024, "Effective Training Time Ratio").

Randomness: one generator per run, spawned into independent streams for failures, repairs,
stragglers and links, so two policies run with the same seed meet the same failures.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import replace
from functools import partial

import numpy as np
import simpy

from clustersim.simulator.longrun.lifetimes import draw
from clustersim.simulator.longrun.cycle import Cycle, Level
from clustersim.simulator.longrun.fleet import Fleet
from clustersim.simulator.longrun.plan import (
    CauseClock, DegradationPlan, Event, RunPlan, RunResult, Segment,
)
from clustersim.simulator.longrun.recovery import RecoveryKind

MAX_HORIZONS = 50
"""A run that has not trained its budget after this many horizons stops (time_to_train = inf)."""


class State(enum.Enum):
    TRAIN = "train"
    SAVE = "save"
    DOWN = "down"


class _Account:
    __slots__ = ("train", "pause", "down", "lost", "interruptions", "planned", "by_cause")

    def __init__(self):
        self.train = self.pause = self.down = self.lost = 0.0
        self.interruptions = self.planned = 0
        self.by_cause: dict[str, int] = {}


class JobRun:
    """The job and its environment for one run; :meth:`result` runs it."""

    def __init__(self, plan: RunPlan, rng: np.random.Generator, index: int = 0,
                 record: bool = False):
        self.plan, self.index, self.record = plan, index, record
        self.rng_fail, self.rng_repair, self.rng_strag, self.rng_link = rng.spawn(4)
        self.env = env = simpy.Environment()
        self.step_s = plan.step_time_s
        levels = plan.checkpoint.levels
        pause = plan.checkpoint.blocking_s + max(0.0, levels[0].background_s - plan.interval_s)
        self.period = plan.interval_s + pause
        self.pause = pause
        # A durable copy written in the background must finish before the next one starts.
        durable = levels[-1]
        levels = levels[:-1] + (replace(durable, every=max(
            durable.every, math.ceil(durable.background_s / self.period))),)
        self.levels = [Level(lv) for lv in levels]
        self.cycle = Cycle(0.0, plan.interval_s, pause)
        self.state = State.TRAIN
        self.work = 0.0
        self.settled_at = 0.0
        self.phases: list[tuple[State, float]] = []
        self.phase_end = 0.0
        self.resume_points: list[tuple[float, float]] | None = None
        """Per level, the (work, usable since) training resumes from (None: keep the levels)."""
        self.ready_at = 0.0
        self.down_replicas: dict[int, float] = {}
        self.slow: dict[int, float] = {}
        self.ids = itertools.count()
        self.fleet = Fleet(plan, self.rng_fail, self.rng_repair)
        self.acc = _Account()
        self.window: dict | None = None
        self.events: list[Event] = []
        self.segments: list[list] = []
        self.finished = False
        self.finish_s = math.inf
        self.rate = self._rate()
        self.done = env.event()
        self.proc = env.process(self._job())
        env.process(self._failures())
        for dplan, rng, kind in ((plan.stragglers, self.rng_strag, "straggler"),
                                 (plan.links, self.rng_link, "link")):
            if dplan is not None and dplan.rate_per_node_s > 0:
                env.process(self._degradations(dplan, rng, kind))
        env.process(self._horizon())

    # --- running ------------------------------------------------------------------------------
    def result(self) -> RunResult:
        cap = self.env.timeout(MAX_HORIZONS * max(self.plan.horizon_s, 1.0))
        self.env.run(until=self.env.any_of([self.done, cap]))
        if self.window is None:
            self._settle()
            self._take_window()
        w = self.window
        return RunResult(
            index=self.index, wall_s=w["wall"], useful_s=w["work"] * self.step_s,
            lost_s=w["lost"] * self.step_s, checkpoint_s=w["pause"], down_s=w["down"],
            slowdown_s=w["train"] - (w["work"] + w["lost"]) * self.step_s,
            interruptions=w["interruptions"], planned=w["planned"], by_cause=w["by_cause"],
            time_to_train_s=self.finish_s, events=tuple(self.events),
            timeline=tuple(Segment(*s) for s in self.segments))

    def _job(self):
        while True:
            try:
                if self.state is State.TRAIN:
                    yield self.env.timeout(max(self._budget_time() - self.env.now, 0.0))
                    self._settle()
                    self._finish()
                    return
                yield self.env.timeout(max(self.phase_end - self.env.now, 0.0))
                self._settle()
                if self.state is State.SAVE:
                    self._saved()
                self._next_phase()
            except simpy.Interrupt as interrupt:
                self._settle()
                interrupt.cause()

    def _notify(self, handler) -> None:
        if not self.finished:
            self.proc.interrupt(handler)

    def _horizon(self):
        yield self.env.timeout(self.plan.horizon_s)
        if not self.finished:
            self._settle()
            self._take_window()
            if not math.isfinite(self.plan.budget_steps):
                self.finished = True
                self.done.succeed()

    def _finish(self) -> None:
        self.finished = True
        self.finish_s = self.env.now
        if self.window is None:
            self._take_window()
        self.done.succeed()

    def _take_window(self) -> None:
        a = self.acc
        self.window = {"wall": self.env.now, "work": self.work, "lost": a.lost, "train": a.train,
                       "pause": a.pause, "down": a.down, "interruptions": a.interruptions,
                       "planned": a.planned, "by_cause": dict(a.by_cause)}

    # --- accounting -----------------------------------------------------------------------------
    def _rate(self) -> float:
        """Healthy steps per second now."""
        plan = self.plan
        live = plan.dp - len(self.down_replicas)
        efficiency = 1.0
        if live < plan.dp and plan.replicas_step is not None:
            efficiency = live / plan.dp * self.step_s / plan.replicas_step.at(live)
        return efficiency / max(self.slow.values(), default=1.0) / self.step_s

    def _budget_time(self) -> float:
        c, now = self.cycle, self.env.now
        work_now = self.work + self.rate * (c.train_time(now) - c.train_time(self.settled_at))
        left = max(self.plan.budget_steps - work_now, 0.0)
        if not math.isfinite(left):
            return math.inf
        return c.time_at_train(c.train_time(now) + left / self.rate)

    def _settle(self) -> None:
        """Book the time since the last settle to its bucket (and training to work)."""
        now, then = self.env.now, self.settled_at
        dt = now - then
        if dt <= 0:
            return
        speed = 0.0
        if self.state is State.TRAIN:
            c = self.cycle
            trained = c.train_time(now) - c.train_time(then)
            for level in self.levels:
                level.advance(c, then, self.work, self.rate, now)
            self.work += self.rate * trained
            self.acc.train += trained
            self.acc.pause += dt - trained
            speed = self.rate * self.step_s
        elif self.state is State.SAVE:
            self.acc.pause += dt
        else:
            self.acc.down += dt
        self.settled_at = now
        if self.record:
            last = self.segments[-1] if self.segments else None
            if last and last[2] == self.state.value and last[3] == speed and last[1] == then:
                last[1] = now
            else:
                self.segments.append([then, now, self.state.value, speed])

    # --- phases ---------------------------------------------------------------------------------
    def _stop(self, phases: list[tuple[State, float]]) -> float:
        """Leave training (or replan a stop under way) for ``phases``; returns their length."""
        self.phases = list(phases)
        self._next_phase()
        return sum(d for _, d in phases)

    def _saved(self) -> None:
        """A planned save completed: the current work is durable."""
        point = (self.work, self.env.now)
        for level in self.levels:
            level.new_cycle(point)
        self.resume_points = [point] * len(self.levels)

    def _next_phase(self) -> None:
        if self.phases:
            self.state, duration = self.phases.pop(0)
            self.phase_end = self.env.now + duration
            return
        now = self.env.now
        for r in [r for r, ready in self.down_replicas.items() if ready <= now]:
            del self.down_replicas[r]
        self.state = State.TRAIN
        self.cycle = Cycle(now, self.plan.interval_s, self.pause)
        points = self.resume_points
        for i, level in enumerate(self.levels):
            level.new_cycle(None if points is None else points[i])
        self.resume_points = None
        self.ready_at = 0.0
        self.rate = self._rate()

    def _rollback(self, replaced: tuple[int, ...]) -> tuple[float, float]:
        """Back to the newest restore point that survived; (lost work, its load time)."""
        now = self.env.now
        best = (-math.inf, 0.0)
        points = []
        for level in self.levels:
            work, usable = level.restore(now)
            points.append((work, usable))
            if not level.spec.durable and not self.fleet.copies_survive(replaced, usable):
                continue
            if work > best[0]:
                best = (work, level.spec.load_s)
        lost = max(self.work - best[0], 0.0)
        self.work = min(self.work, best[0])
        self.acc.lost += lost
        # After the restart each level still holds its own newest copy, none newer than this.
        self.resume_points = [(min(w, self.work), usable) for w, usable in points]
        return lost, best[1]

    # --- events -------------------------------------------------------------------------------
    def _failures(self):
        fleet, rec = self.fleet, self.plan.recovery
        while (upcoming := fleet.next_failure()) is not None:
            t, node, c = upcoming
            yield self.env.timeout(t - self.env.now)
            if self.finished:
                return
            clock = self.plan.clocks[c]
            nodes = fleet.strike(t, node, c)
            if not nodes:
                continue
            ready = (fleet.replace(nodes, t, t + rec.detection_s + rec.drain_s)
                     if clock.cause.replaces_node else {})
            self._notify(partial(self._on_failure, clock, nodes, ready))

    def _degradations(self, dplan: DegradationPlan, rng: np.random.Generator, kind: str):
        rate = dplan.rate_per_node_s * self.plan.nodes
        while True:
            yield self.env.timeout(rng.exponential(1.0 / rate))
            node = int(rng.integers(self.plan.nodes))
            factor = draw(rng, dplan.slowdown)
            duration = draw(rng, dplan.duration)
            if self.finished:
                return
            key = next(self.ids)
            multiplier = max(dplan.step.at(factor) / self.step_s, 1.0)
            self._log(kind, f"x{factor:.2f} for {duration / 3600:.2f} h",
                      f"{'gpu' if kind == 'straggler' else 'link'} of node {node}", 0.0, 0.0)
            self._notify(partial(self._set_slow, key, multiplier))
            evict = self.plan.recovery.evict_slow_after_s
            if 0 < evict < duration:
                self.env.process(self._end_slow(key, evict, partial(self._evict, key, node)))
            else:
                self.env.process(self._end_slow(key, duration, partial(self._set_slow, key, None)))

    def _end_slow(self, key: int, after: float, handler):
        yield self.env.timeout(after)
        self._notify(handler)

    def _evict(self, key: int, node: int) -> None:
        """A slowdown outlived the policy's patience: save, swap the node out, restart."""
        self.slow.pop(key, None)
        if self.state is not State.TRAIN:
            return
        rec, now = self.plan.recovery, self.env.now
        save = self.plan.checkpoint.planned_save_s
        ready = self.fleet.replace((node,), now, now + save + rec.drain_s)[node]
        down = ready - (now + save) + rec.restart_s(self.levels[-1].spec.load_s)
        self._log("evict", "slow node", f"node {node}",
                  self._stop([(State.SAVE, save), (State.DOWN, down)]), 0.0)

    def _set_slow(self, key: int, multiplier: float | None) -> None:
        if multiplier is None:
            self.slow.pop(key, None)
        else:
            self.slow[key] = multiplier
        if self.state is State.TRAIN:
            self.rate = self._rate()

    def _log(self, kind: str, cause: str, component: str, downtime: float, lost: float) -> None:
        self.events.append(Event(self.env.now, kind, cause, component, downtime,
                                 lost * self.step_s))

    def _count(self, clock: CauseClock) -> None:
        if self.window is not None:
            return
        a = self.acc
        if clock.cause.planned:
            a.planned += 1
        else:
            a.interruptions += 1
        a.by_cause[clock.cause.value] = a.by_cause.get(clock.cause.value, 0) + 1

    def _on_failure(self, clock: CauseClock, nodes: tuple[int, ...],
                    ready: dict[int, float]) -> None:
        self._count(clock)
        component = (f"node {nodes[0]}" if len(nodes) == 1
                     else f"nodes {nodes[0]}-{nodes[-1]} ({len(nodes)}, correlated)")
        if clock.cause.planned:
            if self.state is State.TRAIN:
                self._log("planned", clock.cause.value, component, self._planned_restart(), 0.0)
            return
        kind = self.plan.recovery.kind
        if kind in (RecoveryKind.ELASTIC, RecoveryKind.REPLICA_FT):
            handled = self._shrink(clock, nodes, ready, component)
            if handled:
                return
        lost, load = self._rollback(tuple(ready))
        rec = self.plan.recovery
        start = self.env.now + rec.detection_s + rec.drain_s
        self.ready_at = max([self.ready_at, start, *ready.values()])
        downtime = self._stop([(State.DOWN, self.ready_at - self.env.now + rec.restart_s(load))])
        self._log("failure", clock.cause.value, component, downtime, lost)

    def _planned_restart(self) -> float:
        """Save durably, stop, restart: no work lost."""
        rec = self.plan.recovery
        load = self.levels[-1].spec.load_s
        return self._stop([(State.SAVE, self.plan.checkpoint.planned_save_s),
                           (State.DOWN, rec.drain_s + rec.restart_s(load))])

    def _shrink(self, clock: CauseClock, nodes: tuple[int, ...], ready: dict[int, float],
                component: str) -> bool:
        """Elastic and replica_ft: continue without the failed replicas if enough are left."""
        plan, rec, now = self.plan, self.plan.recovery, self.env.now
        ft = rec.kind is RecoveryKind.REPLICA_FT
        if not ready and not ft:
            return False          # elastic: a software fault restarts on the same nodes
        back = {}
        for n in nodes:
            when = ready.get(n, now + rec.detection_s + rec.drain_s)
            if ft:
                when += rec.process_restart_s + plan.rejoin_transfer_s
            for r in plan.replicas_of_node[n]:
                back[r] = max(back.get(r, 0.0), when)
        new = {r: t for r, t in back.items() if r not in self.down_replicas}
        if plan.dp - len(self.down_replicas) - len(new) < rec.min_replicas:
            self.down_replicas.update(new)
            self._wait_for_replicas()
            return False
        self.down_replicas.update(new)
        for when in sorted(set(new.values())):
            self.env.process(self._rejoin_at(when))
        if ft and self.state is State.TRAIN:
            # The step in flight is lost, on average half done; one step is live/dp healthy steps.
            lost = 0.5 * (plan.dp - len(self.down_replicas) + len(new)) / plan.dp
            self.work -= lost
            self.acc.lost += lost
            downtime = self._stop([(State.DOWN, rec.detection_s + rec.drain_s)])
            self._log("failure", clock.cause.value, component, downtime, lost)
            return True
        if ft:
            self._log("failure", clock.cause.value, component, 0.0, 0.0)
            return True
        lost, load = self._rollback(tuple(ready))
        downtime = self._stop([(State.DOWN, rec.detection_s + rec.drain_s + rec.restart_s(load))])
        self._log("failure", clock.cause.value, component, downtime, lost)
        return True

    def _wait_for_replicas(self) -> None:
        """Too few replicas left: the restart waits until enough are back."""
        plan = self.plan
        need = plan.recovery.min_replicas - (plan.dp - len(self.down_replicas))
        times = sorted(self.down_replicas.values())
        if need > 0:
            self.ready_at = max(self.ready_at, times[min(need, len(times)) - 1])

    def _rejoin_at(self, when: float):
        yield self.env.timeout(max(when - self.env.now, 0.0))
        self._notify(self._on_rejoin)

    def _on_rejoin(self) -> None:
        now = self.env.now
        back = [r for r, t in self.down_replicas.items() if t <= now]
        if not back or self.state is not State.TRAIN:
            return
        if self.plan.recovery.kind is RecoveryKind.REPLICA_FT:
            for r in back:
                del self.down_replicas[r]
            self.rate = self._rate()
            self._log("rejoin", "replica", f"{len(back)} replica(s)", 0.0, 0.0)
            return
        self._log("rejoin", "replica", f"{len(back)} replica(s)", self._planned_restart(), 0.0)

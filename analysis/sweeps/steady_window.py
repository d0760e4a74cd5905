"""A step of many micro-batches from one shorter step whose pipeline state repeats.

A pair of shorter steps one period apart (``steady_state``) replays the pipeline's warm-up and
settling twice. A pipeline that settles late (GPT-3 175B, TP16 x PP64 1F1B on A100: each stage
about 6.5 micro-batches after the one before, so hundreds of micro-batches) then costs more than
the step itself. One step is enough when its own records show the state repeating.

A step of ``m1`` micro-batches and one of ``m1 + p`` run the same ops until the shorter one
leaves its steady state (each program's ops are the same up to an index, ``Divergence``), so
the two replays are the same until the first of those ops could start, at ``parted_s``. If, in
every rank class, every op that ends or runs in the period before ``parted_s`` ends (and was
ready) exactly one period's growth ``g`` after the same op a period before, the state at
``parted_s`` is the state one period earlier, shifted by ``g`` and by one period of ops: every
transfer in flight started inside the window, so its progress repeats too. From ``parted_s`` on,
the longer step then runs what the shorter one ran from ``parted_s - g``, ``g`` later: every
class finishes ``g`` later, and the critical class's breakdown grows by what its compute ops
ending in ``(parted_s - g, parted_s]`` added (``attribution.breakdown`` up to a time). The
same holds for every further period, so a step ``k`` periods longer adds ``k`` times that.

The repeats are compared to a tolerance that a drift of that size over ``k`` periods keeps
under ``steady_state.TOLERANCE_S``; tests compare the result with full replays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from clustersim.simulator import Breakdown, Replay
from clustersim.simulator.attribution import breakdown
from clustersim.simulator.summary import critical_position
from clustersim.workloads.trace import Op

from clustersim.analysis.sweeps.critical_summary import CriticalSummary

WINDOW_PERIODS = 2
"""Periods before the step parts from a longer one whose ops are compared: the ends of the
last one with those of the one before (a layer's op, in flight at the parting point, runs
for a small part of a period, so it started in the window)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Divergence:
    """Where a step of ``micro`` micro-batches and one a period longer part, per program."""

    parts_at: tuple[int, ...]
    """The first op index whose op differs between the two steps."""
    lag: tuple[int, ...]
    """Ops the longer step has more (one period's ops)."""


def divergence(programs_of: Callable[[int], list[tuple[Op, ...]]], micro: int, period: int,
               least: int) -> Divergence | None:
    """Where steps of ``micro`` and ``micro + period`` micro-batches part, from three short
    steps of the same schedule shape (``least``: the fewest micro-batches that have it, in
    ``micro``'s residue; ``programs_of``: each program's ops with that many micro-batches):
    each period moves the parting point by one period's ops. None when the short steps do
    not show that."""
    counts = (least, least + period, least + 2 * period)
    if counts[-1] > micro:
        return None
    programs = [programs_of(m) for m in counts]
    first = [_common_prefix(a, b) for a, b in zip(programs[0], programs[1], strict=True)]
    second = [_common_prefix(a, b) for a, b in zip(programs[1], programs[2], strict=True)]
    lag = tuple(len(b) - len(a) for a, b in zip(programs[0], programs[1], strict=True))
    lag2 = tuple(len(b) - len(a) for a, b in zip(programs[1], programs[2], strict=True))
    if lag != lag2 or any(s != f + n for f, s, n in zip(first, second, lag)) or min(lag) <= 0:
        return None
    rounds = (micro - least) // period
    return Divergence(parts_at=tuple(f + rounds * n for f, n in zip(first, lag)), lag=lag)


def _common_prefix(a: tuple[Op, ...], b: tuple[Op, ...]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass(frozen=True, kw_only=True, slots=True)
class Repeat:
    """One period of a step's steady state, found in its records."""

    growth_s: float
    """How much later every op of a period ends than the same op a period before."""
    parted_s: float
    """When the step parts from a longer one: the window of repeats ends here."""


def repeat_before_parting(replay: Replay, div: Divergence, recvs: Sequence[np.ndarray],
                          tolerance: float) -> tuple[Repeat | None, int]:
    """The period that repeats in every class before ``replay`` parts from a longer step (None
    when some op in the window does not repeat, to within ``tolerance`` seconds, the same
    time after the same op a period before; see the module docstring), and how many classes
    repeat a period of their own there. ``recvs``: for each program, which of its ops are
    receives (posted at the start of the step; one still open at the parting point holds no
    state of its own: its transfer is its send's, in the peer's window)."""
    classes = []
    for tl in replay.timelines:
        prog = tl.rank_class.program
        at, lag = div.parts_at[prog], div.lag[prog]
        end = np.asarray(tl.end_s)
        if at > len(end) or at < (WINDOW_PERIODS + 1) * lag:
            return None, 0
        classes.append((end, np.asarray(tl.ready_s), recvs[prog], at, lag))
    parted = min(float(end[at - lag:at].min()) for end, _, _, at, lag in classes)
    end, _, _, at, lag = classes[0]
    growth = float(np.median(end[at - lag:at] - end[at - 2 * lag:at - lag]))
    if not growth > 0:
        return None, 0
    since = parted - (WINDOW_PERIODS - 1) * growth
    own = []
    for end, ready, recv, at, lag in classes:
        window = np.flatnonzero((end > since) & (ready < parted) & ~(recv & (end > parted)))
        if not len(window) or window[0] < lag or window[-1] >= at:
            own.append(None)
            continue
        ends = end[window] - end[window - lag]
        started = window[~recv[window]]
        readies = ready[started] - ready[started - lag]
        mine = float(np.median(ends))
        repeats = (np.all(np.abs(ends - mine) <= tolerance)
                   and np.all(np.abs(readies - mine) <= tolerance))
        own.append(mine if repeats else None)
    repeating = sum(g is not None for g in own)
    if repeating < len(own) or any(abs(g - growth) > tolerance for g in own):
        return None, repeating
    return Repeat(growth_s=growth, parted_s=parted), repeating


def extended(summary: CriticalSummary, replay: Replay, critical_ops: tuple[Op, ...],
             repeat: Repeat, periods: int) -> tuple[CriticalSummary, float] | None:
    """``summary`` of a step ``periods`` periods longer (see the module docstring), with its
    step time; None when another class would finish last."""
    finish = [f + periods * repeat.growth_s for f in summary.finish_s]
    critical = critical_position(finish, [c[0] for c in summary.classes])
    if summary.classes[critical][0] != summary.critical_class:
        return None
    timeline = next(tl for tl in replay.timelines
                    if tl.rank_class.index == summary.critical_class)
    before = breakdown(critical_ops, timeline, until_s=repeat.parted_s - repeat.growth_s)
    after = breakdown(critical_ops, timeline, until_s=repeat.parted_s)
    total = summary.breakdown
    grown = Breakdown(
        compute_s=total.compute_s + periods * (after.compute_s - before.compute_s),
        exposed_comm_s={a: v + periods * (after.exposed_comm_s[a] - before.exposed_comm_s[a])
                        for a, v in total.exposed_comm_s.items()},
        bubble_s=total.bubble_s + periods * (after.bubble_s - before.bubble_s),
        optimizer_s=total.optimizer_s + periods * (after.optimizer_s - before.optimizer_s),
        other_s=total.other_s + periods * (after.other_s - before.other_s),
        offload_s=total.offload_s + periods * (after.offload_s - before.offload_s),
        host_s=total.host_s + periods * (after.host_s - before.host_s))
    return replace(summary, finish_s=tuple(finish), breakdown=grown), finish[critical]
